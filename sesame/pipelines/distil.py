"""``sesame distil``: a :class:`DistilSpec` → a fine-tuned run of the student, trained on a teacher's outputs.

Knowledge distillation as Hinton et al. 2015 define it (§2): a fine-tuned teacher labels a transfer set, here
``--unlabeled`` text (and the text of ``--train`` when given), and the student learns its outputs, softened by
a temperature, or their logits (:mod:`sesame.objectives.distillation`), optionally plus α times its own task loss
on ``--train``'s gold labels (Hinton's weighted average of the two objectives; the soft term is scaled by T²).

Each model reads the raw text with its own tokenizer, so a teacher and a student of any two families (a MiniLM
and an LSTM, say) pair up: the soft labels are per example (the "different tokenizers" case Turc et al. 2019 and
TextBrewer users meet). The teacher's outputs are computed once, before the first step, and kept in the run
directory (:data:`OUTPUTS`, :data:`RECORD`); a resumed run reads them back and never loads the teacher.

Everything else is fine-tuning's (:func:`sesame.pipelines.finetune.train_task_model`): the student's starting
point, the recipe, budgets and the dev evaluation that keeps the best epoch; the run is a fine-tuned run that
``sesame evaluate`` and ``predict`` load. Classify, pair and regress teachers (``Task.distils``: one output row per
example); the task and its options default to the teacher's.
"""
from __future__ import annotations

import time
from itertools import groupby
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ..errors import SesameError
from ..objectives.distillation import LOSSES
from ..resume import resumed_finetuning
from ..specs import DistilSpec
from ..tasks import Task, TaskModel
from ..train.checkpoint import load_weights, read_json, save_weights, write_json
from ..train.trainer import world
from .evaluate import Predictor
from .finetune import train_task_model

OUTPUTS = "teacher_outputs.safetensors"  # the teacher's outputs, one row per training example ("outputs")
RECORD = "teacher_outputs.json"  # what they are: the teacher, the number of examples and of columns


def distil(spec: DistilSpec) -> dict:
    """Distil as ``spec`` says (module docstring); returns the kept student's dev metrics with its trainable and total
    parameter counts."""
    started = time.time()
    if spec.resume:
        spec = resumed_finetuning(spec)  # as the run was made (its task, options, loss), with the budget given now
    teacher = Teacher(spec)
    if not spec.resume:
        spec = teacher.taught(spec)
    return train_task_model(spec, Distillation(spec, teacher), started=started)


class Teacher:
    """The model ``--teacher`` names (a fine-tuned run or a transformers sequence classifier), loaded when first
    asked for: a resumed run whose teacher outputs are cached never loads it."""

    def __init__(self, spec: DistilSpec):
        self.given, self.runtime = spec.teacher, spec.runtime
        self._predictor: Predictor | None = None

    @property
    def predictor(self) -> Predictor:
        if self._predictor is None:
            predictor = Predictor(self.given, runtime=self.runtime, flag="--teacher")
            if not predictor.task.distils:
                raise SesameError(f"--teacher {self.given}: a {predictor.config.task} model; sesame distil learns one "
                                  "output row per example, from classify, pair or regress teachers")
            self._predictor = predictor
        return self._predictor

    def taught(self, spec: DistilSpec) -> DistilSpec:
        """``spec`` with the teacher's task, its task options under the ones given (the teacher's columns are the
        default), and the loss: ``kl`` for classifiers, ``mse`` for a regression's single score, unless given."""
        config, task = self.predictor.config, self.predictor.task
        if spec.task is not None and spec.task != config.task:
            raise SesameError(f"--task {spec.task}: the teacher is a {config.task} model, and the student learns its "
                              "task; drop --task")
        if spec.loss == "kl" and not task.has_labels:
            raise SesameError(f"--loss kl: a {task.name} teacher gives one score per example, not a distribution; use "
                              "--loss mse")
        given = {k: v for k, v in spec.task_options.items() if v is not None}
        return replace(spec, task=config.task, task_options={**config.task_options, **given},
                       loss=spec.loss or ("kl" if task.has_labels else "mse"))

    def outputs(self, examples: list[dict]) -> torch.Tensor:
        """The teacher's outputs for ``examples``, one row each, read a run of examples of the same fields at a time
        (the unlabeled ones, then those with gold labels: a task batches examples of one kind); the teacher is let go
        afterwards."""
        runs = [list(run) for _, run in groupby(examples, key=lambda row: sorted(row))]
        outputs = torch.cat([self.predictor.outputs(self.predictor.features(run)) for run in runs])
        self._predictor = None
        return outputs


