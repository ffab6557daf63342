"""What fine-tuning, evaluation and prediction ask of a downstream task, and the loops they share.

A task (../shared/DESIGN.md: reads a labeled format, builds the head, computes loss and metrics,
decodes predictions) is a dataclass whose fields are its options (columns, flags), recorded in the
run's config.json. It turns a file into examples (``read``), examples into model inputs
(``features``: one or more per example, each with its token ``ids``) and batches them
(``collate``); it puts its head on a backbone (``build``); and it turns the model's outputs back
into metrics (``score``) and one prediction per example (``predictions``, written by ``write``).
Nothing here knows how the backbone works inside, and the trainer knows no task.
"""
from __future__ import annotations

import json
import math
from dataclasses import InitVar, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..errors import SesameError
from ..models import ModelConfig, Transformer
from ..options import typed_value
from ..runtime import device_of, to_device
from ..tokenizer import TextTokenizer
from ..train.trainer import world

if TYPE_CHECKING:
    from ..families import Family

Batches = Callable[[int, float], list[dict[str, torch.Tensor]]]  # the trainer's batches(step, progress)
BUCKET_BATCHES = 50  # sort by length within windows of this many batches
BATCHINGS = {"bucketed": BUCKET_BATCHES, "shuffled": 1}  # --batching: batches per length-sorting window
EVAL_BATCH = 64


