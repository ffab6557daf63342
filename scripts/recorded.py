"""What the results scripts share: stages recorded as they finish, and Markdown blocks replaced in place.

A script keeps a JSON record of finished stages, so an interrupted run continues where it stopped,
and writes its tables into a page of docs/results/ between its own ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` markers, leaving the rest of the file alone.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable


def open_record(folder: Path) -> tuple[Path, dict]:
    """``folder/results.json`` (the folder made if need be) and the stages an earlier run recorded there."""
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "results.json"
    return record, json.loads(record.read_text()) if record.exists() else {}


def stage(results: dict, key: str, record: Path, work: Callable[[], dict]) -> dict:
    """``results[key]``, running ``work()`` (timed) first unless an earlier run recorded it."""
    if key not in results:
        started = time.time()
        results[key] = {**work(), "minutes": round((time.time() - started) / 60, 2)}
        record.write_text(json.dumps(results, indent=1) + "\n")
        print(key, {k: v for k, v in results[key].items() if isinstance(v, (int, float))}, flush=True)
    return results[key]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5


def replace_block(path: Path, name: str, lines: list[str]) -> None:
    """Put ``lines`` between the ``name`` markers of ``path`` (appended, with markers, the first time)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = "\n".join([start, *lines, end])
    text = path.read_text() if path.exists() else "# Results\n"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
