"""Token shards: a corpus tokenized once into memory-mapped arrays.

Layout of a shard directory::

    meta.json            format, fingerprint of inputs + tokenizer, dtype, tokens per shard
    tokenizer.json       the tokenizer that made the ids
    tokens-00000.bin     token ids (uint16 when the vocabulary fits, else uint32), documents
                         back to back, each followed by the tokenizer's separator token
    docs.bin             int64 offset of each document's end (global token index)

Preparation streams: text is read a line at a time, tokenized in batches (the ``tokenizers``
library spreads a batch over all cores, in a thread so that reading and writing go on meanwhile)
and appended to disk, so peak memory does not grow with the corpus. Re-running on unchanged inputs with the same tokenizer reuses the directory.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, groupby, islice
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from ..errors import SesameError
from ..tokenizer import TextTokenizer
from ..train.checkpoint import temporary_dir
from .corpus import fingerprint, iter_pieces

FORMAT = "sesame-shards/1"
TOKENS_PER_SHARD = 1 << 26
BATCH_PIECES = 2048


def is_shard_dir(path: Path) -> bool:
    return (path / "meta.json").is_file() and json.loads((path / "meta.json").read_text()).get("format") == FORMAT


def _tokenizer_hash(tokenizer: TextTokenizer) -> str:
    return hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()[:16]


class _Writer:
    def __init__(self, out: Path, dtype: np.dtype, sep_id: int):
        self.out, self.dtype, self.sep = out, dtype, np.array([sep_id], dtype=dtype)
        self.shard_sizes: list[int] = []
        self.total = 0
        self.docs = open(out / "docs.bin", "wb")
        self.fh = None

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

    def end_document(self) -> None:
        self.write(self.sep)
        self.docs.write(np.array([self.total], dtype=np.int64).tobytes())

    def close(self) -> None:
        for fh in (self.fh, self.docs):
            if fh:
                fh.close()


def prepare_corpus(files: Sequence[Path], tokenizer: TextTokenizer, out: str | Path, text_field: str = "text",
                   progress: bool = True) -> "Shards":
    """Tokenize ``files`` into shards at ``out`` (reused when inputs and tokenizer are unchanged)."""
    out = Path(out)
    key = fingerprint(files, _tokenizer_hash(tokenizer), text_field)
    if out.exists():
        if is_shard_dir(out):
            if json.loads((out / "meta.json").read_text())["fingerprint"] == key:
                return Shards(out)
        elif any(out.iterdir()):
            raise SesameError(f"--out {out}: exists and is not a shard directory; choose an empty or new path")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_dir(out.parent, f".{out.name}.")
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
    writer = _Writer(tmp, dtype, tokenizer.specials.sep)
    total_bytes = sum(f.stat().st_size for f in files)
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    current_doc = None

    def write(pieces: list[tuple[int, str]], encodings: list[list[int]]) -> None:
        """Append one tokenized batch: one array per document run, a separator where documents change."""
        nonlocal current_doc
        for doc, group in groupby(zip(pieces, encodings), key=lambda pair: pair[0][0]):
            if current_doc is not None and doc != current_doc:
                writer.end_document()
            current_doc = doc
            writer.write(np.fromiter(chain.from_iterable(ids for _, ids in group), dtype))
        bar.update(sum(len(text.encode()) for _, text in pieces))

    pieces = iter_pieces(files, text_field)
    try:
        # Tokenizing batch k (Rust, all cores, GIL released) overlaps reading k+1 and writing k-1.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = None
            while batch := list(islice(pieces, BATCH_PIECES)):
                job = pool.submit(tokenizer.encode, [text for _, text in batch], special=False)
                if pending:
                    write(pending[0], pending[1].result())
                pending = (batch, job)
            if pending:
                write(pending[0], pending[1].result())
        if current_doc is not None:
            writer.end_document()
        writer.close()
        if writer.total == 0:
            raise SesameError(f"--corpus: the files {[str(f) for f in files][:3]} hold no text")
        meta = {"format": FORMAT, "fingerprint": key, "dtype": dtype.name, "shards": writer.shard_sizes,
                "n_tokens": writer.total, "n_docs": (tmp / "docs.bin").stat().st_size // 8,
                "vocab_size": tokenizer.vocab_size, "sources": [str(f) for f in files]}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        tokenizer.save(tmp / "tokenizer.json")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
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
        if not is_shard_dir(self.path):
            raise SesameError(f"{self.path}: not a shard directory (no sesame meta.json); run `sesame prepare` first")
        self.meta = json.loads((self.path / "meta.json").read_text())
        dtype = np.dtype(self.meta["dtype"])
        self.arrays = [
            np.memmap(self.path / f"tokens-{i:05d}.bin", dtype=dtype, mode="r", shape=(n,))
            for i, n in enumerate(self.meta["shards"])
        ]
        self.shard_starts = np.cumsum([0] + self.meta["shards"][:-1])
        self.doc_ends = np.fromfile(self.path / "docs.bin", dtype=np.int64)

    @property
    def n_tokens(self) -> int:
        return self.meta["n_tokens"]

    def windows(self, length: int) -> list[Window]:
        """Non-overlapping windows of ``length`` tokens, packed across document boundaries."""
        return [Window(s, k * length) for s, a in enumerate(self.arrays) for k in range(len(a) // length)]

    def documents(self, windows: Sequence[Window]) -> np.ndarray:
        """Index of the document in which each window starts."""
        starts = np.array([self.shard_starts[w.shard] + w.start for w in windows], dtype=np.int64)
        return np.searchsorted(self.doc_ends, starts, side="right")

    def read(self, window: Window, length: int) -> np.ndarray:
        return np.asarray(self.arrays[window.shard][window.start: window.start + length], dtype=np.int64)
