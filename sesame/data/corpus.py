"""Reading raw text corpora: files, folders, JSON Lines (plain, gzip or zstd) and Parquet, validated as UTF-8,
streamed.

Text arrives in pieces (one line or record at a time) so memory stays flat however large the corpus is, each
piece tagged with its source file and its document. Where documents begin (:func:`boundary_rule`,
decided per file by reading it once beforehand):

* a file of records, as C4, The Pile and FineWeb ship (:func:`records`): JSON Lines (``.jsonl``, ``.ndjson``),
  compressed (``.jsonl.gz``, ``.jsonl.zst``; C4's ``.json.gz``) or not, and Parquet (``.parquet``, read a batch
  of rows at a time, never whole): one document per record, its text the ``--text-field`` field or column;
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

import gzip
import hashlib
import importlib
import io
import re
import zlib
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

from ..errors import SesameError
from .labeled import TEXT_SUFFIXES, decode, json_object, read_fields

JSONL_SUFFIXES = {".jsonl", ".ndjson"}
TABLE_SUFFIXES = {".csv", ".tsv"}
COMPRESSED = {".gz": "gzip", ".zst": "zstandard"}  # a JSON Lines file's compression → the module that reads it
COMPRESSED_JSONL = JSONL_SUFFIXES | {".json"}  # compressed, .json is JSON Lines too: C4's c4-train.*.json.gz
PARQUET = ".parquet"
PARQUET_BATCH_ROWS = 1024  # rows read at once: a batch of a row group, never the whole file
EXTRA = "pip install 'sesame-nlp[corpora]'"
HEADINGS = {  # the rules by which a heading line begins a document, in order of precedence
    "wikitext titles": re.compile(r"^ ?= [^=](?:.*[^=])? = ?$"),
    "chapter headings": re.compile(r"^\s*(?:CHAPTER|Chapter) (?:[IVXLCDM]+|\d+)\b"),
}
BLANK_LINES = "blank lines"
JSONL_RECORDS = "jsonl records"
TABLE_ROWS = "table rows"
PARQUET_ROWS = "parquet rows"


def _suffixes(path: Path) -> tuple[str, str]:
    """The last two suffixes of ``path``, lower-cased (``("", ".txt")`` for ``a.txt``)."""
    last = path.suffix.lower()
    return Path(path.stem).suffix.lower(), last


def compression(path: Path) -> str | None:
    """The module that decompresses a compressed JSON Lines file (``a.jsonl.gz``: ``"gzip"``); else None."""
    inner, last = _suffixes(path)
    return COMPRESSED[last] if last in COMPRESSED and inner in COMPRESSED_JSONL else None


def record_format(path: Path) -> str | None:
    """How a file of records is cut: ``JSONL_RECORDS`` (plain or compressed), ``TABLE_ROWS`` (CSV, TSV),
    ``PARQUET_ROWS``; None for text."""
    last = path.suffix.lower()
    if last in JSONL_SUFFIXES or compression(path):
        return JSONL_RECORDS
    return TABLE_ROWS if last in TABLE_SUFFIXES else PARQUET_ROWS if last == PARQUET else None


def is_plain(path: Path) -> bool:
    """Whether ``path``'s bytes are its text (a text or plain JSON Lines file), not compressed or Parquet."""
    return record_format(path) != PARQUET_ROWS and compression(path) is None


def _reader(path: Path) -> str | None:
    """The module that reads ``path``, a compressed or Parquet file; None for plain text."""
    return "pyarrow.parquet" if record_format(path) == PARQUET_ROWS else compression(path)


