"""SpanBERT (Joshi et al. 2020): span masking and the span boundary objective, on single segments.

* Span masking (§3.1, :func:`.masking.span_units`): spans of complete words, their lengths in words
  ℓ ~ Geo(0.2) truncated at 10 (mean 3.8), their starts uniform over the words, drawn until 15% of the
  tokens are covered; 80/10/10 is decided per span, so a whole span is masked, replaced or kept.
* Span boundary objective (§3.2): each token x_i of a span x_s..x_e is predicted from the encodings
  of the boundary tokens and a relative position embedding,
  h0 = [x_{s−1}; x_{e+1}; p_{i−s+1}], h1 = LayerNorm(GeLU(W1·h0)), y_i = LayerNorm(GeLU(W2·h1)),
  then the output embedding tied to the input one (with its own bias, like the MLM head's).
  Each span token's loss is L_MLM(x_i) + L_SBO(x_i), summed over the span tokens.
* No next-sentence prediction: one segment per example (§3.3).

Choices the paper leaves open: p has the hidden width and is indexed by i − s up to the backbone's
``max_positions``; W1 and W2 have biases; W2 maps to the embedding width, as the MLM head does, so
the tied output works under ALBERT's factorised embedding.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models import Transformer
from ..tokenizer import SpecialIds, TextTokenizer
from .base import AT_LEAST_ONE, FRACTION
from .masking import span_units, word_index
from .mlm import MaskedLM, masked_entries, masked_loss, padded


def span_edges(unit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a (batch, time) map of span indices (−1 outside spans), the first and the last position of
    the span each position belongs to (meaningful at positions inside a span only)."""
    b, t = unit.shape
    pos = torch.arange(t).expand(b, t)
    none = unit.new_full((b, 1), -1)
    inside = unit >= 0
    begins = inside & (unit != torch.cat([none, unit[:, :-1]], 1))
    ends = inside & (unit != torch.cat([unit[:, 1:], none], 1))
    first = torch.where(begins, pos, 0).cummax(1).values
    last = torch.where(ends, pos, t - 1).flip(1).cummin(1).values.flip(1)
    return first, last


class SpanBERT(MaskedLM):
    """Span masking with the MLM head plus the span boundary objective's head.

    ``make_batch`` returns ``ids``, ``positions``, ``targets`` and ``masked`` as :class:`MaskedLM`, and per
    target the flattened positions of its span's boundary tokens, ``left`` (s − 1) and ``right`` (e + 1), and
    its ``offsets`` i − s in the span (the [CLS] and [SEP] around each row ensure both boundaries exist), each
    padded with zeros as ``positions`` is.
    """

    name = "span"
    part_names = ("mlm", "sbo")
    options = ("max_span", "p", "rate")
    maskings = ("span",)
    bounds = {"rate": FRACTION, "p": FRACTION, "max_span": AT_LEAST_ONE}

    def __init__(self, backbone: Transformer, specials: SpecialIds, word_starts: torch.Tensor, rate: float = 0.15,
                 p: float = 0.2, max_span: int = 10):
        super().__init__(backbone, specials, rate, masking="span", word_starts=word_starts)
        cfg = backbone.config
        hidden, width = cfg.hidden, cfg.embedding_width
        self.p, self.max_span = p, max_span
        self.relative = nn.Embedding(cfg.max_positions, hidden)
        self.boundary = nn.Sequential(nn.Linear(3 * hidden, hidden), nn.GELU(),
                                      nn.LayerNorm(hidden, eps=cfg.layer_norm_eps),
                                      nn.Linear(hidden, width), nn.GELU(), nn.LayerNorm(width, eps=cfg.layer_norm_eps))
        self.boundary_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        for layer in (self.relative, self.boundary[0], self.boundary[3]):
            nn.init.normal_(layer.weight, std=0.02)
        nn.init.zeros_(self.boundary[0].bias)
        nn.init.zeros_(self.boundary[3].bias)

    @classmethod
    def build(cls, backbone: Transformer, tokenizer: TextTokenizer, **options) -> "SpanBERT":
        return cls(backbone, tokenizer.specials, tokenizer.word_starts(), **options)

    def batch_units(self, ids: torch.Tensor, generators: list[torch.Generator]) -> tuple[torch.Tensor, list[int]]:
        """Sequences (batch, L) → ``(span of each selected position, −1 elsewhere; number of spans of each row)``."""
        word = word_index(ids, self.special_ids, self.word_starts)
        return span_units(word, self.rate, generators, self.p, self.max_span)

    def masked(self, ids: torch.Tensor, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        corrupted, unit = self.corrupt_units(ids, generators)
        batch = self.selection(ids, corrupted, unit >= 0)
        first, last = span_edges(unit)
        row_start = torch.arange(0, unit.numel(), unit.shape[1])[:, None]
        at, size = masked_entries(batch, "positions"), len(batch["positions"])
        batch["left"] = padded((row_start + first - 1).flatten()[at], size)
        batch["right"] = padded((row_start + last + 1).flatten()[at], size)
        batch["offsets"] = padded((torch.arange(unit.shape[1]) - first).flatten()[at], size)
        batch["counts"] = dict.fromkeys(self.part_names, batch["masked"])
        return batch

    def sbo_loss(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Summed cross-entropy of each span token predicted from its span's boundaries (§3.2); the padding
        entries of ``positions`` have boundaries at position 0 and offset 0, left out by :func:`masked_loss`."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        h0 = torch.cat([flat[batch["left"]], flat[batch["right"]], self.relative(batch["offsets"])], 1)
        return masked_loss(self.boundary, h0, batch, self.backbone.embed.tokens.weight, self.boundary_bias,
                           self.workspace)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The summed MLM and span-boundary losses, over the same selected tokens."""
        hidden = self.backbone(batch["ids"])
        return {"mlm": self.mlm_loss(hidden, batch), "sbo": self.sbo_loss(hidden, batch)}
