"""Token classification (``tag``): a label per word, for named entities (CoNLL-2003) or parts of speech.

Files are CoNLL columns: one word per line with its annotations separated by whitespace
(CoNLL-2003: ``token POS chunk NER``), a blank line between sentences, ``-DOCSTART-`` lines between
documents (skipped). ``token_column`` and ``label_column`` pick the columns (0 is the first, -1 the
last: NER in CoNLL-2003; 1 is its POS tag).

A sentence is encoded from its words (``cls w1 … wn sep``; XLNet's ``w1 … wn <sep> <cls>``), so every subword
knows its word; encoders also read the template's segment ids (XLNet's ``<cls>`` is segment 2, as it pre-trained).
As in BERT's NER (Devlin et al. 2019, §5.3), the head is a linear layer on the final hidden state of each
word's first subword: the loss reads only those positions; continuation subwords and special tokens
are ignored. XLNet gets the same head on its content stream (transformers' ``XLNetForTokenClassification``; the
XLNet paper reports no tagging task). Words cut off by ``max_length`` (or that a tokenizer turns into nothing) are predicted
``O`` and still count as gold in evaluation, so truncation cannot inflate a score.

Dev metrics are those of the CoNLL-2000/2003 ``conlleval`` script (Tjong Kim Sang & Buchholz 2000;
Tjong Kim Sang & De Meulder 2003): entity-level precision, recall and F1, where an entity counts as
found only when its span and type both match, with the script's own rules for where chunks start
and end. They read IOB2 (every entity starts with ``B-``) and IOB1 (``B-`` only between two adjacent
entities of one type; Ramshaw & Marcus 1995) alike: an ``I-`` after ``O`` or after another type
starts an entity. Token accuracy is reported too (the metric for POS tags, which form no entities:
choose it with ``--select accuracy``).

Cross-view training (Clark et al. 2018; :mod:`.cvt`, docs/cvt.md): ``--task-option cvt_unlabeled=FILE``
(plain text, one sentence per line) trains a :class:`~.cvt.CrossViewModel` on a bidirectional recurrent
backbone, alternating labeled batches with batches of that text. This task only routes to :mod:`.cvt`
when the option is set: ``build``, ``check_model``, ``labels`` (reading FILE early) and
``training_batches``; ``head=mlp`` alone builds CVT's primary module as a plain tagger. Prediction uses
the primary module and never reads FILE.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from ..data.labeled import read_text
from ..errors import SesameError
from ..metrics import conll_report
from ..models import ModelConfig, Transformer
from ..tokenizer import TextTokenizer
from . import cvt
from .base import Batches, Task, TaskModel, label_vocabulary, pad, register, shown, texts_of
from .classify import collate
from .words import DOCSTART, IGNORE, encode_words, first_subwords, word_loss

OUTSIDE = "O"  # the prediction for a word without a subword in the model's window
CONLL = "a CoNLL file: a word and its tags per line, a blank line between sentences (CoNLL-2003: EU NNP B-NP B-ORG)"


class TokenModel(TaskModel):
    """Backbone → dropout → linear on every position: ``[B, W, n_labels]`` logits."""

    def __init__(self, backbone: Transformer, n_labels: int, dropout: float = 0.1):
        super().__init__()
        self.backbone = backbone
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(backbone.config.hidden, n_labels)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.dropout(self.backbone(batch["ids"], batch.get("types"), padding=batch["padding"])))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy summed over the labeled positions (``targets`` ≠ -100)."""
        return word_loss(self.outputs(batch), batch["targets"])


