"""Sequence-level tasks: a text or a text pair → one label (``classify``, ``pair``) or one number (``regress``).

One head serves all three: a pooled representation → dropout → linear layer.
Encoders pool the first ([CLS]) position through BERT's pooler (dense + tanh, Devlin et al. 2019);
causal decoders read the last real token, which has seen the whole text (GPT, Radford et al. 2018).
``mean`` averages the final states of the real tokens (as Sentence-BERT does, Reimers & Gurevych
2019), useful for encoders whose [CLS] was never trained by a sentence-level objective; ``max`` takes
their maximum per feature (a BiLSTM's, Conneau et al. 2017); ``concat`` is ULMFiT's concat pooling
into its two-block classifier (Howard & Ruder 2018, §3.3).

An encoder-decoder (T5, BART: :class:`EncoderDecoderSequenceModel`) reads, with ``last`` pooling (both families'
default), the decoder's state at the input's end token with BART's classification head (Lewis et al. 2020, §3.1);
other poolings read its encoder's states as an encoder's are read. XLNet reads its final ``<cls>`` through a dense
layer and tanh (:class:`XLNetSequenceModel`, XLNet's sequence summary).

A pair is encoded as ``cls a sep b sep``: with segment ids 0 then 1 for encoders (BERT, §4.1),
without segments for causal decoders, gpt2's separator acting as GPT's delimiter and its final one
as the extract token (Radford et al. 2018, §3.3). The gpt family fine-tunes with GPT's own input
tokens instead, ``<start> a <extract>`` and ``<start> a <delim> b <extract>`` (:mod:`.inputs`);
"last" pooling reads the extract token; the ulmfit family reads ``</s> a`` as its LM read each
document. ``symmetric`` is GPT's trick for similarity tasks, whose pairs have no natural order: both
orders are encoded and their pooled representations added before the linear layer. A single text carries segment
ids only where its template gives a token a non-zero one (:func:`single_text_segments`): XLNet's ``a <sep> <cls>``
reads 0 … 0 2, the class token in its own segment as pre-trained (Yang et al. 2019's code, ``SEG_ID_CLS``) and as
transformers' ``XLNetTokenizer`` gives ``token_type_ids``; BERT's ``cls a sep`` (all 0) carries none, the
backbone's default segment 0. Classification minimises cross-entropy; regression (STS-B) squared error.
Batches are padded only to their own longest input, and inputs of similar length are batched together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..data.labeled import read_fields
from ..errors import SesameError
from ..metrics import classification_report, regression_report
from ..models import EncoderDecoder, Transformer, XLNet
from ..models.padding import real_tokens
from ..tokenizer import TextTokenizer
from .base import Task, TaskModel, label_vocabulary, pad, register, shown, texts_of

POOLINGS = ("cls", "last", "mean", "max", "concat")
CONCAT_HIDDEN = 50  # ULMFiT's classifier hidden layer (Howard & Ruder 2018, §4)
CONCAT_DROPOUT = 0.1  # the second block's dropout (fastai's get_text_classifier: ps = [output_p × drop_mult, 0.1])


def pool(hidden: torch.Tensor, real: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per row of ``hidden`` (batch, time, H) whose real positions ``real`` marks: the first
    (``cls``), the last real (``last``), the mean or the max over real positions, or ULMFiT's concat pooling
    [h_T; maxpool(H); meanpool(H)] (§3.3), 3H wide. Padding never enters a mean or a max."""
    if pooling == "cls":
        return hidden[:, 0]
    peak = hidden.masked_fill(~real[..., None], float("-inf")).amax(1) if pooling in ("max", "concat") else None
    if pooling == "max":
        return peak
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), real.sum(1) - 1]
    mean = (hidden * real[..., None]).sum(1) / real.sum(1, keepdim=True)
    return torch.cat([last, peak, mean], -1) if pooling == "concat" else {"mean": mean, "last": last}[pooling]


