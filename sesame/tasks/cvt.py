"""Cross-view training for tagging (Clark et al. 2018, "Semi-Supervised Sequence Modeling with
Cross-View Training"; docs/cvt.md): the ``cvt_unlabeled`` option of ``--task tag``.

On labeled sentences the primary module learns the gold tags; on unlabeled ones, auxiliary modules
that read restricted views of the encoder learn to match the primary's predictions (§3.1). This
module holds the model (:class:`CrossViewModel`: its prediction modules, views and both losses), the
backbone it needs (:func:`check_backbone`), the unlabeled text (:func:`read_sentences`), its batches
(:func:`unlabeled_batch`) and their alternation with the labeled ones (:func:`alternate`). The tagging
task (:mod:`.tag`) calls these when its option is set and knows nothing else of CVT.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..data.labeled import read_text
from ..errors import SesameError
from ..models import ModelConfig, Recurrent, Transformer
from ..models.padding import real_tokens
from ..tokenizer import TextTokenizer
from ..train.trainer import world
from .base import Batches, TaskModel
from .classify import collate
from .words import DOCSTART, encode_words, first_subwords, word_loss

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
    """Cross-view training for tagging (Clark et al. 2018, §3.1–3.2) on a bidirectional recurrent
    backbone of two or more layers.

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

    def __init__(self, backbone: Recurrent | Transformer, n_labels: int, dropout: float = 0.1, *,
                 views: bool = True):
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
            return word_loss(self.outputs(batch), batch["targets"])
        targets = self.soft_targets(batch)
        loss = targets.new_zeros(())
        for logits, valid in self.views(batch).values():
            # every position is scored and the invalid ones zeroed: selecting with ``logits[valid]`` would make
            # the host wait for the device to learn how many positions there are
            kl = F.kl_div(F.log_softmax(logits.float(), -1), targets, log_target=True, reduction="none").sum(-1)
            loss = loss + torch.where(valid, kl, 0.0).sum()
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
        inside = after < real_tokens(batch["ids"], batch["padding"]).sum(1, keepdim=True)
        states = {"fwd": (forward, words), "bwd": (backward, words), "future": (previous, words & starts),
                  "past": (following, words & inside)}
        return {view: (self.auxiliary[view](h), valid) for view, (h, valid) in states.items()}


def check_backbone(cfg: ModelConfig) -> None:
    """Fail, naming --from, unless the backbone (its config) is a bidirectional recurrent stack of
    two or more layers: the views split the first layer by direction and the primary also reads a
    higher one (§3.2)."""
    directions = getattr(cfg, "directions", None)  # a stack whose states split into a forward and a backward run
    if directions != 2 or cfg.layers < 2:
        kind = (f"a {'causal' if cfg.causal else 'bidirectional'} {cfg.layers}-layer recurrent one" if directions
                else f"a {type(cfg).__name__.removesuffix('Config').lower()}")
        raise SesameError(f"--from: cross-view training (cvt_unlabeled) needs a bidirectional recurrent backbone "
                          f"of 2 or more layers (e.g. --from scratch:bilstm:mini), but the backbone is {kind}")


def read_sentences(path: str) -> list[list[str]]:
    """The unlabeled text: one sentence per line, words split at whitespace, blank lines skipped; a
    CoNLL file given by mistake fails at its first document line."""
    sentences = []
    for lineno, line in enumerate(read_text(Path(path), "a text file, one sentence per line").splitlines(), 1):
        words = line.split()
        if words and words[0] == DOCSTART:
            raise SesameError(f"{path}:{lineno}: a CoNLL document line; cvt_unlabeled takes plain text, one "
                              "sentence per line (join each sentence's words with spaces)")
        if words:
            sentences.append(words)
    return sentences  # not empty: read_text rejects a blank file


def unlabeled_batch(sentences: list[list[str]], tok: TextTokenizer, max_length: int) -> dict[str, torch.Tensor]:
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


def alternate(labeled: Batches, sentences: list[list[str]], tok: TextTokenizer, *, max_length: int,
              batch_size: int, seed: int) -> tuple[Batches, int]:
    """Cross-view training's alternation (§3.1) as the trainer's ``batches(step, progress)``, and its
    stride 2: even trainer steps 2k are the k-th labeled step (``labeled(k, progress)``), odd steps an
    :func:`unlabeled_batch` of ``batch_size`` sentences. The sentences are read in passes, each in an
    order drawn from (``seed``, pass), so a step's sentences depend on (seed, step) alone and resuming
    reproduces the run."""
    if world()[1] > 1:
        raise SesameError("cvt_unlabeled: not supported under torchrun (the primary and the auxiliary modules "
                          "learn on alternate steps, which DistributedDataParallel rejects); run in one process")
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
        return [unlabeled_batch(chosen, tok, max_length)]

    return batches, 2
