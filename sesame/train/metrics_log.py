"""A run's metrics.jsonl: one JSON object per log point, ``{"step", "split": "train" | "dev", ...}``, appended by
the trainer (:class:`MetricsLog`) and read by ``sesame report`` (:func:`read_metrics`).

When the ``tensorboard`` package is installed (``pip install tensorboard``, or the ``tensorboard`` extra), every
scalar of a record (:func:`scalars`) also goes to TensorBoard event files in ``RUN/tensorboard/``, at the record's
step, tagged ``split/name`` (``train/loss``, ``dev/accuracy``). Each :class:`MetricsLog` (one per trainer, so one per
command) writes an event file of its own, opened and closed for every record (no writer thread, nothing to close).
The file begins with TensorBoard's restart marker one step after the last record metrics.jsonl then holds, so
TensorBoard hides the events a resumed run logged after its checkpoint, as the trainer drops those lines from
metrics.jsonl.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from ..errors import SesameError

TENSORBOARD = "tensorboard"  # the folder of a run's event files
ENABLE = "pip install tensorboard"


def scalars(record: dict) -> dict[str, float]:
    """The numbers of a metrics record by tag, ``split/name`` (a nested dict's as ``split/name/key``); the step,
    text, booleans and lists are not scalars."""
    found: dict[str, float] = {}

    def add(tag: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{tag}/{key}", inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found[tag] = float(value)

    for name, value in record.items():
        if name not in ("step", "split"):
            add(f"{record['split']}/{name}", value)
    return found


def read_metrics(path: Path) -> list[dict]:
    """The records of the metrics.jsonl ``path``. A last line without its newline (being written, or cut short by a
    kill) is left out; a line that is not a record is an error naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SesameError(f"{path}: cannot be read as text ({err}); is it a sesame run's log?") from None
    records = []
    for number, line in enumerate(text[: text.rfind("\n") + 1].splitlines(), 1):
        try:
            record = json.loads(line)
            valid = isinstance(record["step"], int) and isinstance(record["split"], str)
        except (json.JSONDecodeError, TypeError, KeyError):
            valid = False
        if not valid:
            raise SesameError(f"{path}, line {number}: not a metrics record ({{\"step\": N, \"split\": ...}}); delete "
                              "the line")
        records.append(record)
    return records


@functools.cache
def _tensorboard() -> SimpleNamespace | None:
    """TensorBoard's Event, SessionLog and Summary messages and its RecordWriter; None, after one line on stderr
    saying how to get them, when it is not installed."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        print(f"sesame: training curves also go to TensorBoard files once it is installed: {ENABLE}", file=sys.stderr)
        return None
    return SimpleNamespace(Event=Event, SessionLog=SessionLog, Summary=Summary, RecordWriter=RecordWriter)


class MetricsLog:
    """Appends records to ``run``'s metrics.jsonl and, with TensorBoard installed, to an event file of its own in
    ``run/tensorboard/`` (begun at the first record)."""

    def __init__(self, run: Path):
        self.path = Path(run) / "metrics.jsonl"
        self.events: Path | None = None

    def append(self, record: dict) -> None:
        tb = _tensorboard()
        if tb is not None and self.events is None:
            self._begin(tb)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if tb is not None:
            values = [tb.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(record).items()]
            self._write(tb, tb.Event(wall_time=time.time(), step=record["step"], summary=tb.Summary(value=values)))

    def _begin(self, tb: SimpleNamespace) -> None:
        """A new event file: its version, then the restart marker one step after the last record kept, which hides
        every earlier event of a later step."""
        kept = max((r["step"] for r in read_metrics(self.path)), default=0) if self.path.exists() else 0
        folder = self.path.parent / TENSORBOARD
        folder.mkdir(exist_ok=True)
        self.events = folder / f"events.out.tfevents.{time.time_ns()}.sesame"  # TensorBoard reads them in name order
        self._write(tb, tb.Event(wall_time=time.time(), step=kept + 1, file_version="brain.Event:2"))
        self._write(tb, tb.Event(wall_time=time.time(), step=kept + 1,
                                 session_log=tb.SessionLog(status=tb.SessionLog.START)))

    def _write(self, tb: SimpleNamespace, event: object) -> None:
        with open(self.events, "ab") as fh:
            tb.RecordWriter(fh).write(event.SerializeToString())