class BatchNorm(nn.BatchNorm1d):
    """Batch normalisation that also takes a training batch of one row, which has no batch statistics: that
    row is normalised with the running ones, as in evaluation, and leaves them unchanged (fastai instead
    drops the incomplete last training batch; here a last batch, or micro-batch, of one still trains)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


def concat_head(width: int, n_out: int, dropout: float) -> nn.Sequential:
    """ULMFiT's classifier (§3.3): two blocks of batch normalisation, dropout and a linear layer, ReLU between.
    The dropouts are fastai's (``get_text_classifier``): ``dropout`` (the encoder's output dropout, scaled by
    ``drop_mult``) in the first block and :data:`CONCAT_DROPOUT` in the second. A recurrent encoder under this
    head drops nothing after its last layer (fastai's AWD_LSTM; the fine-tuning pipeline records its output
    dropout as 0), so the output dropout is applied once, here."""
    return nn.Sequential(BatchNorm(width), nn.Dropout(dropout), nn.Linear(width, CONCAT_HIDDEN), nn.ReLU(),
                         BatchNorm(CONCAT_HIDDEN), nn.Dropout(CONCAT_DROPOUT), nn.Linear(CONCAT_HIDDEN, n_out))


class SequenceModel(TaskModel):
    """Backbone → pooled vector → dropout → linear: class logits, or a score when ``n_out`` is 1 and
    ``regression`` is set. With ``concat`` pooling the head is ULMFiT's two blocks (:func:`concat_head`)."""

    dense_poolings: ClassVar[tuple[str, ...]] = ("cls",)  # read through a dense + tanh layer (BERT's pooler)

    def __init__(self, backbone: nn.Module, n_out: int, pooling: str, dropout: float = 0.1,
                 regression: bool = False):
        super().__init__()
        hidden = backbone.config.hidden
        self.backbone, self.pooling, self.regression = backbone, pooling, regression
        dense = pooling in self.dense_poolings
        self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if dense else nn.Identity()
        self.dropout = nn.Dropout(dropout) if pooling != "concat" else nn.Identity()
        self.head = concat_head(3 * hidden, n_out, dropout) if pooling == "concat" else nn.Linear(hidden, n_out)
        for layer in ([self.head] if pooling != "concat" else []) + ([self.pooler[0]] if dense else []):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def pool(self, ids: torch.Tensor, types: torch.Tensor | None, padding: torch.Tensor | None) -> torch.Tensor:
        return self.pooler(pool(self.backbone(ids, types, padding=padding), real_tokens(ids, padding), self.pooling))

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pooled = self.pool(batch["ids"], batch.get("types"), batch["padding"])
        if "swapped_ids" in batch:
            pooled = pooled + self.pool(batch["swapped_ids"], batch.get("swapped_types"), batch["swapped_padding"])
        return self.head(self.dropout(pooled))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.loss(self.outputs(batch), batch["targets"])

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The summed task loss of ``outputs`` (rows of :meth:`outputs`) against gold ``targets``: cross-entropy, or
        squared error for regression."""
        if self.regression:
            return F.mse_loss(outputs[:, 0], targets, reduction="sum")
        return F.cross_entropy(outputs, targets, reduction="sum")


class EncoderDecoderSequenceModel(SequenceModel):
    """A sequence head on an encoder-decoder (T5, BART). ``last`` pooling is BART's classifier (Lewis et al. 2020,
    §3.1: "the same input is fed into the encoder and decoder, and the final hidden state of the final decoder token
    is fed into new multi-class linear classifier"), as fairseq and transformers' ``BartForSequenceClassification``
    compute it: the decoder reads the input shifted right behind its start token
    (:meth:`~sesame.models.encoder_decoder.EncoderDecoder.decoder_inputs`), and its state at the input's last end
    token ``</s>`` (which has read the whole input before it) goes through ``BartClassificationHead``: dropout →
    dense → tanh → dropout → linear. The end token is the last real token of each row: every input the tokenizers
    make ends with it (BART's ``<s> a </s>``, ``<s> a </s> b </s>``; T5's ``a </s>``, ``a </s> b </s>``, without the
    ``<s>`` its pre-training never shows: :data:`sesame.inputs.WITHOUT_START`; truncation keeps it), and
    rows are padded on the right, which the encoder masks and the causal decoder reads only after that token.

    T5 gets the same head (transformers' ``T5ForSequenceClassification``; the T5 paper itself casts classification
    as text, ``--task text2text``): the decoder, half of what pre-training trained, is used, a run exports to and
    imports from transformers, and T5 and BART are compared under one head. Any other pooling reads the encoder's
    states as an encoder's are read (``--pooling mean``: Sentence-T5's encoder mean, Ni et al. 2022), the decoder
    unused. Deviation: the head's dropout is ``--dropout`` (0.1), where fairseq's ``pooler_dropout`` and
    transformers' ``classifier_dropout`` default to 0."""

    dense_poolings = ("cls", "last")

    def pool(self, ids: torch.Tensor, types: torch.Tensor | None, padding: torch.Tensor | None) -> torch.Tensor:
        memory, real = self.backbone.encode(ids, padding), real_tokens(ids, padding)
        if self.pooling != "last":
            return self.pooler(pool(memory.states, real, self.pooling))
        states = self.backbone.decode(self.backbone.decoder_inputs(ids), memory)
        return self.pooler(self.dropout(pool(states, real, "last")))


