"""Resumable stages: what multi-stage applications (``sesame compare``'s cells, ``sesame ulmfit``'s stages)
share. A stage is a run directory that is finished once its record (:data:`RECORD`: its settings and
measurements) is written; a finished stage is reused, an unfinished one resumed from its checkpoint, or
started afresh when it has none; its runtime's precision is one of its settings, its device is not
(:func:`stage_runtime`). Also the train/dev pair of labeled files such stages fine-tune on.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..errors import SesameError
from ..outputs import directory_kind, only_run_files
from ..run import KINDS
from ..runtime import Runtime
from ..tasks import make_task
from ..train import Interrupted
from ..train.checkpoint import checkpoint_dir, read_json, write_json

RECORD = "compare.json"  # a stage's record (the name of the first application that wrote them, kept for old runs)
NO_STEP_CAP = 10**9  # a stage whose time budget ends pre-training, not a step count


def cached_stage(run: Path, settings: dict, work: Callable[[bool], dict]) -> tuple[dict, bool]:
    """(record, reused): the record of a finished stage made with ``settings``, or of ``work(resume)`` run now.

    An unfinished stage resumes when it holds a run with a checkpoint; otherwise it starts afresh, removing the
    unfinished run (only a run: a folder holding other files is refused, never deleted). A finished stage made
    with other settings is an error: they are refused rather than mixed.
    """
    settings = json.loads(json.dumps(settings))
    if (run / RECORD).is_file():
        record = read_json(run / RECORD)
        changed = sorted(k for k in settings.keys() | record["settings"].keys()
                         if settings.get(k) != record["settings"].get(k))
        if changed:
            raise SesameError(f"{run}: made with other settings ({', '.join(changed)}); choose another --out, "
                              f"or delete {run} to redo it")
        return record, True
    resume = (run / "config.json").is_file() and checkpoint_dir(run) is not None
    if not resume and run.exists():
        if directory_kind(run) not in KINDS and not only_run_files(run):
            raise SesameError(f"{run}: holds files sesame did not write; move them away so this stage can start")
        shutil.rmtree(run)
    try:
        record = {"settings": settings, **work(resume)}
    except Interrupted:
        raise Interrupted(f"{run}: interrupted; it is saved, run the same command again to continue") from None
    run.mkdir(parents=True, exist_ok=True)
    write_json(run / RECORD, record)
    return record, False


def stage_runtime(runtime: Runtime) -> tuple[Runtime, dict]:
    """A stage's runtime, and what its settings record of it. The precision is a setting (it changes the numbers):
    it is given to the stage explicitly, so a resumed stage continues in the precision its settings will say, and
    recorded, but for fp32, the default, which stages made before the runtime existed did not record. The device,
    TF32 and compile are the machine's choice, not settings: a stage finished on a CPU is reused on a GPU."""
    precision = runtime.precision or "fp32"
    return replace(runtime, precision=precision), {} if precision == "fp32" else {"precision": precision}


def trainer_state(run: Path) -> dict:
    """The trainer_state.json of ``run``'s last checkpoint (step, elapsed seconds, training config)."""
    return read_json(checkpoint_dir(run) / "trainer_state.json")


def duration(seconds: float) -> str:
    """``42 s`` or ``3.5 min``."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


@dataclass
class LabeledFiles:
    """A labeled train/dev pair of files: text (or, with ``pair_column``, text-pair) classification."""
    name: str
    train: str
    dev: str
    text_column: str = "text"
    label_column: str = "label"
    pair_column: str | None = None

    @property
    def task(self) -> str:
        """The task that reads them: ``pair`` or ``classify``."""
        return "pair" if self.pair_column else "classify"

    @property
    def columns(self) -> dict:
        return {"text_column": self.text_column, "label_column": self.label_column,
                **({"pair_column": self.pair_column} if self.pair_column else {})}

    def read(self, path: str) -> list[dict]:
        """The rows of ``path``: ``text``, ``label`` and, for pairs, ``pair``."""
        return make_task(self.task, self.columns).read(path)

    def check_labels(self) -> None:
        """Read both files now, so a bad column or a label the classifier cannot learn fails before any training."""
        train = {row["label"] for row in self.read(self.train)}
        dev = {row["label"] for row in self.read(self.dev)}
        if len(train) < 2:
            raise SesameError(f"{self.train}: column {self.label_column!r} has only one label; a classifier needs two")
        if dev - train:
            raise SesameError(f"{self.dev}: labels {sorted(dev - train)[:5]} never occur in {self.train}")
