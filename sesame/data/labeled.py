"""Labeled files: CSV (RFC 4180), TSV (split on tabs, no quoting, as GLUE ships it) and JSON Lines."""
from __future__ import annotations

import codecs
import csv
import io
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import SesameError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def decode(raw: bytes, where: str, line: int = 1) -> str:
    """UTF-8 bytes as text (a leading BOM dropped). Invalid UTF-8 is an error naming ``where`` (a file, or
    stdin), the line (``raw``'s first is ``line``) and the offending byte's place in it."""
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return str(memoryview(raw)[bom:], "utf-8")
    except UnicodeDecodeError as err:
        at = bom + err.start
        line += raw.count(b"\n", 0, at)
        column = at - raw.rfind(b"\n", 0, at)  # 1-based: rfind gives -1 on the first line
        raise SesameError(f"{where}:{line}: not valid UTF-8 (byte {raw[at]:#04x}, the line's byte {column}); "
                          "re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > NEW`") from None


def stdin_lines() -> list[str]:
    """Standard input's lines (newlines of any convention dropped), checked to be UTF-8 as a file's are (its
    bytes; a stream without them, one a caller put in place of stdin, holds text already)."""
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    return io.StringIO(decode(raw, "stdin"), newline=None).read().split("\n")


def read_text(path: Path) -> str:
    """A labeled file's text: it must exist, be UTF-8 (a BOM is dropped) and not be empty."""
    if not path.is_file():
        raise SesameError(f"{path}: no such file")
    text = decode(path.read_bytes(), str(path))
    if not text.strip():
        raise SesameError(f"{path}: the file is empty")
    return text


def json_object(raw: str, where: str) -> dict:
    """One line of JSON Lines, which must hold a JSON object; errors name ``where`` (file:line)."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as err:
        raise SesameError(f"{where}: not valid JSON ({err.msg}); one JSON object per line") from None
    if not isinstance(record, dict):
        raise SesameError(f"{where}: expected a JSON object per line")
    return record


def json_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSON Lines file, each checked to be a JSON
    object. Lines end at "\\n" only: ``splitlines`` would also cut at U+2028 inside a JSON string."""
    for line, raw in enumerate(read_text(Path(path)).split("\n"), 1):
        if raw.strip():
            yield line, json_object(raw, f"{path}:{line}")


def read_rows(path: str | Path, header: bool = True) -> list[tuple[int, dict[str, str | None]]]:
    """(line number, row) pairs, each row a dict keyed by column name (header row for CSV/TSV, keys
    for JSONL, whose null values come back as None and other non-string values as JSON text); with
    ``header`` False (CSV/TSV without a header row, as GLUE ships CoLA) keyed by column number, "0", "1",
    ... A row's line is the one it begins on. Blank lines are skipped; every other CSV/TSV row must have
    as many fields as the header (or the first row): a text holding an unquoted comma is refused, not cut."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise SesameError(f"{path}: unknown format {path.suffix!r}; use .csv, .tsv or .jsonl")
    if kind == "jsonl":
        return [(line, {k: v if isinstance(v, str) or v is None else json.dumps(v) for k, v in record.items()})
                for line, record in json_lines(path)]
    records = _records(path, kind)
    (first, names), width = records[0], len(records[0][1])
    if header:
        records = records[1:]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise SesameError(f"{path}:{first}: the header names {', '.join(map(repr, repeated))} more than once; "
                              "give every column its own name")
        if not records:
            raise SesameError(f"{path}: a header row but no data rows")
    else:
        names = [str(i) for i in range(width)]
    for line, fields in records:
        if len(fields) != width:
            hint = ("fill in the missing fields or remove the row" if len(fields) < width else
                    'quote a field that holds a comma: "late again, friendly staff"' if kind == "csv" else
                    "a field must not hold a tab (TSV has no quoting; write CSV to quote a field)")
            raise SesameError(f"{path}:{line}: {len(fields)} field{'s' * (len(fields) != 1)}, but the "
                              f"{'header' if header else 'first row'} has {width}; {hint}")
    return [(line, dict(zip(names, fields))) for line, fields in records]


@contextmanager
def _field_limit(size: int) -> Iterator[None]:
    """The csv module's field size limit raised to ``size`` meanwhile (no field is longer than its file)."""
    old = csv.field_size_limit()
    csv.field_size_limit(max(old, size))
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _records(path: Path, kind: str) -> list[tuple[int, list[str]]]:
    """(first line, fields) of every row of a CSV (RFC 4180) or TSV (no quoting) file but blank lines."""
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="," if kind == "csv" else "\t",
                        quoting=csv.QUOTE_MINIMAL if kind == "csv" else csv.QUOTE_NONE, strict=True)
    records, line = [], 1
    with _field_limit(len(text) + 1):
        try:
            for fields in reader:
                if len(fields) > 1 or fields and fields[0].strip():
                    records.append((line, fields))
                line = reader.line_num + 1
        except csv.Error as err:
            raise SesameError(f"{path}:{line}: not valid CSV ({err}); enclose a field that holds a comma, a quote or "
                              'a line break in quotes, doubling the quotes inside: "she said ""hi"", then left"'
                              ) from None
    if not records:
        raise SesameError(f"{path}: no rows, only blank lines")
    return records


def read_fields(path: str | Path, fields: dict[str, tuple[str | None, str]]) -> list[dict[str, str]]:
    """The named fields of every row of a labeled file, checked: ``fields`` maps a field name to
    (column, flag that chose it); a field whose column is None is left out. Columns given as numbers
    ("0", "3") select by position in a CSV/TSV file without a header row. Each row comes back as
    ``{field: value, "line": line number}``; a missing column or an empty value is an error naming
    the file, the line and the flag."""
    chosen = {name: (column, flag) for name, (column, flag) in fields.items() if column is not None}
    by_position = all(column.isdigit() for column, _ in chosen.values())
    jsonl = FORMATS.get(Path(path).suffix.lower()) == "jsonl"
    rows = read_rows(path, header=jsonl or not by_position)
    available = sorted({k for _, row in rows for k in row}, key=lambda k: (len(k), k))
    for column, flag in chosen.values():
        if column not in available:
            raise SesameError(f"{path}: no column {column!r} for {flag}; the file has: {', '.join(available)}")
    records = []
    for line, row in rows:
        record = {"line": line}
        for name, (column, flag) in chosen.items():
            value = row.get(column)
            if value is None or not value.strip():
                raise SesameError(f"{path}:{line}: empty {column!r} ({flag}); remove the row or fill it")
            record[name] = value
        records.append(record)
    return records


def read_columns(path: str | Path, text_column: str, label_column: str | None,
                 text_flag: str = "--text-column", label_flag: str = "--label-column"
                 ) -> tuple[list[str], list[str] | None]:
    """The text column (and the label column when asked) of a labeled file, checked."""
    rows = read_fields(path, {"text": (text_column, text_flag), "label": (label_column, label_flag)})
    return [r["text"] for r in rows], [r["label"].strip() for r in rows] if label_column else None