class XLNetSequenceModel(SequenceModel):
    """XLNet's sequence summary (its code's ``summarize_sequence`` with ``summary_type="last"`` and ``use_proj``, as
    its classifiers are fine-tuned; transformers' ``XLNetSequenceSummary``): with ``last`` pooling (the family's), the
    state of the final ``<cls>`` through a dense layer and tanh, then dropout and the linear layer. Deviation: rows
    are padded on the right, where XLNet pads on the left so that ``<cls>`` is the last position; with relative
    positions and padding masked as keys, the real tokens' states are the same either way."""

    dense_poolings = ("cls", "last")


HEADS: dict[type, type[SequenceModel]] = {EncoderDecoder: EncoderDecoderSequenceModel, XLNet: XLNetSequenceModel}


def sequence_model(backbone: nn.Module, n_out: int, pooling: str, dropout: float, *,
                   regression: bool = False) -> SequenceModel:
    """The sequence head for ``backbone``: the one :data:`HEADS` names for its class (an encoder-decoder's, XLNet's),
    else :class:`SequenceModel`."""
    return HEADS.get(type(backbone), SequenceModel)(backbone, n_out, pooling, dropout, regression)


def single_text_segments(tok: TextTokenizer) -> bool:
    """Whether ``tok``'s template gives a single text's tokens any non-zero segment id (XLNet's ``<cls>``: 2), read
    off the encoding of the empty text, which holds the template's special tokens alone."""
    return any(tok.backend.encode("").type_ids)


