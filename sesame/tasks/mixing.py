"""Multi-task mixing (T5, Raffel et al. 2020, §3.5.2): how often each task's examples are drawn when several
text-to-text tasks train one model (``sesame finetune --task text2text --mixture FILE``, docs/text2text.md).

Examples-proportional mixing with an artificial data set size limit K and a temperature T: task m, with e_m
examples, is drawn at the rate

    r_m = min(e_m, K)^(1/T) / Σ_n min(e_n, K)^(1/T).

T = 1 is examples-proportional mixing capped at K (the cap keeps a huge task from crowding out the others);
larger T moves the rates towards equal mixing, T → ∞ gives it exactly. K's default is 2^19, the limit T5 pre-trains
its multi-task mixture with (§3.5.3; Table 11 tries 2^16 … 2^21), and T's is 1.

The rates and the draws are :mod:`sesame.data.mixing`'s, which pre-training's corpora share (``sesame pretrain
--mixing-temperature``). Every draw is a function of (seed, draw) alone
(:func:`~sesame.data.mixing.mixture_example`), so a resumed run draws as the uninterrupted one did. Deviation from
T5: the example a draw takes from its task is uniform over the task's examples (with replacement), where T5 reads
each task's shuffled data set in order, repeated; a draw then needs no history of earlier draws.

A mixture file names the tasks (:func:`read_mixture`): each its train and dev files and how its rows become text
(:data:`READING`); what one model and one decoding share (:data:`SHARED`) is given once, by ``--task-option``. Dev
metrics are reported per task (``NAME_bleu``, ``NAME_accuracy``, ...), and ``mean`` (:func:`mixture_scores`), the
default that picks the kept weights, averages each task's own selection metric on a 0–100 scale, as T5 averages
GLUE's tasks.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Mapping

from ..data.labeled import read_text
from ..errors import SesameError
from .base import make_task

MIXING_CAP = 2 ** 19  # K: T5's artificial data set size limit (§3.5.3)
SHARED = ("max_target_length", "bos", "beams", "length_penalty")  # one model's framing and decoding: --task-option
READING = ("cast", "prefix", "source_column", "pair_column", "target_column", "label_words", "languages")  # per task
FILES = ("train", "dev")
MEAN = "mean"  # the mixture's selection metric
PERCENT = frozenset({"bleu"})  # metrics already on a 0–100 scale; the others are fractions (or correlations)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
EXAMPLE = '{"mt": {"train": "train.en", "dev": "val.en", "languages": "en-de", "prefix": "translate English to ' \
          'German:"}, "sst2": {"train": "sst2/train.tsv", "dev": "sst2/dev.tsv", "cast": "classify", "prefix": "sst2"}}'


def check_spec(*, mixture: str | None, task: str, cap: int, temperature: float, task_options: dict) -> None:
    """A fine-tuning spec's mixing options: ``--mixing-cap`` and ``--mixing-temperature`` only with a ``--mixture``
    (whose ``--task`` is text2text, T above 0), and its ``--task-option`` only the :data:`SHARED` ones."""
    if mixture is None:
        for flag, value, default in (("--mixing-cap", cap, MIXING_CAP), ("--mixing-temperature", temperature, 1.0)):
            if value != default:
                raise SesameError(f"{flag}: sets the rates of a --mixture's tasks; give --mixture FILE or leave it out")
        return
    if task != "text2text":
        raise SesameError(f"--mixture: mixes text2text tasks (T5); give --task text2text, not {task}")
    if not temperature > 0 or not math.isfinite(temperature):
        raise SesameError(f"--mixing-temperature {temperature}: a number above 0 (1: examples-proportional mixing)")
    reading = sorted(k for k, v in task_options.items() if v is not None and k not in SHARED)
    if reading:
        raise SesameError(f"--task-option {reading[0]}: with --mixture, how each task is read goes in its entry of "
                          f"{mixture}; --task-option gives what its tasks share ({', '.join(SHARED)})")


def read_mixture(path: str) -> dict[str, dict]:
    """The tasks of a mixture file, a JSON object ``{NAME: {"train": FILE, "dev": FILE, READING options}}`` of two
    or more tasks (paths relative to the file's folder), as ``{NAME: {"train": path, "dev": path, "options": {...}}}``
    with the paths resolved; an error names the file, the task and the fix, also where a task's options make no
    text2text task (a ``cast`` of none of :data:`~sesame.tasks.casts.CASTS`, ...)."""
    file = Path(path)
    try:
        data = json.loads(read_text(file, "a mixture file (JSON)"))
    except json.JSONDecodeError as err:
        raise SesameError(f"{path}: not valid JSON ({err}); a mixture file is a JSON object of tasks, e.g. "
                          f"{EXAMPLE}") from None
    if not isinstance(data, dict) or len(data) < 2:
        raise SesameError(f"{path}: a mixture is a JSON object of two or more tasks, e.g. {EXAMPLE}")
    tasks = {}
    for name, entry in data.items():
        where = f"{path}: task {name!r}"
        if not NAME.fullmatch(name):
            raise SesameError(f"{where}: name a task with letters, digits, '_', '.' or '-' (its dev metrics are "
                              "NAME_bleu, ...)")
        if not isinstance(entry, dict) or any(not isinstance(entry.get(key), str) for key in FILES):
            raise SesameError(f'{where}: give a JSON object with its "train" and "dev" files, e.g. {EXAMPLE}')
        other = sorted(set(entry) - {*FILES, *READING})
        if other:
            raise SesameError(f"{where}: {other[0]} is no option of one task (it takes train, dev, "
                              f"{', '.join(READING)}); the tasks share {', '.join(SHARED)}: give those as "
                              "--task-option")
        options = {key: value for key, value in entry.items() if key not in FILES}
        make_task("text2text", options, where=where)
        tasks[name] = {**{key: str((file.parent / entry[key]).resolve()) for key in FILES}, "options": options}
    return tasks


def mixture_metrics(metrics: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The dev metrics that may pick a mixture's kept weights: ``mean`` first, then each task's (``NAME_METRIC``)."""
    return (MEAN, *(f"{name}_{metric}" for name, names in metrics.items() for metric in names))


def mixture_scores(scores: Mapping[str, dict], selects: Mapping[str, str]) -> dict:
    """Each task's dev metrics as ``NAME_METRIC`` (numbers only), and ``mean``: the mean over tasks of each task's
    selection metric ``selects[name]`` on a 0–100 scale (fractions and correlations times 100; BLEU as it is)."""
    out = {f"{name}_{key}": value for name, report in scores.items() for key, value in report.items()
           if isinstance(value, (int, float))}
    scaled = [scores[name][metric] * (1 if metric in PERCENT else 100) for name, metric in selects.items()]
    return {MEAN: math.fsum(scaled) / len(scaled), **out}
