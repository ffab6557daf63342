"""Token shards: a corpus tokenized once into memory-mapped arrays.

Layout of a shard directory::

    meta.json            format, fingerprint of inputs + tokenizer, dtype, tokens per shard
    tokenizer.json       the tokenizer that made the ids
    tokens-00000.bin     token ids (uint16 when the vocabulary fits, else uint32), documents
                         back to back, each followed by the tokenizer's separator token
    docs.bin             int64 offset of each document's end (global token index)
    sources.bin          int32 index of each document's source file in meta.json's ``sources``

Documents are cut as :mod:`sesame.data.corpus` says (WikiText titles, chapter headings, blank lines,
JSON Lines records, compressed or not, Parquet rows), by the rule meta.json's ``boundaries`` records per source; a document with no
tokens is left out. Shards of format 1 (before documents were cut inside files or remembered their
file) are still read: there every document counts as a source file of its own, as then.

Preparation streams: text is read a line (or record) at a time, tokenized in batches (the ``tokenizers``
library spreads a batch over all cores, in a thread so that reading and writing go on meanwhile)
and appended to disk, so peak memory does not grow with the corpus. Re-running on unchanged inputs with the
same tokenizer and the same format (hence the same document rules) reuses the directory; else it is rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, groupby, islice
from pathlib import Path
from typing import NoReturn, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..errors import SesameError
from ..outputs import check_dir, make_dir, publish_dir
from ..tokenizer import TextTokenizer
from ..train.checkpoint import temporary_dir
from .corpus import boundary_rule, fingerprint, is_plain, iter_pieces

FORMAT = "sesame-shards/2"
READABLE = ("sesame-shards/1", FORMAT)  # format 1: no sources.bin, documents were whole files or records
TOKENS_PER_SHARD = 1 << 26
BATCH_PIECES = 2048


def read_meta(path: Path) -> dict | None:
    """A shard directory's meta.json; None when ``path`` holds none or another program's. One that is not JSON
    (a write cut short) is an error: sesame cannot tell whose it is, so it leaves the folder to the user."""
    file = path / "meta.json"
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SesameError(f"{path}: a broken shard directory (meta.json is not JSON); delete it and run "
                          "`sesame prepare` again") from None
    return meta if isinstance(meta, dict) and meta.get("format") in READABLE else None


def is_shard_dir(path: Path) -> bool:
    return read_meta(path) is not None


def _tokenizer_hash(tokenizer: TextTokenizer) -> str:
    return hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()[:16]


class _Writer:
    def __init__(self, out: Path, dtype: np.dtype, sep_id: int):
        self.out, self.dtype, self.sep = out, dtype, np.array([sep_id], dtype=dtype)
        self.shard_sizes: list[int] = []
        self.total = 0
        self.docs = open(out / "docs.bin", "wb")
        self.sources = open(out / "sources.bin", "wb")
        self.fh = None
        self.n_docs, self.doc_start = 0, 0

    def _file(self):
        if self.fh is None or self.shard_sizes[-1] >= TOKENS_PER_SHARD:
            if self.fh:
                self.fh.close()
            self.fh = open(self.out / f"tokens-{len(self.shard_sizes):05d}.bin", "wb")
            self.shard_sizes.append(0)
        return self.fh

    def write(self, ids: np.ndarray) -> None:
        self._file().write(ids.tobytes())
        self.shard_sizes[-1] += len(ids)
        self.total += len(ids)

    def end_document(self, source: int) -> None:
        """Close the document written since the last call (none when it holds no tokens), from file ``source``."""
        if self.total == self.doc_start:
            return
        self.write(self.sep)
        self.docs.write(np.array([self.total], dtype=np.int64).tobytes())
        self.sources.write(np.array([source], dtype=np.int32).tobytes())
        self.n_docs, self.doc_start = self.n_docs + 1, self.total

    def close(self) -> None:
        for fh in (self.fh, self.docs, self.sources):
            if fh:
                fh.close()


def prepare_corpus(files: Sequence[Path], tokenizer: TextTokenizer, out: str | Path, text_field: str = "text",
                   progress: bool = True) -> "Shards":
    """Tokenize ``files`` into shards at ``out``, a new or empty folder; shards already there are reused when
    made of the same inputs with the same tokenizer, and never replaced (a run may be training on them)."""
    out = Path(out)
    key = fingerprint(files, _tokenizer_hash(tokenizer), text_field, FORMAT)
    meta = read_meta(out) if out.is_dir() else None
    broken = False
    if meta is not None and meta.get("fingerprint") == key:
        try:
            return Shards(out)
        except SesameError:
            broken = True  # its own shards, cut short or partly deleted: prepared again below
    if not broken:
        check_dir(out, "--out", fix="shards are never replaced (a run may train on them): choose a new or empty --out")
    make_dir(out.parent, "--out")
    tmp = temporary_dir(out.parent, f".{out.name}.")
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
    writer = _Writer(tmp, dtype, tokenizer.specials.sep)
    # the text's bytes, which the files' sizes are unless a file is compressed (or Parquet): then no total
    total_bytes = sum(f.stat().st_size for f in files) if all(map(is_plain, files)) else None
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    current = None  # (source, document) being written

    def write(pieces: list[tuple[int, int, str]], encodings: list[list[int]]) -> None:
        """Append one tokenized batch: one array per document run, a separator where documents change."""
        nonlocal current
        for doc, group in groupby(zip(pieces, encodings), key=lambda pair: pair[0][:2]):
            if current is not None and doc != current:
                writer.end_document(current[0])
            current = doc
            writer.write(np.fromiter(chain.from_iterable(ids for _, ids in group), dtype))
        bar.update(sum(len(text.encode()) for _, _, text in pieces))

    rules = [boundary_rule(f) for f in files]
    pieces = iter_pieces(files, text_field, rules=rules)
    try:
        # Tokenizing batch k (Rust, all cores, GIL released) overlaps reading k+1 and writing k-1.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = None
            while batch := list(islice(pieces, BATCH_PIECES)):
                job = pool.submit(tokenizer.encode, [text for _, _, text in batch], special=False)
                if pending:
                    write(pending[0], pending[1].result())
                pending = (batch, job)
            if pending:
                write(pending[0], pending[1].result())
        if current is not None:
            writer.end_document(current[0])
        writer.close()
        if writer.total == 0:
            raise SesameError(f"--corpus: the files {[str(f) for f in files][:3]} hold no text")
        meta = {"format": FORMAT, "fingerprint": key, "dtype": dtype.name, "shards": writer.shard_sizes,
                "n_tokens": writer.total, "n_docs": writer.n_docs, "vocab_size": tokenizer.vocab_size,
                "sources": [str(f) for f in files], "boundaries": rules}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        tokenizer.save(tmp / "tokenizer.json")
        if broken:
            shutil.rmtree(out)  # the same inputs and tokenizer: what replaces them is what they were
        publish_dir(tmp, out, "--out")
    finally:
        writer.close()
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return Shards(out)


@dataclass(frozen=True)
class Window:
    shard: int
    start: int


class Shards:
    """Read-only view of a shard directory as memory-mapped arrays."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta = read_meta(self.path)
        if meta is None:
            raise SesameError(f"{self.path}: not a shard directory (no sesame meta.json); run `sesame prepare` first")
        self.meta = meta
        dtype = self._check()
        self.arrays = [
            np.memmap(self.path / f"tokens-{i:05d}.bin", dtype=dtype, mode="r", shape=(n,))
            for i, n in enumerate(self.meta["shards"])
        ]
        self.shard_starts = np.cumsum([0] + self.meta["shards"][:-1])
        self.doc_ends = np.fromfile(self.path / "docs.bin", dtype=np.int64)
        sources = self.path / "sources.bin"
        self.doc_sources = np.fromfile(sources, dtype=np.int32) if sources.is_file() else np.arange(len(self.doc_ends))

    def _check(self) -> np.dtype:
        """The token dtype, once meta.json's fields and every file's size agree (else an error naming the
        folder and the first file at fault): what a copy or a preparation cut short leaves behind."""
        meta = self.meta
        sizes, dtype, n_docs = meta.get("shards"), meta.get("dtype"), meta.get("n_docs")
        well_formed = (dtype in ("uint16", "uint32") and isinstance(sizes, list) and len(sizes) > 0
                       and all(type(n) is int and n > 0 for n in sizes)  # the writer opens a shard to write tokens
                       and type(n_docs) is int and n_docs >= 0 and meta.get("n_tokens") == sum(sizes))
        if not well_formed:
            self._broken("meta.json lacks or garbles dtype, shards, n_tokens or n_docs")
        expected = {f"tokens-{i:05d}.bin": n * np.dtype(dtype).itemsize for i, n in enumerate(sizes)}
        expected["docs.bin"] = n_docs * 8
        if meta["format"] != READABLE[0]:  # format 1 has no sources.bin
            expected["sources.bin"] = n_docs * 4
        for name, size in expected.items():
            found = (self.path / name).stat().st_size if (self.path / name).is_file() else None
            if found != size:
                self._broken(f"{name} is missing" if found is None else f"{name} holds {found} bytes, not {size}")
        return np.dtype(dtype)

    def _broken(self, what: str) -> NoReturn:
        raise SesameError(f"{self.path}: a broken shard directory ({what}); prepare the corpus again (`sesame "
                          "prepare`, or rerun the command that made it)")

    @property
    def n_tokens(self) -> int:
        return self.meta["n_tokens"]

    def token_counts(self, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
        """How often each of the ``vocab_size`` ids occurs in the shards, read ``chunk`` tokens at a time."""
        return sum((np.bincount(a[i: i + chunk], minlength=vocab_size) for a in self.arrays
                    for i in range(0, len(a), chunk)), np.zeros(vocab_size, dtype=np.int64))

    def windows(self, length: int) -> list[Window]:
        """Non-overlapping windows of ``length`` tokens, packed across document boundaries."""
        return [Window(s, k * length) for s, a in enumerate(self.arrays) for k in range(len(a) // length)]

    def documents(self, windows: Sequence[Window], offset: int = 0) -> np.ndarray:
        """Index of the document holding token ``offset`` of each window (its first by default)."""
        starts = np.array([self.shard_starts[w.shard] + w.start + offset for w in windows], dtype=np.int64)
        return np.searchsorted(self.doc_ends, starts, side="right")

    def read(self, window: Window, length: int) -> np.ndarray:
        return np.asarray(self.arrays[window.shard][window.start: window.start + length], dtype=np.int64)
