"""Downstream tasks: a reader, a head, a loss, metrics and decoded predictions each (see :mod:`.base`)."""
from .base import BATCHINGS, EVAL_BATCH, TASKS, Task, TaskModel, bucketed_batches, infer, make_task, steps_per_epoch
from .classify import POOLINGS, Classify, Pair, Regress, SequenceModel
from .multiple_choice import ChoiceModel, MultipleChoice
from .span_qa import SpanModel, SpanQA
from .tag import Tag, TokenModel
from .text2text import Text2Text, Text2TextModel

__all__ = ["BATCHINGS", "EVAL_BATCH", "TASKS", "Task", "TaskModel", "bucketed_batches", "infer", "make_task", "steps_per_epoch", "POOLINGS",
           "Classify", "Pair", "Regress", "SequenceModel",
           "ChoiceModel", "MultipleChoice", "SpanModel", "SpanQA", "Tag", "TokenModel",
           "Text2Text", "Text2TextModel"]
