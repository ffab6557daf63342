import json

import numpy as np
import pytest

from sesame.data.corpus import iter_pieces, resolve_sources
from sesame.data.shards import Shards, prepare_corpus
from sesame.errors import SesameError
from sesame.tokenizer import train_tokenizer

from .conftest import sentences


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(300), "wordpiece", vocab_size=200)


def test_documents_are_separated_and_counted(tok, corpus, tmp_path):
    shards = prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "shards", progress=False)
    ends = np.fromfile(tmp_path / "shards" / "docs.bin", dtype=np.int64)
    tokens = np.concatenate(shards.arrays)
    assert len(ends) == 2 == shards.meta["n_docs"] and ends[-1] == len(tokens) == shards.n_tokens
    assert (tokens[ends - 1] == tok.specials.sep).all()  # each document closed by the separator
    assert (tokens == tok.specials.sep).sum() == 2
    first_doc = tok.encode([l + "\n" for l in (corpus / "doc0.txt").read_text().splitlines()], special=False)
    assert tokens[: ends[0] - 1].tolist() == [i for ids in first_doc for i in ids]


def test_rerun_reuses_and_a_change_is_refused_not_rebuilt(tok, corpus, tmp_path):
    """Shards of other inputs are never replaced: a run may be training on them (sesame/outputs.py)."""
    first = prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "s", progress=False)
    stamp = (tmp_path / "s" / "meta.json").stat().st_mtime_ns
    prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "s", progress=False)
    assert (tmp_path / "s" / "meta.json").stat().st_mtime_ns == stamp
    (corpus / "doc1.txt").write_text("A brand new document.\n")
    with pytest.raises(SesameError, match="holds token shards; shards are never replaced"):
        prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "s", progress=False)
    assert (tmp_path / "s" / "meta.json").stat().st_mtime_ns == stamp
    second = prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "t", progress=False)
    assert second.n_tokens < first.n_tokens


def test_jsonl_records_are_documents(tok, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"body": s}) for s in sentences(5)) + "\n")
    assert [(s, d) for s, d, _ in iter_pieces([path], "body")] == [(0, d) for d in range(5)]
    with pytest.raises(SesameError, match=r"c.jsonl:1: no string field 'text'"):
        list(iter_pieces([path]))


def test_invalid_utf8_names_file_and_line(tok, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nalso fine\nbroken \xff\xfe here\n")
    with pytest.raises(SesameError, match=r"bad.txt:3: not valid UTF-8"):
        prepare_corpus([bad], tok, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_windows_cover_the_stream(tok, corpus, tmp_path):
    shards = Shards(prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "s", progress=False).path)
    windows = shards.windows(16)
    assert len(windows) == shards.n_tokens // 16
    joined = np.concatenate([shards.read(w, 16) for w in windows])
    assert joined.tolist() == np.concatenate(shards.arrays)[: len(joined)].tolist()


def test_missing_sources_are_named(tmp_path):
    with pytest.raises(SesameError, match="--corpus .*nope: no such file"):
        resolve_sources([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SesameError, match="holds no .txt"):
        resolve_sources([tmp_path / "empty"])


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "tokens-00000.bin").write_bytes((d / "tokens-00000.bin").read_bytes()[:-6]),
     r"tokens-00000\.bin holds \d+ bytes, not \d+"),
    (lambda d: (d / "tokens-00000.bin").unlink(), r"tokens-00000\.bin is missing"),
    (lambda d: (d / "sources.bin").unlink(), r"sources\.bin is missing"),
    (lambda d: (d / "meta.json").write_text(json.dumps({**json.loads((d / "meta.json").read_text()), "shards": []})),
     r"meta\.json lacks or garbles .*"),
])
def test_a_broken_shard_directory_is_named_and_prepared_again(tok, corpus, tmp_path, damage, message):
    files = resolve_sources([corpus])
    whole = prepare_corpus(files, tok, tmp_path / "s", progress=False).n_tokens
    damage(tmp_path / "s")
    with pytest.raises(SesameError, match=rf"s: a broken shard directory \({message}\); prepare the corpus again"):
        Shards(tmp_path / "s")
    assert prepare_corpus(files, tok, tmp_path / "s", progress=False).n_tokens == whole  # rebuilt, not reused


def test_a_cut_meta_json_is_named_and_left_alone(tok, corpus, tmp_path, capsys):
    from sesame.cli import main

    prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "s", progress=False)
    (tmp_path / "s" / "meta.json").write_text('{"format": "sesame-sha')
    with pytest.raises(SesameError, match=r"s: a broken shard directory \(meta\.json is not JSON\); delete it"):
        prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "s", progress=False)
    assert main(["pretrain", "--corpus", str(tmp_path / "s"), "--out", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    assert "a broken shard directory" in capsys.readouterr().err and not (tmp_path / "run").exists()
    assert (tmp_path / "s" / "meta.json").read_text() == '{"format": "sesame-sha'
