"""Labeled files: CSV (RFC 4180), TSV (split on tabs, no quoting, as GLUE ships it) and JSON Lines."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Iterator

from ..errors import SesameError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def read_text(path: Path) -> str:
    """A labeled file's text: it must exist, be UTF-8 (a BOM is dropped) and not be empty."""
    if not path.is_file():
        raise SesameError(f"{path}: no such file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise SesameError(f"{path}:{line}: not valid UTF-8; re-encode the file as UTF-8") from None
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


def read_rows(path: str | Path, header: bool = True) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) pairs, each row a dict keyed by column name (header row for CSV/TSV, keys
    for JSONL, whose non-string values come back as JSON text); with ``header`` False (CSV/TSV
    without a header row, as GLUE ships CoLA) keyed by column number, "0", "1", ... A CSV row's
    number counts rows, which is its line unless a quoted field spans lines."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise SesameError(f"{path}: unknown format {path.suffix!r}; use .csv, .tsv or .jsonl")
    if kind == "jsonl":
        return [(line, {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()})
                for line, record in json_lines(path)]
    reader = csv.reader(io.StringIO(read_text(path)), delimiter="," if kind == "csv" else "\t",
                        quoting=csv.QUOTE_MINIMAL if kind == "csv" else csv.QUOTE_NONE)
    table = list(reader)
    names = table.pop(0) if header else [str(i) for i in range(max(len(r) for r in table))]
    if not table:
        raise SesameError(f"{path}: a header row but no data rows")
    first = 2 if header else 1
    return [(first + i, dict(zip(names, row))) for i, row in enumerate(table)]


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
    available = sorted({k for _, row in rows for k in row if k is not None}, key=lambda k: (len(k), k))
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
