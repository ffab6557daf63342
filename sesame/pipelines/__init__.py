"""Pipelines: short functions of a spec, each writing or reading a run directory.

``pretrain(PretrainSpec)`` → a pretrained run; ``finetune(FinetuneSpec)`` → a fine-tuned run;
``distil(DistilSpec)`` → a fine-tuned run of a student taught by a teacher; ``evaluate`` and :class:`Predictor` read
either kind. The command line, the applications and the
Python API (:mod:`sesame.api`) all come through here.
"""
from .distil import distil
from .evaluate import Predictor, evaluate, load, predict
from .finetune import finetune
from .pretrain import lm_metrics, pretrain

__all__ = ["Predictor", "distil", "evaluate", "finetune", "lm_metrics", "load", "predict", "pretrain"]