def _column(value: int | str, option: str) -> int:
    """A column number given as a number, or as text (``--label-column 1`` arrives as "1")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value))
    except ValueError:
        raise SesameError(f"{option} {value!r}: --task tag takes a column number (0 is the first, -1 the "
                          "last)") from None


@register
@dataclass
class Tag(Task):
    """A label per word from CoNLL column files (NER, POS)."""

    name: ClassVar[str] = "tag"
    select: ClassVar[str] = "f1"
    per_token: ClassVar[bool] = True
    token_column: int | str = 0  # column numbers; a flag's text ("1", --label-column) is read as one (_column)
    label_column: int | str = -1
    cvt_unlabeled: str | None = None  # a text file, one sentence per line: cross-view training (cvt.py)
    head: str | None = None  # linear (BERT's), or mlp (CVT's primary module); default: mlp with cvt_unlabeled

    def __post_init__(self, where: str) -> None:
        self.token_column = _column(self.token_column, "token_column")
        self.label_column = _column(self.label_column, "--label-column")
        self._unlabeled: list[list[str]] | None = None  # read when training, never when predicting
        if self.head not in (None, "linear", "mlp"):
            raise SesameError(f"{where}: head={self.head}: choose linear or mlp")
        if self.head == "linear" and self.cvt_unlabeled is not None:
            raise SesameError(f"{where}: head=linear: cross-view training (cvt_unlabeled) predicts with its mlp "
                              "module; drop head")

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        return ("f1", "accuracy")

    def read(self, path: str, labeled: bool = True) -> list[dict]:
        """Sentences as ``{"words", "tags" (when labeled), "text", "line"}``; ``line`` is the first word's."""
        examples: list[dict] = []
        words: list[str] = []
        tags: list[str] = []
        start = width = 0

        def close() -> None:
            if words:
                example = {"words": list(words), "text": " ".join(words), "line": start}
                if labeled:
                    example["tags"] = list(tags)
                examples.append(example)
                words.clear()
                tags.clear()

        for lineno, line in enumerate(read_text(Path(path), CONLL).splitlines(), 1):
            columns = line.split()
            if not columns:
                close()
                continue
            if not width:
                width = len(columns)
                self._check_columns(width, labeled, path, lineno)
            elif len(columns) != width:
                raise SesameError(f"{path}:{lineno}: {len(columns)} columns, but the file's first line has {width}; "
                                  "every word needs the same columns (a blank line separates sentences)")
            if columns[self.token_column] == DOCSTART:
                close()
                continue
            if not words:
                start = lineno
            words.append(columns[self.token_column])
            if labeled:
                tags.append(columns[self.label_column])
        close()
        if not examples:
            raise SesameError(f"{path}: no sentences; expected CoNLL columns (one word per line, blank lines between "
                              "sentences)")
        return examples

    def _check_columns(self, width: int, labeled: bool, path: str, lineno: int) -> None:
        if labeled and width == 1:
            raise SesameError(f"{path}:{lineno}: a word without a tag; a labeled tagging file is {CONLL}")
        for value, option in ((self.token_column, "token_column"), (self.label_column, "--label-column")):
            if not -width <= value < width:
                raise SesameError(f"{path}:{lineno}: {option} {value}, but the line has {width} columns "
                                  f"(0 to {width - 1}, or -1 for the last)")
        if labeled and self.token_column % width == self.label_column % width:
            raise SesameError(f"{path}:{lineno}: token_column {self.token_column} and --label-column "
                              f"{self.label_column} are the same column of {width}; point --label-column at the tags")

    def example(self, text: str) -> dict:
        words = text.split()
        return {"words": words, "text": " ".join(words)}

    def example_of(self, value: object, where: str) -> dict:
        """A text, split at whitespace (:meth:`example`), or its words ``["word", ...]``."""
        words = texts_of(value)
        if words is not None and all(len(word.split()) == 1 for word in words):
            return {"words": words, "text": " ".join(words)}
        if isinstance(value, list):
            raise SesameError(f"{where}: --task {self.name} reads a text or a list of words (non-empty, without "
                              f"spaces) per input, not {shown(value)}")
        return super().example_of(value, where)

    def labels(self, train: list[dict], path: str) -> list[str]:
        """The tags of the training file. Fine-tuning with ``cvt_unlabeled`` also reads the unlabeled text
        here, beside the training file, so a bad file fails before the run directory is written."""
        if self.cvt_unlabeled is not None:
            self.unlabeled()
        return label_vocabulary((tag for row in train for tag in row["tags"]), path, str(self.label_column))

    def unlabeled(self) -> list[list[str]]:
        """The sentences of ``cvt_unlabeled`` (:func:`.cvt.read_sentences`), read once."""
        if self._unlabeled is None:
            self._unlabeled = cvt.read_sentences(str(self.cvt_unlabeled))
        return self._unlabeled

    def check(self, examples: list[dict], labels: list[str], path: str) -> None:
        known = set(labels)
        for row in examples:
            for j, tag in enumerate(row.get("tags", ())):
                if tag not in known:
                    raise SesameError(f"{path}:{row['line'] + j}: tag {tag!r} never occurs in the training data; "
                                      f"the known tags are {labels}")

    def features(self, examples: list[dict], tok: TextTokenizer, max_length: int, labels: list[str],
                 causal: bool) -> list[dict]:
        """Per sentence: ``ids``, ``types`` (encoders: the template's segment ids), ``first`` (each word's first
        subword position, -1 if cut off) and, when labeled, ``targets`` (the word's tag index at its first subword,
        -100 everywhere else)."""
        encodings = encode_words([row["words"] for row in examples], tok, max_length)
        index = {name: i for i, name in enumerate(labels)}
        features = []
        for i, (row, encoding) in enumerate(zip(examples, encodings)):
            first = first_subwords(encoding.word_ids, len(row["words"]))
            feature = {"example": i, "ids": encoding.ids, "first": first}
            if not causal:
                feature["types"] = encoding.type_ids
            if "tags" in row:
                targets = [IGNORE] * len(encoding.ids)
                for position, tag in zip(first, row["tags"]):
                    if position >= 0:
                        targets[position] = index[tag]
                feature["targets"] = targets
            features.append(feature)
        return features

    def collate(self, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        batch = collate([f["ids"] for f in features], pad_id)
        if "types" in features[0]:
            batch["types"] = pad([f["types"] for f in features], 0)
        if "targets" in features[0]:
            batch["targets"] = pad([f["targets"] for f in features], IGNORE)
            batch["counts"] = {"loss": int((batch["targets"] != IGNORE).sum())}
        return batch

    def training_batches(self, labeled: Batches, tok: TextTokenizer, max_length: int, batch_size: int, seed: int
                         ) -> tuple[Batches, int]:
        """The labeled batches; with ``cvt_unlabeled``, cross-view training's alternation of them with
        batches of the unlabeled text (Clark et al. 2018, §3.1; :func:`.cvt.alternate`)."""
        if self.cvt_unlabeled is None:
            return super().training_batches(labeled, tok, max_length, batch_size, seed)
        return cvt.alternate(labeled, self.unlabeled(), tok, max_length=max_length, batch_size=batch_size, seed=seed)

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        """A linear head on every position; with ``head=mlp`` CVT's primary module alone; with
        ``cvt_unlabeled`` the whole :class:`.cvt.CrossViewModel`, which needs a bidirectional recurrent
        backbone of two or more layers."""
        if self.cvt_unlabeled is None:
            if self.head == "mlp":
                return cvt.CrossViewModel(backbone, n_labels, dropout, views=False)
            return TokenModel(backbone, n_labels, dropout)
        self.check_model(backbone.config)
        return cvt.CrossViewModel(backbone, n_labels, dropout)

    def check_model(self, model: ModelConfig) -> None:
        """With ``cvt_unlabeled``, fail (naming --from) on a backbone cross-view training cannot use
        (:func:`.cvt.check_backbone`)."""
        super().check_model(model)
        if self.cvt_unlabeled is not None:
            cvt.check_backbone(model)

    def tags(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]
             ) -> list[list[str]]:
        """The predicted tag of every word: the arg-max at its first subword, ``O`` where it has none."""
        tags: list[list[str]] = [[] for _ in examples]
        for feature, logits in zip(features, outputs):
            best = logits.argmax(-1).tolist()
            tags[feature["example"]] = [labels[best[p]] if p >= 0 else OUTSIDE for p in feature["first"]]
        return tags

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        return conll_report([row["tags"] for row in examples], self.tags(examples, features, outputs, labels))

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        return [{"words": row["words"], "tags": tags}
                for row, tags in zip(examples, self.tags(examples, features, outputs, labels))]

    def write(self, examples: list[dict], predictions: list[dict], path: str | Path) -> None:
        """CoNLL columns ``token gold predicted`` (``token predicted`` for unlabeled input), a blank line
        after each sentence: the input the ``conlleval`` script reads."""
        with open(path, "w", encoding="utf-8") as out:
            for row, prediction in zip(examples, predictions, strict=True):
                gold = row.get("tags")
                for j, (word, tag) in enumerate(zip(row["words"], prediction["tags"], strict=True)):
                    out.write(" ".join([word, *([gold[j]] if gold else []), tag]) + "\n")
                out.write("\n")