def collate(sequences: list[list[int]], pad_id: int, targets: list | None = None) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence of the batch; ``padding`` is True at real tokens."""
    ids = pad(sequences, pad_id)
    lengths = torch.tensor([len(s) for s in sequences])
    batch = {"ids": ids, "padding": torch.arange(ids.shape[1]) < lengths[:, None]}
    if targets is not None:
        batch["targets"] = torch.tensor(targets)
    return batch


@register
@dataclass
class Classify(Task):
    """Text (or, with ``pair_column``, text-pair) classification from CSV, TSV or JSONL columns."""

    name: ClassVar[str] = "classify"
    reads_encoder_decoders: ClassVar[bool] = True
    exported_output: ClassVar[str | None] = "logits"  # [batch, labels]: softmax gives the probabilities
    distils: ClassVar[bool] = True
    text_column: str = "text"
    label_column: str = "label"
    pair_column: str | None = None
    symmetric: bool = False

    def __post_init__(self, where: str) -> None:
        if self.symmetric and self.pair_column is None:
            raise SesameError("--symmetric: scores both orders of a pair; give the second text's --pair-column")

    def read(self, path: str, labeled: bool = True) -> list[dict]:
        rows = read_fields(path, {"text": (self.text_column, "--text-column"),
                                  "pair": (self.pair_column, "--pair-column"),
                                  "label": (self.label_column if labeled else None, "--label-column")})
        for row in rows:
            if labeled:
                row["label"] = self.target_value(row["label"].strip(), path, row["line"])
        return rows

    def example(self, text: str) -> dict:
        if self.pair_column is not None:
            return super().example(text)
        return {"text": text}

    def example_of(self, value: object, where: str) -> dict:
        """A text, or with a pair column two texts ``["first", "second"]``."""
        if self.pair_column is None:
            return super().example_of(value, where)
        pair = texts_of(value, 2)
        if pair is None:
            raise SesameError(f"{where}: --task {self.name} reads two non-empty texts per input, [\"first\", "
                              f"\"second\"], not {shown(value)}")
        return {"text": pair[0], "pair": pair[1]}

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        return ("accuracy", "macro_f1", "mcc") + (("f1",) if len(labels) == 2 else ())

    def target_value(self, label: str, path: str, line: int) -> str | float:
        return label

    def labels(self, train: list[dict], path: str) -> list[str]:
        return label_vocabulary((row["label"] for row in train), path, repr(self.label_column))

    def check(self, examples: list[dict], labels: list[str], path: str) -> None:
        known = set(labels)
        for row in examples:
            if row.get("label") is not None and row["label"] not in known:
                raise SesameError(f"{path}:{row['line']}: label {row['label']!r} never occurs in the training data; "
                                  f"the known labels are {labels}")

    def features(self, examples: list[dict], tok: TextTokenizer, max_length: int, labels: list[str],
                 causal: bool) -> list[dict]:
        texts = [row["text"] for row in examples]
        pairs = [row["pair"] for row in examples] if self.pair_column else None
        orders = [(texts, pairs)] + ([(pairs, texts)] if self.symmetric else [])
        encoded = [tok.encodings(a, b, max_length) for a, b in orders]
        index = {name: i for i, name in enumerate(labels)}
        segmented = not causal and (pairs is not None or single_text_segments(tok))
        features = []
        for i, row in enumerate(examples):
            feature = {"example": i}
            for prefix, encodings in zip(("", "swapped_"), encoded):
                feature[prefix + "ids"] = encodings[i].ids
                if segmented:
                    feature[prefix + "types"] = encodings[i].type_ids
            if "label" in row:
                feature["target"] = index[row["label"]] if labels else row["label"]
            features.append(feature)
        return features

    def collate(self, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        batch = {}
        for prefix in ("", "swapped_") if "swapped_ids" in features[0] else ("",):
            part = collate([f[prefix + "ids"] for f in features], pad_id)
            batch.update({prefix + "ids": part["ids"], prefix + "padding": part["padding"]})
            if prefix + "types" in features[0]:
                batch[prefix + "types"] = pad([f[prefix + "types"] for f in features], 0)
        if "target" in features[0]:
            batch["targets"] = torch.tensor([f["target"] for f in features])
        return batch

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        return sequence_model(backbone, n_labels, pooling, dropout)

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        index = {name: i for i, name in enumerate(labels)}
        gold = [index[row["label"]] for row in examples]
        loss = float(F.cross_entropy(outputs, torch.tensor(gold))) if gold else 0.0
        return {**classification_report(gold, outputs.argmax(1).tolist(), labels), "loss": round(loss, 5)}

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        return [{"label": labels[int(p.argmax())],
                 "probabilities": {name: round(float(x), 6) for name, x in zip(labels, p)}}
                for p in outputs.softmax(-1)]


@register
@dataclass
class Pair(Classify):
    """Sentence-pair classification (MRPC, RTE, MNLI): ``classify`` with a second text column."""

    name: ClassVar[str] = "pair"
    text_column: str = "sentence1"
    pair_column: str | None = "sentence2"

    def __post_init__(self, where: str) -> None:
        if self.pair_column is None:
            raise SesameError("--task pair: give the second text's --pair-column")
        super().__post_init__(where)


@register
@dataclass
class Regress(Classify):
    """A text or text pair → a real number (STS-B), trained with squared error; Pearson and Spearman
    correlations on dev, Pearson selecting the kept weights."""

    name: ClassVar[str] = "regress"
    select: ClassVar[str] = "pearson"
    exported_output: ClassVar[str | None] = "score"  # [batch, 1]
    has_labels: ClassVar[bool] = False

    def target_value(self, label: str, path: str, line: int) -> float:
        try:
            value = float(label)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # nan would zero the correlations, inf the loss
            raise SesameError(f"{path}:{line}: {self.label_column!r} is {label!r}, not a finite number; "
                              "--task regress needs numeric targets")
        return value

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        return ("pearson", "spearman")

    def labels(self, train: list[dict], path: str) -> list[str]:
        return []

    def check(self, examples: list[dict], labels: list[str], path: str) -> None:
        pass

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        return sequence_model(backbone, 1, pooling, dropout, regression=True)

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        return regression_report([row["label"] for row in examples], outputs[:, 0].tolist())

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        return [{"score": round(float(x), 6)} for x in outputs[:, 0]]
