"""The Python API: one keyword call per stage, each building the stage's spec and running its pipeline.

``pretrain`` and ``finetune`` take the spec's fields (:class:`sesame.specs.PretrainSpec`,
:class:`sesame.specs.FinetuneSpec`), the recipe's (:class:`sesame.train.recipes.Recipe`) and
TrainConfig's (``lr``, ``max_steps``, ...) as keywords. A misspelt keyword is a TypeError naming the known ones, as
with any function. (``sesame.prompt_eval`` is an application's: :func:`sesame.apps.prompting.prompt_eval_of`.)
"""
from __future__ import annotations

from typing import Any, Sequence

from . import pipelines
from .pipelines import Predictor, evaluate, load, predict
from .specs import DistilSpec, FinetuneSpec, PretrainSpec


def pretrain(corpus: Sequence[str] | str, out: str, **options: Any) -> dict:
    """Pre-train on ``corpus`` (text files, folders, JSONL, or a shard directory) into run ``out``; e.g.
    ``pretrain(["wiki.txt"], "runs/bert", family="bert", size="mini", max_minutes=20)``. Returns the last
    validation metrics."""
    return pipelines.pretrain(PretrainSpec.of(corpus, out, **options))


def finetune(base: str, train: str | None, dev: str | None, out: str, **options: Any) -> dict:
    """Fine-tune ``base`` (a run, a transformers directory, ``minilm`` or ``scratch:FAMILY:SIZE``) on the labeled
    ``train`` file, keeping the best epoch on ``dev``, into run ``out``; e.g. ``finetune("runs/bert", "train.csv",
    "dev.csv", "runs/clf", text_column="text", label_column="label", lr=1e-4)``; or, with ``train`` and ``dev`` None,
    on a mixture of text2text tasks (``task="text2text", mixture="mix.json"``, docs/text2text.md). Returns the kept
    weights' dev metrics."""
    return pipelines.finetune(FinetuneSpec.of(base, train, dev, out, **options))


def distil(teacher: str, student: str, unlabeled: Sequence[str] | str, dev: str, out: str, *, train: str | None = None,
           **options: Any) -> dict:
    """Distil the fine-tuned ``teacher`` into ``student`` (a run, a transformers directory or ``scratch:FAMILY:SIZE``)
    on the ``unlabeled`` files' text (and ``train``'s, whose gold labels count with ``alpha``), keeping the best epoch
    on ``dev``, into run ``out``; e.g. ``distil("runs/teacher", "scratch:bert:mini", ["train.csv"], "dev.csv",
    "runs/student", temperature=2.0)``. Takes :func:`finetune`'s keywords and :class:`sesame.specs.DistilSpec`'s
    (``loss``, ``temperature``, ``alpha``, ``hidden_weight``, ``layer_map``, ``teacher_outputs``). Returns the kept
    weights' dev metrics."""
    return pipelines.distil(DistilSpec.of(student, train, dev, out, teacher=teacher, unlabeled=unlabeled, **options))


__all__ = ["Predictor", "distil", "evaluate", "finetune", "load", "predict", "pretrain"]
