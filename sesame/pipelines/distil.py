"""``sesame distil``: a :class:`DistilSpec` → a fine-tuned run of the student, trained on a teacher's outputs.

Knowledge distillation as Hinton et al. 2015 define it (§2): a fine-tuned teacher labels a transfer set, here
``--unlabeled`` text (and the text of ``--train`` when given), and the student learns its outputs, softened by
a temperature, or their logits (:mod:`sesame.objectives.distillation`), optionally plus α times its own task loss
on ``--train``'s gold labels (Hinton's weighted average of the two objectives; the soft term is scaled by T²).

Each model reads the raw text with its own tokenizer, so a teacher and a student of any two families (a MiniLM
and an LSTM, say) pair up: the soft labels are per example (the "different tokenizers" case Turc et al. 2019 and
TextBrewer users meet). The teacher's outputs are computed once, before the first step, and kept in the run
directory (:data:`OUTPUTS`, :data:`RECORD`); a resumed run reads them back and never loads the teacher. With
``--teacher-outputs RUN`` they are copied from an earlier distil run instead of scored again, when its record shows
them to be the same teacher's on the same transfer set (:meth:`Teacher.record`, :meth:`Teacher.reuse`).

With ``--hidden-weight`` the student also learns the teacher's intermediate layers (TinyBERT's hidden-state loss,
:class:`sesame.objectives.distillation.LayerMatching`): those need the teacher at every step (its states are per
token, too many to keep), read the student's batch (so the student must read the teacher's token ids, checked
before the run is written), and the layer map is recorded in config.json's ``setup`` (``layer_map``), which
``--resume`` holds the command to. Deviation: the student's layers come from a second pass of its backbone beside
the task model's (the task models give their outputs alone), so dropout draws differ between the two.

Everything else is fine-tuning's (:func:`sesame.pipelines.finetune.train_task_model`): the student's starting
point, the recipe, budgets and the dev evaluation that keeps the best epoch; the run is a fine-tuned run that
``sesame evaluate`` and ``predict`` load. Classify, pair and regress teachers (``Task.distils``: one output row per
example); the task and its options default to the teacher's.
"""
from __future__ import annotations

import hashlib
import json
import time
from itertools import groupby
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ..errors import SesameError
from ..models import position_limit
from ..objectives.distillation import LOSSES, LayerMatching, uniform_layer_map
from ..resume import resolved, resumed_finetuning
from ..run import RunConfig, read_config
from ..specs import DistilSpec
from ..tasks import Task, TaskModel
from ..tokenizer import TextTokenizer
from ..train.checkpoint import load_weights, read_json, save_weights, write_json
from ..train.trainer import world
from .evaluate import Predictor
from .finetune import train_task_model

