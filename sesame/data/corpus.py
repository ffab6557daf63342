"""Reading raw text corpora: files, folders, and JSON Lines, validated as UTF-8, streamed.

A *document* is one text file, or one record of a ``.jsonl`` file. Text arrives in pieces
(one line at a time) so memory stays flat however large the corpus is.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..errors import SesameError
from .labeled import json_object

TEXT_SUFFIXES = {".txt", ".text", ".raw", ".tokens", ".md"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}


def resolve_sources(paths: Sequence[str | Path], flag: str = "--corpus") -> list[Path]:
    """Expand folders into their text and JSONL files (sorted, recursive); check each exists."""
    if not paths:
        raise SesameError(f"{flag} needs at least one file or folder")
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES | JSONL_SUFFIXES
            )
            if not found:
                raise SesameError(
                    f"{flag} {path}: the folder holds no .txt or .jsonl files; point at text files instead"
                )
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise SesameError(f"{flag} {path}: no such file or folder")
    return files


def fingerprint(files: Iterable[Path], *extra: str) -> str:
    """A hash of the files' names, sizes and modification times (and any extra strings)."""
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:16]


def decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` pairs of a UTF-8 file, line endings kept; invalid UTF-8 names file and line."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SesameError(
                    f"{path}:{lineno}: not valid UTF-8 (byte {err.start} of the line); "
                    "re-encode the file as UTF-8 (e.g. iconv -t UTF-8)"
                ) from None


def iter_pieces(files: Sequence[Path], text_field: str = "text") -> Iterator[tuple[int, str]]:
    """Yield ``(document_index, text_piece)`` in corpus order.

    Text files are one document each, yielded line by line with their newlines;
    JSON Lines files give one document per record, read from ``text_field``.
    """
    doc = -1
    for path in files:
        if path.suffix.lower() in JSONL_SUFFIXES:
            for lineno, line in decoded_lines(path):
                if not line.strip():
                    continue
                record = json_object(line, f"{path}:{lineno}")
                if not isinstance(record.get(text_field), str):
                    raise SesameError(
                        f"{path}:{lineno}: no string field {text_field!r}; name the field with --text-field"
                    )
                doc += 1
                yield doc, record[text_field]
        else:
            doc += 1
            for _, line in decoded_lines(path):
                yield doc, line


def iter_texts(files: Sequence[Path], text_field: str = "text") -> Iterator[str]:
    """Just the text pieces (for tokenizer training)."""
    for _, text in iter_pieces(files, text_field):
        if text.strip():
            yield text
