"""Token classification (``tag``): a label per word, for named entities (CoNLL-2003) or parts of speech.

Files are CoNLL columns: one word per line with its annotations separated by whitespace
(CoNLL-2003: ``token POS chunk NER``), a blank line between sentences, ``-DOCSTART-`` lines between
documents (skipped). ``token_column`` and ``label_column`` pick the columns (0 is the first, -1 the
last: NER in CoNLL-2003; 1 is its POS tag).

A sentence is encoded from its words (``cls w1 … wn sep``), so every subword knows its word. As in
BERT's NER (Devlin et al. 2019, §5.3), the head is a linear layer on the final hidden state of each
word's first subword: the loss reads only those positions; continuation subwords and special tokens
are ignored. Words cut off by ``max_length`` (or that a tokenizer turns into nothing) are predicted
``O`` and still count as gold in evaluation, so truncation cannot inflate a score.

Dev metrics are those of the CoNLL-2000/2003 ``conlleval`` script (Tjong Kim Sang & Buchholz 2000;
Tjong Kim Sang & De Meulder 2003): entity-level precision, recall and F1, where an entity counts as
found only when its span and type both match, with the script's own rules for where chunks start
and end. They read IOB2 (every entity starts with ``B-``) and IOB1 (``B-`` only between two adjacent
entities of one type; Ramshaw & Marcus 1995) alike: an ``I-`` after ``O`` or after another type
starts an entity. Token accuracy is reported too (the metric for POS tags, which form no entities:
choose it with ``--select accuracy``).

Cross-view training (Clark et al. 2018; docs/cvt.md): ``--task-option cvt_unlabeled=FILE`` (plain text,
one sentence per line) makes the model a :class:`CrossViewModel` on a bidirectional recurrent backbone
and alternates labeled batches with batches of that text, on which auxiliary modules reading
restricted views learn to match the full model. Prediction uses the primary module and never reads FILE.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.labeled import read_text
from ..errors import SesameError
from ..metrics import conll_report
from ..models import Recurrent, Transformer
from ..tokenizer import TextTokenizer
from ..train.trainer import world
from .base import Batches, Task, TaskModel, label_vocabulary, pad, register
from .classify import collate

DOCSTART = "-DOCSTART-"
IGNORE = -100  # target of positions the loss skips (F.cross_entropy's ignore_index)
OUTSIDE = "O"  # the prediction for a word without a subword in the model's window


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
        return self.head(self.dropout(self.backbone(batch["ids"], None, padding=batch["padding"])))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy summed over the labeled positions (``targets`` ≠ -100)."""
        logits = self.outputs(batch)
        return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=IGNORE, reduction="sum")


CVT_VIEWS = ("fwd", "bwd", "future", "past")  # the paper's names of the four views (§3.2)


class PredictionModule(nn.Module):
    """A prediction module of cross-view training (Clark et al. 2018, §3.1): one hidden ReLU layer and a
    softmax over the tags, softmax(U · ReLU(W · h) + b), here with dropout on its input h; returns logits."""

    def __init__(self, inputs: int, hidden: int, n_labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.hidden = nn.Linear(inputs, hidden)
        self.out = nn.Linear(hidden, n_labels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.dropout(h))))


