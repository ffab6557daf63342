"""Labeled files: CSV (RFC 4180), TSV (split on tabs, no quoting, as GLUE ships it) and JSON Lines."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..errors import SesameError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def _text(path: Path) -> str:
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


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows as dicts keyed by column name (header row for CSV/TSV, keys for JSONL)."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise SesameError(f"{path}: unknown format {path.suffix!r}; use .csv, .tsv or .jsonl")
    text = _text(path)
    if kind == "jsonl":
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SesameError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise SesameError(f"{path}:{lineno}: expected a JSON object per line")
            rows.append({k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()})
        return rows
    reader = csv.DictReader(io.StringIO(text), delimiter="," if kind == "csv" else "\t",
                            quoting=csv.QUOTE_MINIMAL if kind == "csv" else csv.QUOTE_NONE)
    rows = list(reader)
    if not rows:
        raise SesameError(f"{path}: a header row but no data rows")
    return rows


def read_columns(path: str | Path, text_column: str, label_column: str | None,
                 text_flag: str = "--text-column", label_flag: str = "--label-column"
                 ) -> tuple[list[str], list[str] | None]:
    """The text column (and the label column when asked) of a labeled file, checked."""
    rows = read_rows(path)
    available = sorted({k for row in rows for k in row if k is not None})
    for column, flag in ((text_column, text_flag), (label_column, label_flag)):
        if column is not None and column not in available:
            raise SesameError(f"{path}: no column {column!r} for {flag}; the file has: {', '.join(available)}")
    texts, labels = [], [] if label_column else None
    first = 1 if FORMATS[Path(path).suffix.lower()] == "jsonl" else 2  # CSV/TSV: line 1 is the header
    for i, row in enumerate(rows, first):
        text = row.get(text_column)
        if text is None or not text.strip():
            raise SesameError(f"{path}: row {i} has an empty {text_column!r}; remove or fill it")
        texts.append(text)
        if labels is not None:
            label = row.get(label_column)
            if label is None or label == "":
                raise SesameError(f"{path}: row {i} has no {label_column!r} label")
            labels.append(label.strip())
    return texts, labels
