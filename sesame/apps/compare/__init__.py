"""``sesame compare``: pre-training approaches side by side at equal compute, against two baselines.

Every approach (``FAMILY:SIZE[:KEY=VALUE...]``, :mod:`.approaches`) pre-trains on the same corpus for the
same wall time, then fine-tunes with the same settings on each task (:mod:`.tasks`: text or text-pair
classification). Two baselines join every table: the same architecture fine-tuned from random weights with
the approach's tokenizer (one row for all approaches that share architecture, tokenizer and fine-tuning
options), and TF-IDF word and character n-grams with logistic regression (:mod:`.baselines`). An approach
may instead start from an existing run (``from=RUN``: nothing is pre-trained here, its time is read from the
run), and a family without a pre-training objective (``lstm``, ``gru``, ``bilstm``) is a baseline row of its
own, trained from scratch. Each cell (:mod:`.cells`) is a directory under ``out``::

    pretrain/bert-mini/          the pretrained run
    airline/bert-mini/           fine-tuned from it
    airline/scratch-bert-mini/   the same architecture from random weights
    airline/lstm-mini/           a baseline family, from random weights
    airline/tfidf/               the TF-IDF baseline (its record only)

A cell is a resumable stage (:mod:`sesame.pipelines.stages`): finished once its record (settings and
measurements) is written; a finished cell is reused, an unfinished one resumed from its checkpoint, or
started afresh when it has none. The tables are written by :mod:`.report`.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ...data.corpus import resolve_sources
from ...errors import SesameError
from ...outputs import claim_dir
from ...pipelines.stages import cached_stage
from .approaches import Approach, dir_name, parse_approach
from .baselines import C_GRID, tfidf_baseline
from .cells import Start, finetune_cell, origin, pretrain_cell, prior_training, say, scratch_twins
from .report import COLUMNS, pretraining_row, table_row, write_results
from .spec import CompareSpec
from .tasks import CompareTask, resolve_tasks

def _plan(spec: CompareSpec) -> tuple[list[Approach], list[CompareTask]]:
    """The approaches and tasks, every one parsed and checked before any training."""
    plan = [parse_approach(a) for a in spec.approaches]
    slugs = [a.slug for a in plan]
    if not plan or len(set(slugs)) < len(slugs):
        raise SesameError("--approaches: give at least one approach, each once")
    for flag, bad in (("--minutes", spec.minutes <= 0), ("--epochs", spec.epochs <= 0),
                      ("--max-steps", (spec.max_steps or 1) <= 0)):
        if bad:
            raise SesameError(f"{flag}: must be positive")
    resolve_sources(spec.corpus, "--corpus")
    if spec.valid:
        resolve_sources(spec.valid, "--valid")
    return plan, resolve_tasks(spec.tasks, spec.data, spec.fine_tuning)


def compare(spec: CompareSpec) -> list[dict]:
    """Pre-train every approach on ``spec.corpus`` for ``spec.minutes`` of wall time each (``max_steps`` caps the
    steps too, for quick checks), fine-tune each and its from-scratch twin on every task with the same settings,
    add the TF-IDF baseline, and write ``results.{md,csv,json,png}`` in ``spec.out``. Returns the table's rows."""
    plan, tasks = _plan(spec)
    spec.runtime.place()  # a device or precision this machine lacks is refused before anything is written
    out, options = Path(spec.out), spec.fine_tuning
    claim_dir(out, "--out", "compare", fix="compare writes into a new or empty folder, or continues its own")
    no_pretraining = {"seconds": 0, "tokens": 0}
    origins, pre = {}, {}  # per approach: what its cells depend on, its pre-training columns
    pretrained = []  # what each approach pre-trained here bought
    for a in plan:
        if a.pretrains:
            origins[a.spec], reused = pretrain_cell(a, out / "pretrain" / a.slug, spec)
            say("pretrain", a.spec, origins[a.spec], reused)
            pre[a.spec] = origins[a.spec]
            pretrained.append(pretraining_row(a.spec, out / "pretrain" / a.slug, origins[a.spec]))
        elif a.base:
            origins[a.spec], pre[a.spec] = origin(a.base), prior_training(a.base)
        else:
            origins[a.spec], pre[a.spec] = {"scratch": f"scratch:{a.family}:{a.size}"}, no_pretraining
    twins = scratch_twins(plan, out / "pretrain")
    rows = []

    def add(task: CompareTask, name: str, kind: str, slug: str, cell: tuple[dict, bool], pre: dict,
            **extra: object) -> None:
        record, reused = cell
        rows.append(table_row(task, name, kind, slug, record, pre, **extra))
        say(task.name, name, record, reused)

    for task in tasks:
        for a in plan:
            tuned = a.fine_tuning(options, task)
            base = str(a.run_dir(out / "pretrain")) if a.kind == "pretrained" else origins[a.spec]["scratch"]
            start = Start(name=a.spec, base=base, origin=origins[a.spec])
            add(task, a.spec, a.kind, a.slug, finetune_cell(start, out / task.name / a.slug, task, spec, options=tuned),
                pre[a.spec], finetune=tuned, **({"from": a.base} if a.base else {}))
        for name, (a, *others) in twins.items():
            tuned = a.fine_tuning(options, task)
            start = Start(name=name, base=f"scratch:{a.family}:{a.size}", tokenizer=str(a.run_dir(out / "pretrain")),
                          origin={"scratch": name, "tokenizer": origins[a.spec]})
            add(task, name, "scratch", dir_name(name), finetune_cell(
                start, out / task.name / dir_name(name), task, spec, options=tuned),
                no_pretraining, twin_of=[a.spec, *(o.spec for o in others)], finetune=tuned)
        add(task, "tf-idf + logistic regression", "tf-idf", "tfidf", cached_stage(
            out / task.name / "tfidf", {"task": {**asdict(task), "options": {}}, "grid": C_GRID, "seed": spec.seed},
            lambda resume: tfidf_baseline(task, spec.seed)), no_pretraining)
    write_results(out, rows, tasks, spec.command, spec.minutes, options, pretrained=pretrained)
    return rows


__all__ = ["COLUMNS", "CompareSpec", "CompareTask", "compare", "parse_approach", "resolve_tasks", "tfidf_baseline"]
