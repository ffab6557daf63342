"""The tasks of ``sesame compare --tasks``: ``NAME[:KEY=VALUE...]``, a built-in task (found under ``--data``)
or a JSON task file, each with its own fine-tuning settings if it wants them.

The built-in tasks' data directory defaults to ``$SESAME_DATA``, else ``../shared/data`` (the project's
data sets beside the repository): :func:`default_data`, the one place that reads it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

from ...errors import SesameError
from ...pipelines.stages import LabeledFiles
from .values import checked, typed

DATA_VARIABLE, DATA_FALLBACK = "SESAME_DATA", "../shared/data"
SHORTCUTS = {  # name: the task's files (relative to --data) and columns
    "airline": {"train": "airline/train.csv", "dev": "airline/dev.csv", "text_column": "text",
                "label_column": "airline_sentiment"},
    "sst2": {"train": "glue/SST-2/train.tsv", "dev": "glue/SST-2/dev.tsv", "text_column": "sentence",
             "label_column": "label"},
    "rte": {"train": "glue/RTE/train.tsv", "dev": "glue/RTE/dev.tsv", "text_column": "sentence1",
            "pair_column": "sentence2", "label_column": "label"},
    "mrpc": {"train": "glue/MRPC/train.tsv", "dev": "glue/MRPC/dev.tsv", "text_column": "#1 String",
             "pair_column": "#2 String", "label_column": "Quality"},
}
FINETUNE_OPTIONS = ("epochs", "lr", "batch_size", "max_length")  # a task may set its own


def default_data() -> str:
    """Where the built-in tasks live unless ``--data`` says: ``$SESAME_DATA``, else ``../shared/data``."""
    return os.environ.get(DATA_VARIABLE, DATA_FALLBACK)


@dataclass
class CompareTask(LabeledFiles):
    """A task of the comparison: its labeled files, and ``options``, the fine-tuning settings (of
    ``FINETUNE_OPTIONS``) it sets for itself."""
    options: dict = field(default_factory=dict)


def resolve_tasks(specs: Sequence[str], data: str, defaults: dict | None = None) -> list[CompareTask]:
    """Tasks from ``NAME[:KEY=VALUE...]`` specs. NAME is built in (resolved against ``data``) or a JSON file
    holding one task object or a list of them: ``{"name", "train", "dev", "text_column", "label_column",
    "pair_column"}`` and optionally fine-tuning settings, paths relative to the file. KEY=VALUE items set a
    fine-tuning option (``FINETUNE_OPTIONS``) for that task alone, typed like its entry in ``defaults``."""
    defaults = defaults or {}
    tasks = []
    for spec in specs:
        name, *items = spec.split(":")
        options = {}
        for item in items:
            key, sep, text = item.partition("=")
            if not sep or key not in FINETUNE_OPTIONS or key in options:
                raise SesameError(f"--tasks {spec}: {item!r} should be KEY=VALUE with KEY one of "
                                  f"{', '.join(FINETUNE_OPTIONS)}, each once, e.g. sst2:epochs=1")
            options[key] = typed(f"--tasks {spec}", key, text, defaults.get(key))
        tasks += [CompareTask(**{**asdict(task), "options": {**task.options, **options}})
                  for task in _named_tasks(name, data)]
    for task in tasks:
        task.options = {k: checked(f"--tasks (task {task.name})", k, v, defaults.get(k))
                        for k, v in task.options.items()}
        check_task(task)
    names = [t.name for t in tasks]
    for name in names:
        if names.count(name) > 1 or name == "pretrain" or not re.fullmatch(r"[A-Za-z0-9][\w-]*", name):
            raise SesameError(f"--tasks: task name {name!r} must be unique, not 'pretrain', and use only letters, "
                              "digits, _ and -")
    return tasks


def _named_tasks(spec: str, data: str) -> list[CompareTask]:
    """The built-in task ``spec`` or the tasks of the JSON file ``spec``."""
    if spec in SHORTCUTS:
        files = {k: str(Path(data) / SHORTCUTS[spec][k]) for k in ("train", "dev")}
        return [CompareTask(spec, **{**SHORTCUTS[spec], **files})]
    path = Path(spec)
    if not path.is_file():
        raise SesameError(f"--tasks {spec}: neither a built-in task ({', '.join(SHORTCUTS)}) nor a JSON task "
                          "file; give one of those names or a file like "
                          '{"name": "mine", "train": "train.csv", "dev": "dev.csv"}')
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SesameError(f"--tasks {spec}: not valid JSON ({err})") from None
    names = {f.name for f in fields(CompareTask)} - {"options"}
    tasks = []
    for entry in entries if isinstance(entries, list) else [entries]:
        if not isinstance(entry, dict) or not {"name", "train", "dev"} <= set(entry) or \
                set(entry) - names - set(FINETUNE_OPTIONS):
            raise SesameError(f"--tasks {spec}: each task is an object with name, train, dev and optionally "
                              f"text_column, label_column, pair_column, {', '.join(FINETUNE_OPTIONS)}")
        relative = {k: str(path.parent / entry[k]) for k in ("train", "dev")}
        tasks.append(CompareTask(**{k: v for k, v in {**entry, **relative}.items() if k in names},
                                 options={k: entry[k] for k in FINETUNE_OPTIONS if k in entry}))
    return tasks


def check_task(task: CompareTask) -> None:
    """Read both files now, so a bad column or label fails before any training."""
    hint = f" (task {task.name}; check --data)" if task.name in SHORTCUTS else f" (task {task.name})"
    for path in (task.train, task.dev):
        if not Path(path).is_file():
            raise SesameError(f"--tasks: {path}: no such file{hint}")
    task.check_labels()