class CrossViewModel(TaskModel):
    """Cross-view training for tagging (Clark et al. 2018, "Semi-Supervised Sequence Modeling with
    Cross-View Training", §3.1–3.2) on a bidirectional recurrent backbone of two or more layers.

    The primary module reads both layers' states, NN(h1_t ⊕ h2_t) (§3.2; the first and the top layer of a
    deeper stack); four auxiliary modules read
    restricted views of the first layer (§3.2): forward h→1_t, backward h←1_t, future h→1_{t-1} (has not
    seen word t) and past h←1_{t+1} (has seen only the words after t). ``forward(batch)`` is, on a
    labeled batch (one with ``targets``), the primary's cross-entropy on the gold tags, summed (L_sup;
    only the primary learns from labels, as in the paper); on an unlabeled batch, the CVT loss summed
    over words, L_CVT = Σ_t Σ_j KL(p_θ(y_t|x) ‖ p_θ^j(y_t|x)) (§3.1), where the primary's p_θ is
    computed without dropout and without gradient (a fixed target) and the auxiliaries with dropout.
    The trainer divides each by the batch's ``counts`` (labeled words; unlabeled words), so both are
    means per word where the paper averages per sentence. Predictions use the primary alone. With
    ``views=False`` the model is the primary tagger alone, on any backbone: the supervised baseline
    of the paper's comparison (task option ``head=mlp``).

    Deviations: a module's hidden layer is half as wide as its input, i.e. one direction of the layer
    it reads (a choice of this code); the encoder is the word-level ``Recurrent`` stack, without the paper's
    character CNN; with a subword tokenizer a word's past view is the backward state at the first token
    after the word's last subword (with a word-level tokenizer, simply the next token).
    """

    def __init__(self, backbone: Recurrent | Transformer, n_labels: int, dropout: float = 0.1, views: bool = True):
        super().__init__()
        self.backbone = backbone
        cfg = backbone.config
        first = cfg.layer_width(0) * cfg.directions if isinstance(backbone, Recurrent) else cfg.hidden
        self.primary = PredictionModule(first + cfg.hidden, cfg.hidden // 2, n_labels, dropout)
        width = cfg.layer_width(0) if views else 0  # one direction of the first layer
        self.auxiliary = nn.ModuleDict({view: PredictionModule(width, width, n_labels, dropout)
                                        for view in (CVT_VIEWS if views else ())})

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The primary module's logits ``[B, W, n_labels]``, from the first and the top layer's states."""
        layers = self.backbone(batch["ids"], None, padding=batch["padding"], all_layers=True)
        return self.primary(torch.cat([layers[1], layers[-1]], -1))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if "targets" in batch:
            logits = self.outputs(batch)
            return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=IGNORE,
                                   reduction="sum")
        targets = self.soft_targets(batch)
        loss = targets.new_zeros(())
        for logits, valid in self.views(batch).values():
            loss = loss + F.kl_div(F.log_softmax(logits[valid].float(), -1), targets[valid], log_target=True,
                                   reduction="sum")
        return loss

    def soft_targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """log p_θ(y|x): the primary on the full input with dropout off and no gradient (§3.1: the
        auxiliaries learn to match it, the primary is not pulled towards them)."""
        modes = [(module, module.training) for module in (self.backbone, self.primary)]
        try:
            for module, _ in modes:
                module.eval()
            with torch.no_grad():
                return F.log_softmax(self.outputs(batch).float(), -1)
        finally:
            for module, mode in modes:
                module.train(mode)

    def views(self, batch: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per auxiliary module: its logits ``[B, W, n_labels]`` at every position and where it predicts
        (``[B, W]`` bool): at the words' first subwords (``batch["after"]`` ≥ 0) whose view lies inside
        the row. ``after`` holds, at a word's first subword, the position after the word's last subword."""
        first = self.backbone(batch["ids"], None, padding=batch["padding"], all_layers=True)[1]
        forward, backward = first.chunk(2, -1)  # the forward direction's features come first
        after = batch["after"]
        words = after >= 0
        previous = torch.cat([forward.new_zeros(forward.shape[0], 1, forward.shape[2]), forward[:, :-1]], 1)
        following = backward.gather(1, after.clamp(0, after.shape[1] - 1)[..., None].expand_as(backward))
        starts = torch.arange(after.shape[1], device=after.device) >= 1
        inside = after < batch["padding"].sum(1, keepdim=True)
        states = {"fwd": (forward, words), "bwd": (backward, words), "future": (previous, words & starts),
                  "past": (following, words & inside)}
        return {view: (self.auxiliary[view](h), valid) for view, (h, valid) in states.items()}


def word_inputs(words: Sequence[str], kind: str) -> list[str]:
    """The words as the tokenizer should see them one by one: byte-level BPE marks a word that follows
    a space by a leading space (GPT-2's ``Ġ``), so every word but the first gets one back and the
    subwords are those of the running text ``" ".join(words)``."""
    return [w if j == 0 or kind != "bpe" else " " + w for j, w in enumerate(words)]


def encode_words(sentences: Sequence[Sequence[str]], tok: TextTokenizer, max_length: int) -> list:
    """The tokenizer's encodings of pre-split sentences (``cls w1 … wn sep``), cut to ``max_length``."""
    tok.backend.enable_truncation(max_length)
    try:
        return tok.backend.encode_batch([word_inputs(words, tok.kind) for words in sentences], is_pretokenized=True)
    finally:
        tok.backend.no_truncation()


def first_subwords(word_ids: Sequence[int | None], n_words: int) -> list[int]:
    """Per word, the position of its first subword (from an Encoding's ``word_ids``), or -1 if it has none."""
    first = [-1] * n_words
    for position, word in enumerate(word_ids):
        if word is not None and first[word] < 0:
            first[word] = position
    return first


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
    token_column: int = 0
    label_column: int = -1
    cvt_unlabeled: str | None = None  # a text file, one sentence per line: cross-view training (CrossViewModel)
    head: str | None = None  # linear (BERT's), or mlp (CVT's primary module); default: mlp with cvt_unlabeled

    def __post_init__(self) -> None:
        self.token_column = _column(self.token_column, "token_column")
        self.label_column = _column(self.label_column, "--label-column")
        self._unlabeled: list[list[str]] | None = None  # read when training, never when predicting
        if self.head not in (None, "linear", "mlp"):
            raise SesameError(f"--task-option head={self.head}: choose linear or mlp")
        if self.head == "linear" and self.cvt_unlabeled is not None:
            raise SesameError("--task-option head=linear: cross-view training (cvt_unlabeled) predicts with its mlp "
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

        for lineno, line in enumerate(read_text(Path(path)).splitlines(), 1):
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

    def labels(self, train: list[dict], path: str) -> list[str]:
        """The tags of the training file. Fine-tuning with ``cvt_unlabeled`` also reads the unlabeled text
        here, beside the training file, so a bad file fails before the run directory is written."""
        if self.cvt_unlabeled is not None:
            self.unlabeled()
        return label_vocabulary((tag for row in train for tag in row["tags"]), path, str(self.label_column))

    def unlabeled(self) -> list[list[str]]:
        """The sentences of ``cvt_unlabeled`` (words split at whitespace; blank lines skipped), read once."""
        if self._unlabeled is None:
            path = str(self.cvt_unlabeled)
            sentences = []
            for lineno, line in enumerate(read_text(Path(path)).splitlines(), 1):
                words = line.split()
                if words and words[0] == DOCSTART:
                    raise SesameError(f"{path}:{lineno}: a CoNLL document line; cvt_unlabeled takes plain text, one "
                                      "sentence per line (join each sentence's words with spaces)")
                if words:
                    sentences.append(words)
            self._unlabeled = sentences  # not empty: read_text rejects a blank file
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
        """Per sentence: ``ids``, ``first`` (each word's first subword position, -1 if cut off) and, when
        labeled, ``targets`` (the word's tag index at its first subword, -100 everywhere else)."""
        encodings = encode_words([row["words"] for row in examples], tok, max_length)
        index = {name: i for i, name in enumerate(labels)}
        features = []
        for i, (row, encoding) in enumerate(zip(examples, encodings)):
            first = first_subwords(encoding.word_ids, len(row["words"]))
            feature = {"example": i, "ids": encoding.ids, "first": first}
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
        if "targets" in features[0]:
            batch["targets"] = pad([f["targets"] for f in features], IGNORE)
            batch["counts"] = {"loss": int((batch["targets"] != IGNORE).sum())}
        return batch

    def training_batches(self, labeled: Batches, tok: TextTokenizer, max_length: int, batch_size: int, seed: int
                         ) -> tuple[Batches, int]:
        """With ``cvt_unlabeled``, cross-view training's alternation (Clark et al. 2018, §3.1): even trainer
        steps 2k are the k-th labeled step, odd steps a batch of ``batch_size`` unlabeled sentences. The
        unlabeled text is read in passes, each in an order drawn from (``seed``, pass), so a step's
        sentences depend on (seed, step) alone and resuming reproduces the run."""
        if self.cvt_unlabeled is None:
            return labeled, 1
        if world()[1] > 1:
            raise SesameError("cvt_unlabeled: not supported under torchrun (the primary and the auxiliary modules "
                              "learn on alternate steps, which DistributedDataParallel rejects); run in one process")
        sentences = self.unlabeled()
        orders: dict[int, list[int]] = {}

        def order(pass_: int) -> list[int]:
            if pass_ not in orders:
                orders.clear()
                generator = torch.Generator().manual_seed(seed * 1_000_003 + pass_)
                orders[pass_] = torch.randperm(len(sentences), generator=generator).tolist()
            return orders[pass_]

        def batches(step: int, progress: float) -> list[dict[str, torch.Tensor]]:
            k, unlabeled = divmod(step, 2)
            if not unlabeled:
                return labeled(k, progress)
            n = len(sentences)
            chosen = [sentences[order(i // n)[i % n]] for i in range(k * batch_size, (k + 1) * batch_size)]
            return [self.unlabeled_batch(chosen, tok, max_length)]

        return batches, 2

    def unlabeled_batch(self, sentences: list[list[str]], tok: TextTokenizer, max_length: int
                        ) -> dict[str, torch.Tensor]:
        """A batch of unlabeled sentences for :class:`CrossViewModel`: ``ids``, ``padding``, ``after`` (at
        each word's first subword the position after its last subword, -1 elsewhere) and ``counts``
        (the words, the terms L_CVT sums per view)."""
        encodings = encode_words(sentences, tok, max_length)
        batch = collate([e.ids for e in encodings], tok.specials.pad)
        after = torch.full_like(batch["ids"], -1)
        for row, (words, encoding) in enumerate(zip(sentences, encodings)):
            ends: dict[int, int] = {}
            for position, word in enumerate(encoding.word_ids):
                if word is not None:
                    ends[word] = position + 1
            for word, position in enumerate(first_subwords(encoding.word_ids, len(words))):
                if position >= 0:
                    after[row, position] = ends[word]
        batch["after"] = after
        batch["counts"] = {"loss": int((after >= 0).sum())}
        return batch

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        """A linear head on every position; with ``head=mlp`` CVT's primary module alone; with
        ``cvt_unlabeled`` the whole :class:`CrossViewModel`, which needs a bidirectional recurrent
        backbone of two or more layers."""
        if self.cvt_unlabeled is None:
            if self.head == "mlp":
                return CrossViewModel(backbone, n_labels, dropout, views=False)
            return TokenModel(backbone, n_labels, dropout)
        self.check_model(backbone.config.to_dict())
        return CrossViewModel(backbone, n_labels, dropout)

    def check_model(self, model: dict) -> None:
        """Fail, naming --from, when cross-view training is asked of a backbone (its config dict) that is
        not a bidirectional recurrent stack of two or more layers."""
        if self.cvt_unlabeled is None:
            return
        arch = model.get("arch", "transformer")
        if arch != "recurrent" or model["causal"] or model["layers"] < 2:
            kind = (f"a {'causal' if model['causal'] else 'bidirectional'} {model['layers']}-layer recurrent one"
                    if arch == "recurrent" else f"a {arch}")
            raise SesameError(f"--from: cross-view training (cvt_unlabeled) needs a bidirectional recurrent backbone "
                              f"of 2 or more layers (e.g. --from scratch:bilstm:mini), but the backbone is {kind}")

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
