"""What a task model learns from, in :func:`sesame.pipelines.finetune.train_task_model`: a :class:`Teaching` gives
the training examples, checks the new model against them, wraps the model in what computes its loss and collates
its batches. Fine-tuning's is :class:`GoldAnswers`; distillation's is :class:`sesame.pipelines.distil.Distillation`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ..run import RunConfig
from ..tasks import Task, TaskModel
from ..tokenizer import TextTokenizer


class Teaching(Protocol):
    """The protocol (module docstring)."""

    def examples(self, job: Task, train: str | None) -> tuple[list[dict], list[str]]:
        """The training examples, read by ``job`` (``train``: the --train file, or a --mixture task's), and the label
        vocabulary."""

    def record(self, config: RunConfig, tok: TextTokenizer) -> dict:
        """Check the new task model's configuration and tokenizer against what it learns from, before the run is
        written; returns what config.json's ``setup`` records of it (:meth:`learner` reads it back)."""

    def learner(self, model: TaskModel, run: Path, examples: list[dict]) -> nn.Module:
        """What the trainer trains (called before :meth:`collate`): ``model``, or a module around it that computes
        another loss (the run keeps ``model``'s weights alone; its checkpoints hold the whole learner's)."""

    def collate(self, job: Task, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        """The training batch of ``features`` (the task's features of :meth:`examples`)."""


class GoldAnswers:
    """Fine-tuning: the task's loss on the gold answers of ``--train``, whose labels are the vocabulary."""

    def examples(self, job: Task, train: str | None) -> tuple[list[dict], list[str]]:
        rows = job.read(train)
        return rows, job.labels(rows, train)

    def record(self, config: RunConfig, tok: TextTokenizer) -> dict:
        return {}

    def learner(self, model: TaskModel, run: Path, examples: list[dict]) -> nn.Module:
        return model

    def collate(self, job: Task, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        return job.collate(features, pad_id)
