"""Labeled files: CSV (RFC 4180), TSV (split on tabs, no quoting, as GLUE ships it) and JSON Lines; and plain text
files, one text per line, where texts alone are read (a single-text task's unlabeled examples)."""
from __future__ import annotations

import codecs
import csv
import io
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import SesameError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
TEXT_SUFFIXES = {".txt", ".text", ".raw", ".tokens", ".md"}  # plain text, as `pretrain --corpus` reads it
LABELED = "a CSV, TSV or JSONL file"
LABEL = "label"  # the field of a class or a target, which may not be NaN's spelling (read_fields)


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
    return lines(decode(raw, "stdin"))


def lines(text: str) -> list[str]:
    """``text``'s lines, cut at newlines of any convention ("\\n", "\\r\\n", "\\r") and nowhere else."""
    return io.StringIO(text, newline=None).read().split("\n")


def a_file(path: str | Path, what: str, flag: str | None = None) -> Path:
    """``path`` when it names a file; else an error saying it is a folder, or missing, and to give ``what`` (a
    file of some kind: "a text file with one prompt per line"). ``flag``: the flag that named it, if one did."""
    path = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    if path.is_dir():
        raise SesameError(f"{where} is a folder; give {what}")
    if not path.is_file():
        raise SesameError(f"{where}: no such file; give {what}")
    return path


def read_text(path: Path, what: str = "a file") -> str:
    """A user file's text: it must be a file (else the error asks for ``what``), be UTF-8 (a BOM is dropped) and
    not be empty."""
    text = decode(a_file(path, what).read_bytes(), str(path))
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
    for line, raw in enumerate(read_text(Path(path), "a JSON Lines file").split("\n"), 1):
        if raw.strip():
            yield line, json_object(raw, f"{path}:{line}")


def read_rows(path: str | Path, header: bool = True) -> list[tuple[int, dict[str, str | None]]]:
    """(line number, row) pairs, each row a dict keyed by column name (header row for CSV/TSV, keys
    for JSONL, whose null values come back as None, objects and lists as they are, and numbers and booleans as
    JSON text); with
    ``header`` False (CSV/TSV without a header row, as GLUE ships CoLA) keyed by column number, "0", "1",
    ... A row's line is the one it begins on. Blank lines are skipped; every other CSV/TSV row must have
    as many fields as the header (or the first row): a text holding an unquoted comma is refused, not cut."""
    path = a_file(path, LABELED)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise SesameError(f"{path}: unknown format {path.suffix!r}; use .csv, .tsv or .jsonl (or, for texts alone, "
                          ".txt: one per line)")
    if kind == "jsonl":
        return [(line, {k: json.dumps(v) if isinstance(v, (int, float)) else v for k, v in record.items()})
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
    text = read_text(path, LABELED)
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
    ``{field: value, "line": line number}``; a missing column, an empty value, a JSON object or list, or a
    :data:`LABEL` that is NaN's spelling ("nan": a missing value as pandas writes one) is an error naming the file,
    the line and the flag. A plain text file (:data:`TEXT_SUFFIXES`) gives the first chosen field, one text per
    non-blank line, and nothing else (:func:`_texts`)."""
    chosen = {name: (column, flag) for name, (column, flag) in fields.items() if column is not None}
    if Path(path).suffix.lower() in TEXT_SUFFIXES:
        return _texts(Path(path), chosen)
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
            if isinstance(value, (dict, list)):
                kind = "object" if isinstance(value, dict) else "list"
                raise SesameError(f"{path}:{line}: {column!r} ({flag}) is a JSON {kind}, not a text or a label; give a "
                                  "string (or a number)")
            if value is None or not value.strip():
                raise SesameError(f"{path}:{line}: empty {column!r} ({flag}); remove the row or fill it")
            if name == LABEL and _is_nan(value):
                raise SesameError(f"{path}:{line}: {column!r} is {value!r}, not a finite number nor a label but a "
                                  f"missing value written out (NaN); fill it in or remove the row ({flag})")
            record[name] = value
        records.append(record)
    return records


def _texts(path: Path, chosen: dict[str, tuple[str, str]]) -> list[dict[str, str]]:
    """A plain text file's texts as the first field of ``chosen`` (field → (column, flag)), one per non-blank line,
    as :func:`read_fields` gives rows; a second field (a pair's second text, a label) is an error naming its flag."""
    (name, _), *more = chosen.items()
    if more:
        other, (column, flag) = more[0]
        raise SesameError(f"{path}: a text file holds one text per line and nothing else, but {flag} ({column}) asks "
                          f"for {'labels' if other == LABEL else 'a second column'}; give {LABELED} with that column")
    return [{name: text, "line": line} for line, text in enumerate(lines(read_text(path, "a text file")), 1)
            if text.strip()]  # one at least: read_text refuses a blank file


def _is_nan(text: str) -> bool:
    """Whether ``text`` spells NaN ("nan", "NaN", "-nan"), as tools write a missing value."""
    try:
        return math.isnan(float(text))
    except ValueError:
        return False


def read_columns(path: str | Path, text_column: str, label_column: str | None,
                 text_flag: str = "--text-column", label_flag: str = "--label-column"
                 ) -> tuple[list[str], list[str] | None]:
    """The text column (and the label column when asked) of a labeled file, checked."""
    rows = read_fields(path, {"text": (text_column, text_flag), "label": (label_column, label_flag)})
    return [r["text"] for r in rows], [r["label"].strip() for r in rows] if label_column else None
