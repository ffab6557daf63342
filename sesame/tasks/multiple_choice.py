"""Multiple choice (SWAG, RACE, COPA, Story Cloze): a context and several candidate answers → the right one.

Each candidate is paired with the context and the pair encoded on its own, ``cls context sep choice
sep`` (segments 0 then 1 for encoders; none for causal decoders, gpt2's separator acting as GPT's
delimiter; the gpt family encodes ``<start> context <delim> choice <extract>`` with GPT's own input
tokens, :mod:`.inputs`); the pooled representation of each pair goes through a linear layer to one
score, and a softmax across the candidates of an example gives the distribution over answers (BERT
on SWAG, Devlin et al. 2019, §4.4: "a vector whose dot product with the [CLS] token representation C
denotes a score for each choice which is normalized with a softmax layer"; GPT, Radford et al. 2018,
§3.3: "Each of these sequences are processed independently with our model and then normalized via a
softmax layer"). A question (RACE) joins the context in the first segment, ``[z; q; $; a_k]`` as in
GPT §3.3. Training minimises the cross-entropy of that softmax; the metric is accuracy.

XLNet (Yang et al. 2019, §3.3, RACE) reads each pair as ``context <sep> choice <sep> <cls>`` (its tokenizer's
template, segments 0, 1 and 2) and scores the final ``<cls>``'s content state through its sequence summary (dense +
tanh) and a linear layer to one score (its code's ``run_race.py``; transformers' ``XLNetForMultipleChoice``):
:class:`XLNetChoiceModel`, which :data:`CHOICE_HEADS` picks for an XLNet backbone. A choice's score reads only its
own pair, so the other candidates' texts never change it.

The data are JSON Lines: one object per line with the context, a list of candidate strings and the
gold answer, given as the index of the right candidate or as its text. Examples may have different
numbers of candidates: a batch is padded to its largest count with dummy candidates scored −∞.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..data.labeled import FORMATS, json_lines
from ..errors import SesameError
from ..metrics import accuracy
from ..models import Transformer, XLNet
from ..tokenizer import TextTokenizer
from .base import Task, TaskModel, pad, register, shown
from .classify import SequenceModel, XLNetSequenceModel, collate


class ChoiceModel(SequenceModel):
    """``SequenceModel`` with one output: a score per (context, candidate) pair, read as ``[B, C]`` rows
    (C: the batch's largest candidate count; dummy candidates at −∞) and trained with cross-entropy
    across the candidates."""

    def __init__(self, backbone: Transformer, pooling: str, dropout: float = 0.1):
        super().__init__(backbone, 1, pooling, dropout)

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        real = batch["choices"]
        return super().outputs(batch).view(real.shape).masked_fill(~real, float("-inf"))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.outputs(batch), batch["targets"], reduction="sum")


class XLNetChoiceModel(ChoiceModel, XLNetSequenceModel):
    """:class:`ChoiceModel` through XLNet's sequence summary: with ``last`` pooling (the family's) the final
    ``<cls>``'s state → dense → tanh → dropout → linear, one score per pair (``XLNetForMultipleChoice``)."""


CHOICE_HEADS: dict[type, type[ChoiceModel]] = {XLNet: XLNetChoiceModel}  # keyed as classify.HEADS