class Distillation:
    """What a student learns from (:class:`sesame.pipelines.finetune.Teaching`): the teacher's outputs on the
    unlabeled examples and on ``--train``'s, and, with ``alpha``, ``--train``'s gold labels."""

    def __init__(self, spec: DistilSpec, teacher: Teacher):
        self.spec, self.teacher = spec, teacher
        self.outputs: torch.Tensor | None = None

    def examples(self, job: Task, train: str | None) -> tuple[list[dict], list[str]]:
        """The unlabeled examples of every ``--unlabeled`` file, then the labeled ones of ``train`` (``--train``); the
        teacher's labels (the run's own when resumed)."""
        labels: list[str] = []
        if job.has_labels:
            resumed = self.spec.resume
            labels = read_json(Path(self.spec.out) / "labels.json") if resumed else self.teacher.predictor.labels
        rows = [row for path in self.spec.unlabeled for row in job.read(path, labeled=False)]
        if train is not None:
            gold = job.read(train)
            job.check(gold, labels, train)
            rows += gold
        return rows, labels

    def learner(self, model: TaskModel, run: Path, examples: list[dict]) -> nn.Module:
        self.outputs = teacher_outputs(run, self.teacher, examples)
        return Distilled(model, loss=self.spec.loss, temperature=self.spec.temperature, alpha=self.spec.alpha)

    def collate(self, job: Task, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        """The task's batch with the teacher's rows (``teacher``), which rows have gold labels (``gold``; the others
        get a stand-in target) and the terms of each loss (``counts``)."""
        gold = ["target" in f for f in features]
        stand_in = 0 if job.has_labels else 0.0
        batch = job.collate([f if "target" in f else {**f, "target": stand_in} for f in features], pad_id)
        batch["teacher"] = self.outputs[[f["example"] for f in features]]
        batch["gold"] = torch.tensor(gold)
        batch["counts"] = {"distil": len(features), "gold": sum(gold)}
        return batch


class Distilled(nn.Module):
    """A student task model trained on a teacher's outputs (``batch["teacher"]``) by the ``loss`` of
    :data:`sesame.objectives.distillation.LOSSES`, plus ``alpha`` × its own task loss on the rows with gold labels
    (``batch["gold"]``) when ``alpha`` is not 0. Returns the summed parts (``distil``, ``gold``), which the
    trainer divides by their counts and weighs: Hinton et al. 2015's weighted average, the soft part scaled by T²."""

    def __init__(self, student: TaskModel, *, loss: str, temperature: float, alpha: float):
        super().__init__()
        self.student, self.criterion, self.temperature = student, LOSSES[loss], temperature
        self.part_names = ("distil", "gold") if alpha else ("distil",)
        self.part_weights = {"distil": 1.0, "gold": alpha}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs = self.student.outputs(batch)
        parts = {"distil": self.criterion(outputs, batch["teacher"], temperature=self.temperature)}
        if "gold" in self.part_names:
            gold = batch["gold"]
            parts["gold"] = self.student.loss(outputs[gold], batch["targets"][gold])
        return parts


def teacher_outputs(run: Path, teacher: Teacher, examples: list[dict]) -> torch.Tensor:
    """The teacher's outputs for ``examples`` (one row each): read from the run directory when a run made them
    before (:data:`OUTPUTS`, :data:`RECORD`), else computed (under torchrun each process scores its share) and
    written there by rank 0."""
    if (run / RECORD).is_file():
        outputs = load_weights(run / OUTPUTS)["outputs"]
        if len(outputs) != len(examples):
            raise SesameError(f"{run / OUTPUTS}: the teacher's outputs for {len(outputs)} examples, but --unlabeled "
                              f"and --train hold {len(examples)} now; restore the files the run was made of, or distil "
                              "into a new --out")
        return outputs
    outputs = teacher.outputs(examples)
    if world()[0] == 0:
        save_weights(run / OUTPUTS, {"outputs": outputs})
        write_json(run / RECORD, {"teacher": str(Path(teacher.given).resolve()), "examples": len(outputs),
                                  "columns": outputs.shape[1]})
    return outputs