OUTPUTS = "teacher_outputs.safetensors"  # the teacher's outputs, one row per training example ("outputs")
RECORD = "teacher_outputs.json"  # what they are: Teacher.record's, and the number of columns


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
    asked for: a resumed run whose teacher outputs are cached never loads it (unless it matches layers). Its outputs
    are an earlier run's when :meth:`reuse` took them (``--teacher-outputs``)."""

    def __init__(self, spec: DistilSpec):
        self.given, self.runtime, self.earlier = spec.teacher, spec.runtime, spec.teacher_outputs
        self._predictor: Predictor | None = None
        self._reused: torch.Tensor | None = None

    @property
    def predictor(self) -> Predictor:
        if self._predictor is None:
            predictor = Predictor(self.given, runtime=self.runtime, flag="--teacher")
            if not predictor.task.distils:
                raise SesameError(f"--teacher {self.given}: a {predictor.config.finetuned.task} model; sesame distil "
                                  "learns one output row per example, from classify, pair or regress teachers")
            self._predictor = predictor
        return self._predictor

    def taught(self, spec: DistilSpec) -> DistilSpec:
        """``spec`` with the teacher's task, its task options under the ones given (the teacher's columns are the
        default), and the loss: ``kl`` for classifiers, ``mse`` for a regression's single score, unless given."""
        tuned, task = self.predictor.config.finetuned, self.predictor.task
        if spec.task is not None and spec.task != tuned.task:
            raise SesameError(f"--task {spec.task}: the teacher is a {tuned.task} model, and the student learns its "
                              "task; drop --task")
        if spec.loss == "kl" and not task.has_labels:
            raise SesameError(f"--loss kl: a {task.name} teacher gives one score per example, not a distribution; use "
                              "--loss mse")
        given = {k: v for k, v in spec.task_options.items() if v is not None}
        return replace(spec, task=tuned.task, task_options={**tuned.task_options, **given},
                       loss=spec.loss or ("kl" if task.has_labels else "mse"))

    def outputs(self, examples: list[dict]) -> torch.Tensor:
        """The teacher's outputs for ``examples``, one row each: those :meth:`reuse` took, else computed, a run of
        examples of the same fields at a time (the unlabeled ones, then those with gold labels: a task batches examples
        of one kind); the teacher is let go afterwards."""
        outputs = self._reused
        if outputs is None:
            runs = [list(run) for _, run in groupby(examples, key=lambda row: sorted(row))]
            outputs = torch.cat([self.predictor.outputs(self.predictor.features(run)) for run in runs])
        self._predictor = self._reused = None
        return outputs

    def record(self, examples: list[dict]) -> dict:
        """What its outputs on ``examples`` are a function of, as :data:`RECORD` keeps it: the teacher (its path,
        resolved), the examples (their number and :func:`fingerprint`) and the precision it runs in (bf16 rounds them
        otherwise than fp32). Its max length and task options are its own, and the student's tokenizer plays no part
        (the teacher reads the raw text with its own). Deviation: the device is left out, the machine's choice as for
        --resume: one teacher's fp32 outputs on two devices differ in rounding alone."""
        return {"teacher": resolved(self.given), "examples": len(examples),
                "transfer_set": fingerprint(examples), "precision": self.predictor.placement.precision}

    def reuse(self, examples: list[dict]) -> None:
        """Take the outputs for ``examples`` of the earlier run ``--teacher-outputs`` names, whose record must equal
        this run's (:meth:`record`); else a :class:`SesameError` saying what differs (checked before the run is
        written)."""
        where = Path(self.earlier) / RECORD
        if not where.is_file():
            raise SesameError(f"--teacher-outputs {self.earlier}: no {RECORD} there; name the --out of an earlier "
                              "sesame distil run, or drop --teacher-outputs to score the transfer set")
        theirs, ours = read_json(where), self.record(examples)
        if "transfer_set" not in theirs:
            raise SesameError(f"--teacher-outputs {self.earlier}: {where} has no fingerprint of its transfer set (a "
                              "run of an older sesame), so its outputs cannot be shown to be this run's; drop "
                              "--teacher-outputs to score the transfer set again")
        differ = [f"{key} {theirs.get(key)} (this run: {value})" if key != "transfer_set" else
                  "transfer_set (the texts of --unlabeled, then --train, in order)"
                  for key, value in ours.items() if theirs.get(key) != value]
        if differ:
            raise SesameError(f"--teacher-outputs {self.earlier}: {where} differs from this run in "
                              f"{'; '.join(differ)}, so its outputs are not this teacher's on these examples; drop "
                              "--teacher-outputs to score the transfer set again")
        outputs = load_weights(Path(self.earlier) / OUTPUTS)["outputs"]
        if len(outputs) != len(examples):
            raise SesameError(f"--teacher-outputs {self.earlier}: {OUTPUTS} holds {len(outputs)} rows, but {RECORD} "
                              f"{len(examples)} examples; drop --teacher-outputs to score the transfer set again")
        self._reused = outputs