@register
@dataclass
class MultipleChoice(Task):
    """A context and candidate answers from JSON Lines → the index of the right candidate.

    ``label_field`` holds the index of the right candidate (0-based) or its text; ``question_field``,
    when given, names a question joined to the context (RACE)."""

    name: ClassVar[str] = "multiple_choice"
    select: ClassVar[str] = "accuracy"
    has_labels: ClassVar[bool] = False
    context_field: str = "context"
    choices_field: str = "choices"
    label_field: str = "label"
    question_field: str | None = None

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        return ("accuracy",)

    def read(self, path: str, labeled: bool = True) -> list[dict]:
        """Examples ``{"text", "choices", "label" (an index), "line"}`` (and ``"question"``) of a JSONL file."""
        if FORMATS.get(Path(path).suffix.lower()) != "jsonl":
            raise SesameError(f"{path}: --task {self.name} reads JSON Lines; give a .jsonl file with one object "
                              "per line")
        return [self._parse(record, labeled, f"{path}:{line}") | {"line": line} for line, record in json_lines(path)]

    def example_of(self, value: object, where: str) -> dict:
        """An object with the fields of a line of the task's JSONL file (without the label)."""
        if not isinstance(value, dict):
            raise SesameError(f"{where}: --task {self.name} reads an object per input, {{{self.context_field!r}: "
                              f"\"...\", {self.choices_field!r}: [\"...\", ...]}}, not {shown(value)}")
        return self._parse(value, False, where)

    def _parse(self, record: dict, labeled: bool, where: str) -> dict:
        wanted = [(self.context_field, "context_field"), (self.choices_field, "choices_field")]
        wanted += [(self.question_field, "question_field")] if self.question_field else []
        wanted += [(self.label_field, "label_field")] if labeled else []
        for field, option in wanted:
            if field not in record:
                raise SesameError(f"{where}: no field {field!r} (--task-option {option}); the line has: "
                                  f"{', '.join(record) or 'no fields'}")
        context, choices = record[self.context_field], record[self.choices_field]
        if not isinstance(context, str) or not context.strip():
            raise SesameError(f"{where}: {self.context_field!r} must be a non-empty string")
        if (not isinstance(choices, list) or len(choices) < 2
                or not all(isinstance(c, str) and c.strip() for c in choices)):
            raise SesameError(f"{where}: {self.choices_field!r} must be a list of at least two non-empty strings")
        example = {"text": context, "choices": choices}
        if self.question_field:
            question = record[self.question_field]
            if not isinstance(question, str):
                raise SesameError(f"{where}: {self.question_field!r} must be a string")
            example["question"] = question
        if labeled:
            example["label"] = self._index(record[self.label_field], choices, where)
        return example

    def _index(self, label: object, choices: list[str], where: str) -> int:
        """The gold answer as a candidate index: an integer in range, or the text of exactly one candidate."""
        if isinstance(label, int) and not isinstance(label, bool):
            if 0 <= label < len(choices):
                return label
            raise SesameError(f"{where}: {self.label_field!r} is {label}, but there are {len(choices)} choices "
                              f"(indices 0 to {len(choices) - 1})")
        if isinstance(label, str):
            found = [i for i, choice in enumerate(choices) if choice == label]
            if len(found) == 1:
                return found[0]
            raise SesameError(f"{where}: {self.label_field!r} is {label!r}, which "
                              f"{'matches several choices' if found else 'is not among the choices'}; give the "
                              "right choice's 0-based index instead")
        raise SesameError(f"{where}: {self.label_field!r} is {json.dumps(label)}; give the right choice's "
                          "0-based index or its text")

    def length(self, feature: dict) -> int:
        return max(len(ids) for ids in feature["ids"])

    def features(self, examples: list[dict], tok: TextTokenizer, max_length: int, labels: list[str],
                 causal: bool) -> list[dict]:
        """One feature per example: ``ids`` (and ``types`` for encoders) hold one token list per candidate."""
        firsts, seconds = [], []
        for row in examples:
            first = f"{row['text']} {row['question']}" if row.get("question") else row["text"]
            firsts += [first] * len(row["choices"])
            seconds += row["choices"]
        encodings = iter(tok.encodings(firsts, seconds, max_length))
        features = []
        for i, row in enumerate(examples):
            pairs = [next(encodings) for _ in row["choices"]]
            feature = {"example": i, "ids": [e.ids for e in pairs]}
            if not causal:
                feature["types"] = [e.type_ids for e in pairs]
            if "label" in row:
                feature["target"] = row["label"]
            features.append(feature)
        return features

    def collate(self, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        """``ids``, ``padding`` (and ``types``) of shape ``[B·C, W]``, example-major; ``choices`` ``[B, C]``
        is True at real candidates. A dummy candidate is one real pad token, so attention stays defined."""
        slots = max(len(f["ids"]) for f in features)
        sequences, types = [], []
        for f in features:
            missing = slots - len(f["ids"])
            sequences += f["ids"] + [[pad_id]] * missing
            if "types" in f:
                types += f["types"] + [[0]] * missing
        batch = collate(sequences, pad_id)
        if types:
            batch["types"] = pad(types, 0)
        batch["choices"] = torch.arange(slots) < torch.tensor([len(f["ids"]) for f in features])[:, None]
        if "target" in features[0]:
            batch["targets"] = torch.tensor([f["target"] for f in features])
        return batch

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        return CHOICE_HEADS.get(type(backbone), ChoiceModel)(backbone, pooling, dropout)

    def _probabilities(self, examples: list[dict], outputs: torch.Tensor) -> list[torch.Tensor]:
        """The softmax over each example's own candidates (``outputs`` may hold more columns)."""
        return [outputs[i, : len(row["choices"])].softmax(-1) for i, row in enumerate(examples)]

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        predicted = [int(p.argmax()) for p in self._probabilities(examples, outputs)]
        return {"accuracy": accuracy([row["label"] for row in examples], predicted), "n": len(examples)}

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        results = []
        for p, row in zip(self._probabilities(examples, outputs), examples):
            best = int(p.argmax())
            results.append({"choice": best, "answer": row["choices"][best],
                            "probabilities": [round(float(x), 6) for x in p]})
        return results
