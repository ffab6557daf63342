"""Masked language modelling (BERT, Devlin et al. 2019, §3.1 and Appendix A.1), by token, whole word or phrase.

15% of the non-special tokens of each sequence are selected; of those, 80% are replaced by
[MASK], 10% by a random (non-special) token and 10% are left unchanged. The loss is the
cross-entropy of the original token at the selected positions only, and the vocabulary projection
is computed only there, chunk by chunk and fused with the loss (``projection.linear_cross_entropy``).
Masks are drawn afresh every time a sequence is seen (dynamic masking, RoBERTa, Liu et al. 2019).

Static shapes. The number of selected tokens varies from batch to batch, and under ``--compile`` every new
count of gathered positions would be a new shape to compile. As in cramming (Geiping & Goldstein 2022, whose
code predicts a fixed number of positions per batch, ``_forward_sparse``), a batch's ``positions`` are padded to a
count fixed by the batch's shape (:func:`fixed_count`), with padding entries whose target is :data:`IGNORE`.
Deviation from cramming, which keeps exactly round(0.15·tokens) positions, dropping any excess masked ones, and
fills the rest with unmasked positions ignored by the loss: nothing is dropped (the padded
count is a bound that Bernoulli(0.15) selection exceeds with probability about 3·10⁻⁵; a batch that does exceed it
is padded to the next multiple of :data:`PAD_MULTIPLE`, a new shape), and the selection itself is unchanged. The
heads and the loss (:func:`masked_loss`) run eagerly, outside the compiled graph, on the real entries only, so the
loss and every gradient are bitwise those of the unpadded batch.

``masking`` chooses what is selected (see :mod:`.masking`):

* ``token``: each token independently. Deviation: a Bernoulli(0.15) draw per token (as in RoBERTa
  and Hugging Face) rather than exactly round(0.15·n) positions per sequence.
* ``whole_word``: BERT's whole-word masking: whole words in random order until round(0.15·n) tokens
  are covered, 80/10/10 decided per word.
* ``phrase``: ERNIE's phrase/entity-level masking (Sun et al. 2019, §3.2): each occurrence of a
  given phrase is masked as a whole, as one unit among the other words. ERNIE finds phrases and
  entities with a chunker and a recogniser; here they are a list given as text. Without a list, the
  units are random n-grams of up to ``ngram`` words (ALBERT's n-gram masking, Lan et al. 2020, §4.1).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from ..models import Transformer
from ..models.transformer import activation
from ..tokenizer import SpecialIds, TextTokenizer
from .base import AT_LEAST_ONE, FRACTION, Objective
from .masking import (mask_rows, mask_units, mask_weighted_rows, ngram_units, phrase_table, phrase_units,
                      replacement_pool, select_words, word_index)
from .projection import Workspace, linear_cross_entropy

IGNORE = -100  # the target of a padding entry of ``positions``
PAD_MULTIPLE = 8  # padded counts are multiples of this
SPREAD = 4.0  # standard deviations of Bernoulli selection the fixed count allows above its mean


def fixed_count(n_tokens: int, rate: float, selected: int) -> int:
    """How many entries a batch of ``n_tokens`` tokens (specials included) pads its ``selected`` positions to: the
    mean of Bernoulli(``rate``) selection plus :data:`SPREAD` standard deviations, a function of the batch's shape
    only, or ``selected`` where that is more; rounded up to a multiple of :data:`PAD_MULTIPLE`. Whole-word, phrase
    and span selection take round(rate·n) tokens a sequence (the last span up to part of a word more), which the
    bound holds unless most sequences of a large batch overshoot."""
    expected = rate * n_tokens
    bound = math.ceil(expected + SPREAD * math.sqrt(expected * (1 - rate)))
    return -(-max(bound, selected) // PAD_MULTIPLE) * PAD_MULTIPLE


def padded(values: torch.Tensor, size: int, fill: int = 0) -> torch.Tensor:
    """``values`` (1-D) followed by ``fill`` up to ``size`` entries."""
    return torch.cat([values, values.new_full((size - len(values),), fill)])


def gather_selected(ids: torch.Tensor, selected: torch.Tensor, rate: float) -> dict[str, torch.Tensor | int]:
    """The flattened ``positions`` of the ``selected`` tokens of ``ids`` and their ``targets`` (the tokens there),
    padded at the end to :func:`fixed_count` entries (position 0, a [CLS] never selected; target :data:`IGNORE`),
    and ``masked``: how many of the entries are real (the first ones)."""
    positions = selected.flatten().nonzero().squeeze(1)
    size = fixed_count(ids.numel(), rate, len(positions))
    return {"positions": padded(positions, size), "targets": padded(ids.flatten()[positions], size, IGNORE),
            "masked": len(positions)}


def masked_entries(batch: dict, key: str) -> torch.Tensor:
    """The real entries of a padded per-position field of ``batch`` (``positions``, ``targets``, ...)."""
    return batch[key][: batch["masked"]]


@torch.compiler.disable
def masked_loss(head: nn.Module, rows: torch.Tensor, batch: dict, weight: torch.Tensor, bias: torch.Tensor,
                workspace: Workspace) -> torch.Tensor:
    """Summed cross-entropy of the tied projection of ``head`` applied to the real ones of ``rows`` (gathered at
    the padded positions) against their targets. Eager under ``--compile`` (a graph break): the padding is
    dropped before the head, so the real count, which varies, never reaches a compiled graph, and the result and
    gradients are exactly those of the unpadded rows (padded rows in the head's LayerNorm would change the rounding
    of its gradient sums)."""
    return linear_cross_entropy(head(rows[: batch["masked"]]), weight, masked_entries(batch, "targets"), bias,
                                workspace=workspace)


class MaskedLM(Objective):
    """BERT's masked LM with its prediction head (dense → GELU → LayerNorm → tied decoder + bias). The
    head's GELU is the backbone's (exact, or the tanh approximation ALBERT was trained with), as in
    BERT's and ALBERT's released heads, which both apply the model's ``hidden_act``.

    ``decoder="untied"`` gives the head an output matrix of its own, started as a copy of the token table (so the
    first scores are the tied head's) and trained apart from it: the table then learns from the model's inputs
    alone. A deliberate departure from BERT, whose decoder is the table (Devlin et al. 2019, after Press & Wolf
    2017), for a table that starts from counts (``--embedding-init ppmi``), which the output side's gradients wear
    down (docs/results/time_to_quality.md). Weights of a tied run loaded into an untied head start its decoder as
    their table.

    ``word_starts`` (a bool per vocabulary entry, :meth:`TextTokenizer.word_starts`) is needed by
    every ``masking`` but ``token``; ``phrase_ids`` are the phrases as token ids (``build`` tokenizes
    the ``phrases`` of the run's options). ``token_weights`` (a weight per vocabulary entry; None: uniform), which
    DistilBERT's pre-training sets (:class:`sesame.objectives.distillation.MaskedLMDistillation`), makes ``token``
    masking select tokens in proportion to them (:func:`.masking.mask_weighted_rows`).
    """

    token_weights: torch.Tensor | None = None

    name = "mlm"
    options = ("decoder", "masking", "ngram", "phrases", "rate")
    maskings = ("token", "whole_word", "phrase")
    decoders = ("tied", "untied")
    choices = {"masking": maskings, "decoder": decoders}
    bounds = {"rate": FRACTION, "ngram": AT_LEAST_ONE}

    def __init__(self, backbone: Transformer, specials: SpecialIds, rate: float = 0.15, masking: str = "token",
                 word_starts: torch.Tensor | None = None, phrase_ids: Sequence[Sequence[int]] | None = None,
                 ngram: int = 3, decoder: str = "tied"):
        super().__init__(backbone, specials)
        if masking not in self.maskings:
            raise ValueError(f"masking {masking!r}: choose one of {', '.join(self.maskings)}")
        if decoder not in self.decoders:
            raise ValueError(f"decoder {decoder!r}: choose one of {', '.join(self.decoders)}")
        if masking != "token" and word_starts is None:
            raise ValueError(f"{masking} masking needs word_starts; build the objective with its tokenizer")
        if phrase_ids and masking != "phrase":
            raise ValueError(f"phrases are for masking='phrase', not {masking!r}")
        cfg = backbone.config
        self.rate, self.masking, self.ngram = rate, masking, ngram
        self.phrases = phrase_table(phrase_ids or [])
        # the batch's tables on the CPU, where batches are made (plain attributes: see Objective.__init__)
        self.word_starts, self.pool = word_starts, replacement_pool(cfg.vocab_size, self.special_ids)
        width = cfg.embedding_width  # the tied decoder's input width (E < H under ALBERT's factorisation)
        self.transform = nn.Sequential(nn.Linear(cfg.hidden, width), activation(cfg.activation),
                                       nn.LayerNorm(width, eps=cfg.layer_norm_eps))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.register_parameter("decoder", nn.Parameter(backbone.embed.tokens.weight.detach().clone())
                                if decoder == "untied" else None)
        nn.init.normal_(self.transform[0].weight, std=0.02)
        nn.init.zeros_(self.transform[0].bias)
        self.workspace = Workspace()

    @property
    def output_weight(self) -> torch.Tensor:
        """The decoder's (vocabulary, width) matrix: the token table (tied), or the head's own (untied)."""
        return self.backbone.embed.tokens.weight if self.decoder is None else self.decoder

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        table = prefix + "backbone.embed.tokens.weight"
        if self.decoder is not None and prefix + "decoder" not in state_dict and table in state_dict:
            state_dict[prefix + "decoder"] = state_dict[table]  # a tied run's weights: the decoder starts as its table
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def build(cls, backbone: Transformer, tokenizer: TextTokenizer, phrases: Sequence[str] | None = None,
              **options) -> "MaskedLM":
        """Tokenize ``phrases`` both as they are and after a space (how byte-level BPE sees a word inside a line)."""
        phrase_ids = tokenizer.encode([t for p in phrases for t in (p, " " + p)], special=False) if phrases else None
        return cls(backbone, tokenizer.specials, word_starts=tokenizer.word_starts(), phrase_ids=phrase_ids,
                   **options)

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        return seq_len - 2  # room for [CLS] and [SEP]

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        b = windows.shape[0]
        cls = torch.full((b, 1), self.specials.cls, dtype=windows.dtype)
        sep = torch.full((b, 1), self.specials.sep, dtype=windows.dtype)
        return self.masked(torch.cat([cls, windows, sep], dim=1), generators)

    def units(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """One sequence → ``(unit of each selected position, −1 elsewhere; number of units)`` (:meth:`batch_units`)."""
        unit, n_units = self.batch_units(ids[None], [generator])
        return unit[0], n_units[0]

    def batch_units(self, ids: torch.Tensor, generators: list[torch.Generator]) -> tuple[torch.Tensor, list[int]]:
        """Sequences (batch, L) → ``(unit of each selected position, −1 elsewhere; number of units of each row)``,
        row ``i`` drawing from ``generators[i]``."""
        word = word_index(ids, self.special_ids, self.word_starts)
        if self.masking == "whole_word":
            unit_of_word = torch.arange(int(word.max()) + 1).expand(len(word), -1)
        elif self.phrases:
            unit_of_word = pad_sequence([phrase_units(row, w, self.phrases) for row, w in zip(ids, word)],
                                        batch_first=True)
        else:
            unit_of_word = ngram_units(word, self.ngram, generators)
        return select_words(word, unit_of_word, self.rate, generators)

    def corrupt_units(self, ids: torch.Tensor, generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequences (batch, L) → ``(corrupted ids, unit of each position)``, 80/10/10 decided per unit."""
        unit, n_units = self.batch_units(ids, generators)
        return mask_units(ids, unit, n_units, self.specials.mask, self.pool, generators), unit

    def corrupt_rows(self, ids: torch.Tensor, generators: Sequence[torch.Generator]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of sequences, row i drawing from ``generators[i]`` alone → ``(corrupted ids, selected
        positions)``, on the whole batch at once (:func:`.masking.mask_rows`, :meth:`corrupt_units`)."""
        if self.token_weights is not None:
            return mask_weighted_rows(ids, self.token_weights, self.specials.mask, self.pool, generators,
                                      rate=self.rate)
        if self.masking == "token":
            return mask_rows(ids, self.special_ids, self.specials.mask, self.pool, generators, rate=self.rate)
        corrupted, unit = self.corrupt_units(ids, generators)
        return corrupted, unit >= 0

    def corrupt(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence → ``(corrupted ids, selected positions)`` (:meth:`corrupt_rows`)."""
        corrupted, selected = self.corrupt_rows(ids[None], [generator])
        return corrupted[0], selected[0]

    def masked(self, ids: torch.Tensor, generators: Sequence[torch.Generator]) -> dict[str, torch.Tensor]:
        """Corrupt each row of the model inputs ``ids``: the batch of :meth:`selection`, its loss counting the
        selected tokens. Units of words are chosen and corrupted for the whole batch at once, as tokens are."""
        batch = self.selection(ids, *self.corrupt_rows(ids, generators))
        return {**batch, "counts": {"loss": batch["masked"]}}

    def selection(self, ids: torch.Tensor, corrupted: torch.Tensor, selected: torch.Tensor) -> dict[str, torch.Tensor]:
        """The batch: corrupted ``ids``, the padded flattened ``positions`` of the selected tokens, their
        ``targets`` and the number of real ones, ``masked`` (:func:`gather_selected`)."""
        return {"ids": corrupted, **gather_selected(ids, selected, self.rate)}

    def mlm_loss(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Summed cross-entropy of the original tokens at the selected positions (gathered at the padded
        positions, a shape fixed by the batch's; the head on the real ones: :func:`masked_loss`)."""
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["positions"])
        return masked_loss(self.transform, picked, batch, self.output_weight, self.bias, self.workspace)

    def masked_logits(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The head's scores over the vocabulary at the real selected positions, ``[masked, vocab]`` (the whole
        distribution, which distillation's soft targets need; the loss alone takes :meth:`mlm_loss`'s fused path)."""
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, masked_entries(batch, "positions"))
        return F.linear(self.transform(picked), self.output_weight, self.bias)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.mlm_loss(self.backbone(batch["ids"]), batch)