class Distillation:
    """What a student learns from (:class:`sesame.pipelines.teaching.Teaching`): the teacher's outputs on the
    unlabeled examples and on ``--train``'s, and, with ``alpha``, ``--train``'s gold labels."""

    def __init__(self, spec: DistilSpec, teacher: Teacher):
        self.spec, self.teacher = spec, teacher
        self.outputs: torch.Tensor | None = None
        self.read: tuple[Task, list[dict], list[str]] | None = None  # the task, examples and labels of examples()

    def examples(self, job: Task, train: str | None) -> tuple[list[dict], list[str]]:
        """The unlabeled examples of every ``--unlabeled`` file, then the labeled ones of ``train`` (``--train``); the
        teacher's labels (the run's own when resumed). With ``--teacher-outputs``, unless the run keeps its outputs
        already, the teacher reuses that run's for them (:meth:`Teacher.reuse`, before the run is written)."""
        labels: list[str] = []
        if job.has_labels:
            resumed = self.spec.resume
            labels = read_json(Path(self.spec.out) / "labels.json") if resumed else self.teacher.predictor.labels
        rows = [row for path in self.spec.unlabeled for row in job.read(path, labeled=False)]
        if train is not None:
            gold = job.read(train)
            job.check(gold, labels, train)
            rows += gold
        self.read = job, rows, labels
        if self.spec.teacher_outputs is not None and not (Path(self.spec.out) / RECORD).is_file():
            self.teacher.reuse(rows)
        return rows, labels

    def record(self, config: RunConfig, tok: TextTokenizer) -> dict:
        """With --hidden-weight, the layer map: --layer-map's, or the uniform one over the student's and the teacher's
        layers (:func:`uniform_layer_map`); refused unless both give every layer's states at the student's lengths
        and the student reads the teacher's token ids (TinyBERT compares states position by position)."""
        if not self.spec.hidden_weight:
            return {}
        teacher = self.teacher.predictor
        for flag, model in (("--student", config.model), ("--teacher", teacher.config.model)):
            if model.arch == "encoder_decoder":
                raise SesameError(f"--hidden-weight: {flag} is an encoder-decoder (T5, BART), whose layers form two "
                                  "stacks; match the layers of an encoder, a decoder or a recurrent model, or give "
                                  "--hidden-weight 0")
        positions = position_limit(teacher.config.model)
        if positions is not None and self.spec.max_length > positions:
            raise SesameError(f"--max-length {self.spec.max_length}: the teacher reads the student's inputs for "
                              f"--hidden-weight, and it has {positions} positions; give --max-length {positions}")
        job, rows, labels = self.read
        ours = job.features(rows, tok, self.spec.max_length, labels, config.causal)
        theirs = teacher.features(rows, max_length=self.spec.max_length)
        if [f["ids"] for f in ours] != [f["ids"] for f in theirs]:
            raise SesameError(f"--hidden-weight: states are matched token by token, but --student {self.spec.base} "
                              f"reads other token ids than --teacher {self.spec.teacher}; give a scratch student the "
                              f"teacher's tokenizer (--tokenizer {self.spec.teacher}), or a student that has it")
        layers = config.model.layers, teacher.config.model.layers
        pairs = self.spec.layer_pairs() or uniform_layer_map(*layers)
        wrong = [f"{s}:{t}" for s, t in pairs if s > layers[0] or t > layers[1]]
        if wrong:
            raise SesameError(f"--layer-map {' '.join(wrong)}: the student's layers are 0 to {layers[0]}, the "
                              f"teacher's 0 to {layers[1]} (0: the embeddings)")
        return {"layer_map": [f"{s}:{t}" for s, t in pairs]}

    def learner(self, model: TaskModel, run: Path, examples: list[dict]) -> nn.Module:
        matching = self.layer_matching(model, run)  # first: the teacher is let go once its outputs are kept
        self.outputs = teacher_outputs(run, self.teacher, examples)
        return Distilled(model, loss=self.spec.loss, temperature=self.spec.temperature, alpha=self.spec.alpha,
                         matching=matching)

    def layer_matching(self, student: TaskModel, run: Path) -> LayerMatching | None:
        """The loss of the layer map the run recorded (None: none), with its maps sized by the two backbones."""
        recorded = read_config(run, "--out").setup.get("layer_map")
        if not recorded:
            return None
        teacher = self.teacher.predictor.model.backbone.eval().requires_grad_(False)
        return LayerMatching(replace(self.spec, layer_map=recorded).layer_pairs(), layer_widths(student.backbone),
                             layer_widths(teacher), teacher=lambda batch: teacher_states(teacher, batch),
                             weight=self.spec.hidden_weight)

    def collate(self, job: Task, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        """The task's batch with the teacher's rows (``teacher``), which rows have gold labels (``gold``; the others
        get a stand-in target) and the terms of each loss (``counts``)."""
        gold = ["target" in f for f in features]
        stand_in = 0 if job.has_labels else 0.0
        batch = job.collate([f if "target" in f else {**f, "target": stand_in} for f in features], pad_id)
        batch["teacher"] = self.outputs[[f["example"] for f in features]]
        batch["gold"] = torch.tensor(gold)
        batch["counts"] = {"distil": len(features), "gold": sum(gold), "hidden": int(batch["padding"].sum())}
        return batch


class Distilled(nn.Module):
    """A student task model trained on a teacher's outputs (``batch["teacher"]``) by the ``loss`` of
    :data:`sesame.objectives.distillation.LOSSES`, plus ``alpha`` × its own task loss on the rows with gold labels
    (``batch["gold"]``) when ``alpha`` is not 0, plus ``matching.weight`` × the loss of its intermediate layers
    with ``matching``. Returns the summed parts (``distil``, ``gold``, ``hidden``), which the trainer divides by their
    counts and weighs: Hinton et al. 2015's weighted average, the soft part scaled by T²."""

    def __init__(self, student: TaskModel, *, loss: str, temperature: float, alpha: float,
                 matching: LayerMatching | None = None):
        super().__init__()
        self.student, self.criterion, self.temperature, self.matching = student, LOSSES[loss], temperature, matching
        self.part_names = ("distil", *(("gold",) if alpha else ()), *(("hidden",) if matching is not None else ()))
        self.part_weights = {"distil": 1.0, "gold": alpha, "hidden": matching.weight if matching is not None else 0.0}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs = self.student.outputs(batch)
        parts = {"distil": self.criterion(outputs, batch["teacher"], temperature=self.temperature)}
        if "gold" in self.part_names:
            gold = batch["gold"]
            parts["gold"] = self.student.loss(outputs[gold], batch["targets"][gold])
        if self.matching is not None:
            layers = self.student.backbone(batch["ids"], batch.get("types"), padding=batch["padding"], all_layers=True)
            parts["hidden"] = self.matching(layers, batch)
        return parts


def layer_widths(backbone: nn.Module) -> list[int]:
    """The width of each layer's states of ``backbone`` (0: the embeddings), read off one token put through it."""
    ids = torch.zeros(1, 1, dtype=torch.long, device=next(backbone.parameters()).device)
    training = backbone.training
    with torch.no_grad():
        states = backbone.eval()(ids, padding=torch.ones_like(ids, dtype=torch.bool), all_layers=True)
    backbone.train(training)
    return [state.shape[-1] for state in states]


def teacher_states(teacher: nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Every layer's states of the frozen ``teacher`` backbone for the student's ``batch`` (the same token ids); the
    teacher follows the batch to its device (once: then it is there)."""
    with torch.no_grad():
        return teacher.to(batch["ids"].device)(batch["ids"], batch.get("types"), padding=batch["padding"],
                                               all_layers=True)


def teacher_outputs(run: Path, teacher: Teacher, examples: list[dict]) -> torch.Tensor:
    """The teacher's outputs for ``examples`` (one row each): read from the run directory when a run made them
    before (:data:`OUTPUTS`, :data:`RECORD`), else the teacher's (computed, under torchrun each process scoring its
    share, or reused from ``--teacher-outputs``) and written there with their record by rank 0."""
    if (run / RECORD).is_file():
        outputs = load_weights(run / OUTPUTS)["outputs"]
        if len(outputs) != len(examples):
            raise SesameError(f"{run / OUTPUTS}: the teacher's outputs for {len(outputs)} examples, but --unlabeled "
                              f"and --train hold {len(examples)} now; restore the files the run was made of, or distil "
                              "into a new --out")
        return outputs
    record = teacher.record(examples)  # before outputs() lets the teacher go
    outputs = teacher.outputs(examples)
    if world()[0] == 0:
        save_weights(run / OUTPUTS, {"outputs": outputs})
        write_json(run / RECORD, {**record, "columns": outputs.shape[1]})
    return outputs


def fingerprint(examples: list[dict]) -> str:
    """The sha256 of what the teacher reads of ``examples``, in order: each one's fields as canonical JSON but its line
    number and gold label, and whether it has a gold label (:meth:`Teacher.outputs` batches the two kinds apart)."""
    digest = hashlib.sha256()
    for row in examples:
        read = {key: value for key, value in row.items() if key not in ("line", "label")}
        digest.update(json.dumps([read, "label" in row], sort_keys=True).encode() + b"\n")
    return digest.hexdigest()