class TaskModel(nn.Module):
    """A backbone with a task head: ``forward(batch)`` is the summed loss over the batch's targets (the
    trainer divides by their count); ``outputs(batch)`` one row per feature, ``[B, k]`` for a sequence
    or ``[B, W, k]`` for per-token outputs (W: the batch's width)."""

    backbone: Transformer

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class Task:
    """A downstream task; subclasses set ``name`` and implement the methods below."""

    name: ClassVar[str]
    select: ClassVar[str] = "accuracy"  # the dev metric that picks the kept weights by default
    has_labels: ClassVar[bool] = True  # a label vocabulary, saved with the run as labels.json
    per_token: ClassVar[bool] = False  # outputs per token ([B, W, k]) rather than per sequence
    head_drops: ClassVar[bool] = True  # the head applies the dropout before its output layer(s)
    reads_encoder_decoders: ClassVar[bool] = False  # its head also reads an encoder-decoder (T5, BART)
    exported_output: ClassVar[str | None] = None  # its outputs' name in an ONNX export (None: `sesame export` refuses)
    windows: ClassVar[bool] = False  # an input longer than ``max_length`` is read in several windows, not cut
    distils: ClassVar[bool] = False  # one output row per example and a task loss of rows (`sesame distil`)
    # where the options came from, which an error in their values names: the command line's flag, or a mixture
    # file's task (not an option, so not recorded)
    where: InitVar[str] = "--task-option"

    def __post_init__(self, where: str) -> None:
        """Check the options' values, an error naming ``where`` they came from; by default none is checked."""

    def options(self) -> dict:
        return asdict(self)

    def for_family(self, family: Family | None) -> None:
        """Set the options left to the model's family (its registry row; None: a model of no registered family) to
        the row's values; fine-tuning calls it before recording the options. By default no option is."""

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        """The dev metrics that can pick the kept weights (higher is better)."""
        return (self.select,)

    def length(self, feature: dict) -> int:
        """Tokens in a feature, for batching features of similar length together."""
        return len(feature["ids"])

    def read(self, path: str, labeled: bool = True) -> list[dict]:
        """Examples of a file (with their gold answers when ``labeled``), each with its ``line``."""
        raise NotImplementedError

    def example(self, text: str) -> dict:
        """An unlabeled example from a bare text (``sesame predict`` reading stdin)."""
        raise SesameError(f"--task {self.name} reads examples from a file: give --input FILE")

    def example_of(self, value: object, where: str) -> dict:
        """An unlabeled example from one JSON value, an input of a ``sesame serve`` request: by default a
        non-empty text (:meth:`example`); tasks whose inputs are more than one text override it. A value of
        another shape is an error beginning with ``where`` and saying which shape is expected."""
        if isinstance(value, str) and value.strip():
            return self.example(value)
        raise SesameError(f"{where}: --task {self.name} reads a non-empty text per input, not {shown(value)}")

    def labels(self, train: list[dict], path: str) -> list[str]:
        """The label vocabulary the training examples define (empty for tasks without one)."""
        return []

    def check(self, examples: list[dict], labels: list[str], path: str) -> None:
        """Fail, naming file and line, on gold answers the model cannot represent (an unknown label)."""

    def check_model(self, model: ModelConfig) -> None:
        """Fail, naming the flag, when the backbone (its config, before any weights exist) cannot
        serve this task; fine-tuning calls it before writing the run directory. An encoder-decoder (T5, BART) is
        refused unless the task's head reads one (``reads_encoder_decoders``: classify, pair, regress)."""
        if model.arch == "encoder_decoder" and not self.reads_encoder_decoders:
            raise SesameError(f"--from: an encoder-decoder (T5, BART) model; --task {self.name}'s head reads one "
                              "stack's states, which it does not give: fine-tune it with --task classify, pair, "
                              "regress or text2text, or fine-tune an encoder or decoder family (bert, gpt2, ...)")

    def features(self, examples: list[dict], tok: TextTokenizer, max_length: int, labels: list[str],
                 causal: bool) -> list[dict]:
        """Model inputs: dicts with ``ids`` (a list of token ids), the ``example`` they come from, and
        their targets when the examples are labeled. ``causal`` backbones take no segment ids."""
        raise NotImplementedError

    def collate(self, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def training_batches(self, labeled: Batches, tok: TextTokenizer, max_length: int, batch_size: int, seed: int
                         ) -> tuple[Batches, int]:
        """A task's source of training batches: the trainer's ``batches(step, progress)`` and how many
        trainer steps one labeled step becomes. ``labeled(k, progress)`` gives the k-th labeled step;
        by default it is the whole source, one trainer step each (1). A task may put batches of its own
        between labeled steps, made with ``tok``, ``max_length``, ``batch_size`` and ``seed`` (tagging's
        cross-view training, :func:`.cvt.alternate`)."""
        return labeled, 1

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        raise NotImplementedError

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        """Metrics of ``outputs`` (from :func:`infer`) against the examples' gold answers."""
        raise NotImplementedError

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        """One JSON-able prediction per example."""
        raise NotImplementedError

    def write(self, examples: list[dict], predictions: list[dict], path: str | Path) -> None:
        """Write predictions in the task's usual format (default: one JSON object per line)."""
        with open(path, "w", encoding="utf-8") as out:
            for prediction in predictions:
                out.write(json.dumps(prediction, ensure_ascii=False) + "\n")


def shown(value: object) -> str:
    """A JSON value as an error message quotes it (cut to 60 characters)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def texts_of(value: object, count: int | None = None) -> list[str] | None:
    """``value`` when it is a list of non-empty strings (``count`` of them, or at least one), else None."""
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value) and \
            len(value) == (count or len(value)):
        return value
    return None


TASKS: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    TASKS[cls.name] = cls
    return cls


def make_task(name: str, options: dict | None = None, *, where: str = "--task-option") -> Task:
    """The task ``name`` with ``options`` (its dataclass fields; None values take the defaults), each held to its
    field's type (:func:`sesame.options.typed_value`: ``bos=tru`` is refused, naming the option) and to the values the
    task takes, an error naming ``where`` they came from (the flag, or a mixture file's task)."""
    if name not in TASKS:
        raise SesameError(f"--task {name!r} is unknown; choose one of: {', '.join(TASKS)}")
    cls = TASKS[name]
    known = {f.name: f for f in fields(cls)}
    given = {k: v for k, v in (options or {}).items() if v is not None}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise SesameError(f"{', '.join(unknown)}: not an option of --task {name} (it takes: "
                          f"{', '.join(sorted(known)) or 'nothing'})")
    return cls(**{k: typed_value(known[k], v, where=where) for k, v in given.items()}, where=where)


def label_vocabulary(labels: Iterable[str], path: str, column: str) -> list[str]:
    """The sorted distinct labels of the training file ``path``; an error unless there are two or more."""
    vocabulary = sorted(set(labels))
    if len(vocabulary) < 2:
        raise SesameError(f"{path}: column {column} has only one label ({vocabulary}); a model needs two or more: "
                          "check --label-column")
    return vocabulary


def bucketed_batches(lengths: list[int], batch_size: int, generator: torch.Generator, *,
                     window: int = BUCKET_BATCHES) -> list[list[int]]:
    """Shuffle, sort by length inside windows of ``window`` batches, cut, shuffle the batches. A window of one
    batch is plain shuffled batching: sorting inside a batch leaves its members as the shuffle drew them."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    window = batch_size * window
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start: start + window], key=lambda i: lengths[i])
        batches += [chunk[j: j + batch_size] for j in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def steps_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)


def pad(sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """Right-pad to the longest sequence: a ``[len(sequences), width]`` long tensor."""
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), value, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def infer(model: TaskModel, task: Task, features: list[dict], pad_id: int) -> torch.Tensor:
    """``model.outputs`` for every feature, in the features' order: ``[N, k]``, or ``[N, W, k]`` for
    per-token tasks (W: the longest feature; positions past a feature's end are 0). Features of
    similar length are batched together, each moved to the model's device; under torchrun each process scores
    its share. The outputs come back on the CPU, in float32."""
    rank, size = world()
    if len(features) < size:
        raise SesameError(f"{len(features)} evaluation inputs for {size} processes; run with fewer processes")
    order = sorted(range(len(features)), key=lambda i: task.length(features[i]))[rank::size]
    width = max(task.length(f) for f in features)
    out: torch.Tensor | None = None
    if any(m.training for m in model.modules()):  # walking the modules is cheaper than setting each one's mode
        model.eval()
    device = device_of(model)
    with torch.inference_mode():  # no autograd bookkeeping at all (the outputs are never differentiated)
        for start in range(0, len(order), EVAL_BATCH):
            chunk = order[start: start + EVAL_BATCH]
            rows = model.outputs(to_device(task.collate([features[i] for i in chunk], pad_id), device)).float().cpu()
            if out is None:
                out = torch.zeros(len(features), *((width,) if task.per_token else ()), rows.shape[-1])
            out = _widen(out, rows.shape[-1])  # multiple choice: a batch's column count is its most candidates
            out[chunk, : rows.shape[1]] = rows
    if size > 1:
        columns = torch.tensor([out.shape[-1]])
        dist.all_reduce(columns, op=dist.ReduceOp.MAX)
        out = _widen(out, int(columns))
        dist.all_reduce(out)
    return out


def _widen(out: torch.Tensor, columns: int) -> torch.Tensor:
    """``out`` with zero columns appended up to ``columns`` (unchanged when it has as many already)."""
    missing = columns - out.shape[-1]
    return torch.cat([out, out.new_zeros(*out.shape[:-1], missing)], -1) if missing > 0 else out
