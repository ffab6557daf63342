"""Corpora as C4, The Pile and FineWeb ship them: JSON Lines compressed with gzip or zstd, and Parquet shards,
read as the plain JSON Lines file they hold (one record, one document) and streamed (sesame/data/corpus.py)."""
import gzip
import json
import sys
from pathlib import Path

import pytest

from sesame.cli import main
from sesame.data.corpus import PARQUET_BATCH_ROWS, iter_texts, records, resolve_sources
from sesame.data.shards import prepare_corpus
from sesame.data.windows import Corpus
from sesame.errors import SesameError
from sesame.tokenizer import train_tokenizer

from .conftest import corpora_or_skip, sentences

SHARD_FILES = ("tokens-00000.bin", "docs.bin", "sources.bin")


def texts(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of a few sentences, with the newlines and blank lines a web page's text has."""
    lines = sentences(4 * n, seed)
    return ["\n".join(lines[i: i + 2]) + "\n\n" + "\n".join(lines[i + 2: i + 4]) for i in range(0, 4 * n, 4)]


def jsonl(docs: list[str], field: str = "text") -> bytes:
    return "".join(json.dumps({"id": i, field: doc}) + "\n" for i, doc in enumerate(docs)).encode()


def write(path: Path, docs: list[str], field: str = "text", row_group: int = 64) -> Path:
    """``docs`` as ``path`` in the format its suffix names, each a record with ``field`` and an ``id``."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": list(range(len(docs))), field: docs}), path, row_group_size=row_group)
    elif suffix == ".zst":
        import zstandard

        path.write_bytes(zstandard.ZstdCompressor().compress(jsonl(docs, field)))
    elif suffix == ".gz":
        path.write_bytes(gzip.compress(jsonl(docs, field)))
    else:
        path.write_bytes(jsonl(docs, field))
    return path


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(300), "wordpiece", vocab_size=200)


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.jsonl.zst", "c.parquet", "C.JSONL.GZ", "c4-train.json.gz"])
def test_each_format_prepares_the_shards_of_its_plain_jsonl(name, tok, tmp_path):
    corpora_or_skip()
    docs = texts(200)
    plain = prepare_corpus([write(tmp_path / "c.jsonl", docs, "body")], tok, tmp_path / "plain", "body",
                           progress=False)
    shards = prepare_corpus(resolve_sources([write(tmp_path / name, docs, "body")]), tok, tmp_path / "other", "body",
                            progress=False)
    for file in SHARD_FILES:
        assert (tmp_path / "other" / file).read_bytes() == (tmp_path / "plain" / file).read_bytes(), file
    assert shards.meta["n_docs"] == plain.meta["n_docs"] == len(docs)
    assert shards.meta["boundaries"] == ["parquet rows" if name.endswith(".parquet") else "jsonl records"]


def test_a_folder_gives_every_format_and_the_tokenizer_reads_them_all(tmp_path):
    corpora_or_skip()
    folder = tmp_path / "web"
    folder.mkdir()
    for i, name in enumerate(("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet", "e.txt")):
        write(folder / name, texts(3, seed=i))
    (folder / "notes.json").write_text("{}")  # neither text nor records: left out (a plain .json is one object)
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"compressed text"))  # only JSON Lines is decompressed
    files = resolve_sources([folder])
    assert [f.name for f in files] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet", "e.txt"]
    read = list(iter_texts(files))
    assert read[:12] == [doc for i in range(4) for doc in texts(3, seed=i)]  # a record's text is one piece
    size = Corpus.of([str(folder / "c.jsonl.zst")], "--corpus").size()
    assert size == {"bytes": sum(len(d.encode()) for d in texts(3, 2)), "chars": sum(map(len, texts(3, 2)))}


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.jsonl.zst"])
def test_compressed_records_stream_and_a_corrupt_tail_is_named(name, tmp_path):
    """The first records arrive before the file's end is read: decompressed as read, never whole."""
    corpora_or_skip()
    path = write(tmp_path / name, texts(3000))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a download cut short
    stream = records(path)
    assert next(stream) == (1, texts(1)[0])
    with pytest.raises(SesameError, match=rf"{name}: not a readable \{Path(name).suffix} file \(.*\); check it"):
        list(stream)


def test_parquet_is_read_a_batch_of_rows_at_a_time(tmp_path):
    """Memory stays flat: Arrow's allocations while reading a file of 16 row groups are those of a file of 4, far
    below the text it holds (iter_batches over the whole file reads row groups ahead, more the more it has)."""
    corpora_or_skip()
    import pyarrow as pa

    held = {}
    for groups in (4, 16):
        docs = texts(groups * PARQUET_BATCH_ROWS)
        path = write(tmp_path / f"{groups}.parquet", docs, row_group=PARQUET_BATCH_ROWS)
        held[groups], read = 0, []
        for row, text in records(path):
            held[groups] = max(held[groups], pa.total_allocated_bytes())
            read.append(text)
        assert read == docs and row == len(docs)
    assert held[16] < 1.25 * held[4] and held[16] < sum(map(len, docs)) / 4


def test_parquet_nulls_and_columns_that_are_not_text_are_named(tmp_path):
    corpora_or_skip()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": [1, 2], "text": ["a", None]}), tmp_path / "c.parquet")
    with pytest.raises(SesameError, match=r"c.parquet: row 2: no string in column 'text'"):
        list(records(tmp_path / "c.parquet"))
    with pytest.raises(SesameError, match=r"c.parquet: column 'n' holds int64, not text; .* --text-field"):
        list(records(tmp_path / "c.parquet", "n"))


@pytest.mark.parametrize("name, module", [("c.jsonl.zst", "zstandard"), ("c.parquet", "pyarrow.parquet")])
def test_a_missing_reader_is_refused_before_anything_is_read(name, module, tmp_path, monkeypatch):
    (tmp_path / name).write_bytes(b"never read")
    monkeypatch.setitem(sys.modules, module, None)  # as where the package is not installed
    with pytest.raises(SesameError, match=rf"{name}: reading it needs the {module.split('.')[0]} package; pip "
                                          r"install 'sesame-nlp\[corpora\]'"):
        resolve_sources([tmp_path])


def test_prepare_and_pretrain_read_a_parquet_corpus(tmp_path, one_thread, capsys):
    corpora_or_skip()
    write(tmp_path / "c.parquet", texts(40), "content")
    q = ["--no-progress"]
    assert main(q + ["pretrain", "--family", "gpt", "--size", "tiny", "--corpus", str(tmp_path / "c.parquet"),
                     "--text-field", "content", "--vocab-size", "120", "--seq-len", "16", "--max-steps", "1",
                     "--batch-size", "4", "--out", str(tmp_path / "run")]) == 0
    assert main(q + ["prepare", "--corpus", str(tmp_path / "c.parquet"), "--text-field", "content", "--tokenizer",
                     str(tmp_path / "run"), "--out", str(tmp_path / "shards")]) == 0
    assert "in 40 documents (1 file by parquet rows)" in capsys.readouterr().out
    assert (tmp_path / "shards" / "tokens-00000.bin").read_bytes() == \
        (tmp_path / "run" / "shards" / "tokens-00000.bin").read_bytes()