def _module(name: str, path: Path):
    """The module ``name`` (``zstandard``, ``pyarrow.parquet``), or an error saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise SesameError(f"{path}: reading it needs the {name.split('.')[0]} package; {EXTRA}") from None


def resolve_sources(paths: Sequence[str | Path], flag: str = "--corpus") -> list[Path]:
    """Expand folders into their text and JSONL files (sorted, recursive); check each exists."""
    if not paths:
        raise SesameError(f"{flag} needs at least one file or folder")
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and (  # a task's CSV is named, not found
                p.suffix.lower() in TEXT_SUFFIXES or record_format(p) in (JSONL_RECORDS, PARQUET_ROWS)))
            if not found:
                raise SesameError(f"{flag} {path}: the folder holds no .txt, .jsonl(.gz, .zst) or .parquet files; "
                                  "point at text files instead")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise SesameError(f"{flag} {path}: no such file or folder")
    for file in filter(_reader, files):  # a missing reader is refused before anything is read or written
        _module(_reader(file), file)
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


class _Zstd(io.RawIOBase):
    """The bytes of a zstd stream, its frames decompressed one after another as they are read; a stream that ends
    inside a frame (a download cut short) raises ``ZstdError``, as gzip's reader does (zstandard's own
    ``stream_reader`` ends quietly there)."""

    def __init__(self, zstd, fh: IO[bytes]):
        self.zstd, self.fh, self.context = zstd, fh, zstd.ZstdDecompressor()
        self.frame, self.inside = self.context.decompressobj(), False  # inside: the frame has been fed bytes
        self.out, self.at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.out):
            chunk = self.fh.read(1 << 16)
            if not chunk:
                if self.inside:
                    raise self.zstd.ZstdError("the file ends inside a frame")
                return 0
            self.out, self.at = b"", 0
            while chunk:
                self.out += self.frame.decompress(chunk)
                self.inside = not self.frame.eof
                if self.inside:
                    break
                chunk, self.frame = self.frame.unused_data, self.context.decompressobj()
        n = min(len(buffer), len(self.out) - self.at)
        buffer[:n] = self.out[self.at: self.at + n]
        self.at += n
        return n


def _decompressed(path: Path, fh: IO[bytes]) -> IO[bytes]:
    """The bytes of a JSON Lines file, decompressed as its suffix says, read as they are needed."""
    kind = compression(path)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=fh)
    if kind == "zstandard":
        return io.BufferedReader(_Zstd(_module(kind, path), fh), 1 << 16)
    return fh


def _jsonl_records(path: Path, text_field: str) -> Iterator[tuple[int, str]]:
    kind = compression(path)
    corrupt = (OSError, EOFError, zlib.error) if kind == "gzip" else \
        (_module(kind, path).ZstdError,) if kind else ()
    with open(path, "rb") as fh:
        lines = enumerate(_decompressed(path, fh), 1)
        while True:
            try:
                lineno, raw = next(lines)
            except StopIteration:
                return
            except corrupt as err:
                raise SesameError(f"{path}: not a readable {path.suffix} file ({err}); check it or download it "
                                  "again") from None
            line = decode(raw, str(path), lineno)
            if not line.strip():
                continue
            record = json_object(line, f"{path}:{lineno}")
            if not isinstance(record.get(text_field), str):
                raise SesameError(f"{path}:{lineno}: no string field {text_field!r}; name the field with --text-field")
            yield lineno, record[text_field]


def _parquet_records(path: Path, text_field: str) -> Iterator[tuple[int, str]]:
    pq = _module(_reader(path), path)
    import pyarrow as pa

    try:
        table = pq.ParquetFile(path)
        schema = table.schema_arrow
        if text_field not in schema.names:
            raise SesameError(f"{path}: no column {text_field!r} (it has: {', '.join(schema.names)}); name the "
                              "text column with --text-field")
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
            raise SesameError(f"{path}: column {text_field!r} holds {kind}, not text; name the text column with "
                              "--text-field")
        row = 0
        batches = (batch for group in range(table.num_row_groups)  # one row group at a time: no read-ahead
                   for batch in table.iter_batches(PARQUET_BATCH_ROWS, [group], [text_field]))
        for batch in batches:
            for text in batch.column(0).to_pylist():
                row += 1
                if text is None:
                    raise SesameError(f"{path}: row {row}: no string in column {text_field!r}; drop the row or "
                                      "name another column with --text-field")
                yield row, text
    except pa.ArrowException as err:
        raise SesameError(f"{path}: not a readable Parquet file ({err}); check it or download it again") from None


def records(path: Path, text_field: str = "text") -> Iterator[tuple[int, str]]:
    """``(line or row, text)`` of each record of a JSON Lines, CSV/TSV or Parquet file (:func:`record_format`), its
    ``text_field``; streamed, so memory stays flat: a compressed file is decompressed as it is read, a Parquet
    file read ``PARQUET_BATCH_ROWS`` rows of one column of one row group at a time (whatever its size). Lines
    are numbered in the decompressed text, Parquet's rows from 1; blank lines hold no record. A CSV/TSV file (a
    task's training file) is read as :func:`sesame.data.labeled.read_fields` reads it: its other columns, labels
    among them, are never read."""
    if record_format(path) == TABLE_ROWS:
        return ((row["line"], row["text"]) for row in read_fields(path, {"text": (text_field, "--text-field")}))
    if record_format(path) == PARQUET_ROWS:
        return _parquet_records(path, text_field)
    return _jsonl_records(path, text_field)


def boundary_rule(path: Path) -> str:
    """How ``path`` is cut into documents (the module's docstring): its :func:`record_format` for a file of
    records, else the first rule of ``HEADINGS`` one of whose headings the file holds, else ``BLANK_LINES``."""
    if rule := record_format(path):
        return rule
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
    :func:`boundary_rule` (``rules``, one per file, when already known); files of records give one
    document per record, read from ``text_field``.
    """
    doc = -1
    for source, path in enumerate(files):
        if record_format(path):
            for _, text in records(path, text_field):
                doc += 1
                yield source, doc, text
        else:
            doc += 1
            for begins, line in _text_documents(path, rules[source] if rules else boundary_rule(path)):
                doc += begins
                yield source, doc, line


def iter_texts(files: Sequence[Path], text_field: str = "text") -> Iterator[str]:
    """The non-blank text pieces, without documents (for tokenizer and word-vector training): text files'
    lines, the records' ``text_field``."""
    for path in files:
        if record_format(path):
            texts = (text for _, text in records(path, text_field))
        else:
            texts = (line for _, line in decoded_lines(path))
        yield from (text for text in texts if text.strip())
