"""Reading raw text corpora: files, folders, and JSON Lines, validated as UTF-8, streamed.

Text arrives in pieces (one line at a time) so memory stays flat however large the corpus is, each
piece tagged with its source file and its document. Where documents begin (:func:`boundary_rule`,
decided per file by reading it once beforehand):

* a JSON Lines file: one document per record (its ``--text-field``);
* a CSV or TSV file (a task's labeled training file): one document per row, its ``--text-field`` column, read
  strictly by :func:`sesame.data.labeled.read_fields`; no other column, the labels among them, is read;
* a text file with WikiText article titles, lines `` = Title = `` (exactly one ``=`` each side;
  `` = = Section = = `` lines are sections of the article, not documents): each title begins a
  document, and blank lines, which separate WikiText's paragraphs, do not;
* else a text file with chapter headings, lines beginning ``CHAPTER``/``Chapter`` and a Roman or
  Arabic number (``CHAPTER I.``, ``Chapter 12``), as Project Gutenberg's books mark them: each begins
  a document (a chapter);
* else blank lines (empty or whitespace only) separate documents, as in BERT's pre-training input
  format (Devlin et al. 2019, ``create_pretraining_data.py``).

A heading begins a new document only once the current one holds text besides headings and blank
lines: text before the first heading (a title page) is a document of its own, and headings with only
blank lines between them (a book's table of contents) stay with the text after the last of them.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..errors import SesameError
from .labeled import TEXT_SUFFIXES, decode, json_object, read_fields

JSONL_SUFFIXES = {".jsonl", ".ndjson"}
TABLE_SUFFIXES = {".csv", ".tsv"}
RECORD_SUFFIXES = JSONL_SUFFIXES | TABLE_SUFFIXES  # a document per record or row
HEADINGS = {  # the rules by which a heading line begins a document, in order of precedence
    "wikitext titles": re.compile(r"^ ?= [^=](?:.*[^=])? = ?$"),
    "chapter headings": re.compile(r"^\s*(?:CHAPTER|Chapter) (?:[IVXLCDM]+|\d+)\b"),
}
BLANK_LINES = "blank lines"
JSONL_RECORDS = "jsonl records"
TABLE_ROWS = "table rows"


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
            yield lineno, decode(raw, str(path), lineno)


def boundary_rule(path: Path) -> str:
    """How ``path`` is cut into documents (the module's docstring): ``JSONL_RECORDS`` for a JSON Lines file,
    else the first rule of ``HEADINGS`` one of whose headings the file holds, else ``BLANK_LINES``."""
    if path.suffix.lower() in RECORD_SUFFIXES:
        return JSONL_RECORDS if path.suffix.lower() in JSONL_SUFFIXES else TABLE_ROWS
    found = set()
    with open(path, "rb") as fh:  # bytes: invalid UTF-8 is reported, with its line, when the file is read
        for raw in fh:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            found.update(rule for rule, heading in HEADINGS.items() if heading.match(line))
            if next(iter(HEADINGS)) in found:
                break
    return next((rule for rule in HEADINGS if rule in found), BLANK_LINES)


def _text_documents(path: Path, rule: str) -> Iterator[tuple[bool, str]]:
    """``(begins a document, line)`` for each line of a text file cut by ``rule``."""
    body = after_blank = False  # whether the current document holds text yet; whether the last line was blank
    for _, line in decoded_lines(path):
        blank = not line.strip()
        heading = rule in HEADINGS and bool(HEADINGS[rule].match(line.rstrip("\r\n")))
        begins = body and (heading if rule in HEADINGS else after_blank and not blank)
        body = (body and not begins) or not (blank or heading)
        after_blank = blank
        yield begins, line


def iter_pieces(files: Sequence[Path], text_field: str = "text", *, rules: Sequence[str] | None = None
                ) -> Iterator[tuple[int, int, str]]:
    """Yield ``(source_index, document_index, text_piece)`` in corpus order, the source being the position
    of its file in ``files`` and documents numbered across the corpus.

    Text files are yielded line by line with their newlines, cut into documents by their
    :func:`boundary_rule` (``rules``, one per file, when already known); JSON Lines and CSV/TSV files give one
    document per record or row, its ``text_field`` (:func:`record_texts`).
    """
    doc = -1
    for source, path in enumerate(files):
        if path.suffix.lower() in RECORD_SUFFIXES:
            for text in record_texts(path, text_field):
                doc += 1
                yield source, doc, text
        else:
            doc += 1
            for begins, line in _text_documents(path, rules[source] if rules else boundary_rule(path)):
                doc += begins
                yield source, doc, line


def iter_texts(files: Sequence[Path], text_field: str = "text") -> Iterator[str]:
    """The non-blank text pieces, without documents (for tokenizer and word-vector training): text files'
    lines, JSON Lines records' ``text_field``."""
    for path in files:
        if path.suffix.lower() in RECORD_SUFFIXES:
            texts = record_texts(path, text_field)
        else:
            texts = (line for _, line in decoded_lines(path))
        yield from (text for text in texts if text.strip())


def record_texts(path: Path, text_field: str) -> Iterator[str]:
    """The ``text_field`` of each record of a JSON Lines file, or of each row of a CSV/TSV file (a task's training
    file, read as :func:`sesame.data.labeled.read_fields` reads it; its other columns, labels among them, are never
    read)."""
    if path.suffix.lower() in TABLE_SUFFIXES:
        yield from (row["text"] for row in read_fields(path, {"text": (text_field, "--text-field")}))
        return
    for lineno, line in decoded_lines(path):
        if not line.strip():
            continue
        record = json_object(line, f"{path}:{lineno}")
        if not isinstance(record.get(text_field), str):
            raise SesameError(f"{path}:{lineno}: no string field {text_field!r}; name the field with --text-field")
        yield record[text_field]
