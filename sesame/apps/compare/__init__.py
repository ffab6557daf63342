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

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from ...data.corpus import resolve_sources
from ...errors import SesameError
from ...options import option
from ...outputs import claim_dir
from ...pipelines.stages import cached_stage
from ...runtime import Runtime
from .approaches import Approach, dir_name, parse_approach
from .baselines import C_GRID, tfidf_baseline
from .cells import Start, finetune_cell, origin, pretrain_cell, prior_training, say, scratch_twins
from .report import COLUMNS, pretraining_row, table_row, write_results
from .tasks import FINETUNE_OPTIONS, SHORTCUTS, CompareTask, default_data, resolve_tasks

ROW_DEFAULT = "fine-tuning {} of every row whose family, task or approach sets none"


@dataclass(kw_only=True)
class CompareSpec:
    """``sesame compare``: the approaches, the shared corpus and budget, the tasks, and the fine-tuning settings
    of rows that set none of their own (3 epochs at lr 2e-4 suit the small Transformers; a family's defaults,
    ``Family.finetune``, come next, then the task's, then the approach's ``finetune.KEY=VALUE`` items)."""
    approaches: list[str] = option(metavar="FAMILY:SIZE[:KEY=VALUE...]",
                                   help="e.g. bert:mini roberta:mini:accumulate=4 lstm:mini cove:mini:from=runs/cove "
                                        "bert:mini:from=minilm:finetune.lr=5e-5; KEY: a pretrain option or objective "
                                        "option, from (a run to fine-tune instead of pre-training) or finetune.KEY (a "
                                        "finetune option)")
    corpus: list[str] = option(help="pre-training text files or folders, shared by all")
    valid: list[str] | None = option(None, help="validation text (default: the corpus's last 1%%)")
    tasks: list[str] = option(metavar="TASK[:KEY=VALUE...]",
                              help=f"built-in ({', '.join(SHORTCUTS)}, under --data) or JSON files "
                                   '{"name", "train", "dev", "text_column", "label_column", "pair_column"}; KEY=VALUE: '
                                   f"this task's own {', '.join(FINETUNE_OPTIONS)}, e.g. sst2:epochs=1")
    data: str = option(factory=default_data, help="where the built-in tasks live (default: $SESAME_DATA, else "
                                                  "../shared/data)")
    out: str = option(help="directory of the cells and results; rerun to resume")
    minutes: float = option(help="pre-training wall-time budget per approach")
    max_steps: int | None = option(None, help="also stop pre-training at this many steps (quick checks)")
    epochs: int = option(3, help=ROW_DEFAULT.format("epochs"))
    lr: float = option(2e-4, help=ROW_DEFAULT.format("learning rate"))
    batch_size: int = option(32, help=ROW_DEFAULT.format("batch size"))
    max_length: int = option(128, help=ROW_DEFAULT.format("tokens per text"))
    seed: int = option(0, help="seed of every pre-training and fine-tuning")
    runtime: Runtime = option(factory=Runtime, cli=False, help="every cell's device and precision (sesame.runtime; "
                                                               "an approach's precision=… or finetune.precision=… "
                                                               "overrides the precision)")
    progress: bool = option(True, cli=False, help="show progress bars")

    @property
    def fine_tuning(self) -> dict:
        """The command's fine-tuning options, the first of a row's (:meth:`Approach.fine_tuning`)."""
        return {"epochs": self.epochs, "lr": self.lr, "batch_size": self.batch_size, "max_length": self.max_length,
                "seed": self.seed}

    @property
    def command(self) -> str:
        """The command line that makes this comparison, written atop results.md."""
        return shlex.join(["sesame", "compare", "--approaches", *self.approaches, "--corpus", *self.corpus,
                           *(["--valid", *self.valid] if self.valid else []), "--tasks", *self.tasks, "--data",
                           self.data, "--out", str(self.out), "--minutes", f"{self.minutes:g}",
                           *(["--max-steps", str(self.max_steps)] if self.max_steps else []),
                           "--epochs", str(self.epochs), "--lr", f"{self.lr:g}", "--batch-size", str(self.batch_size),
                           "--max-length", str(self.max_length), "--seed", str(self.seed),
                           *(["--precision", self.runtime.precision] if self.runtime.precision else [])])


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
