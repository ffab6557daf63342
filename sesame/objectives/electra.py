"""ELECTRA: replaced token detection (Clark et al. 2020).

A small generator G, trained as a masked LM, fills the masked positions of each sequence with samples
x̂_i ~ p_G(x_i | x^masked); the discriminator D (``self.backbone``, the only part kept for fine-tuning)
predicts for every position whether its token is the original (§2). The loss is eq. (1),
L_MLM(x, θ_G) + λ·L_Disc(x, θ_D) with λ = 50 (Appendix A), and no gradient flows through the sampling.

* Inputs are [CLS] window [SEP]; 15% of the ordinary tokens are selected by independent Bernoulli
  draws (as in :mod:`~sesame.objectives.mlm`, where that deviation from a fixed count is noted) and
  replaced by [MASK], as §2 defines x^masked. The official code leaves 15% of the selected tokens unchanged
  instead (its ``pretrain_helpers.mask``): ``unchanged`` = 0.15 does so (default 0, §2's). Why it may matter at
  small scale: on windows that count up through 8 tokens, a 2-layer generator learns the rule within a few hundred
  steps with 15% left unchanged and stays at the unigram's ln 8 for thousands with every one masked (as BERT's
  masked LM does with its 10% unchanged and 10% random: docs/results/time_to_quality.md).
* G (§3.2, "Smaller generators") is a Transformer of width round(fraction·H), with max(1, width // 64)
  heads (fewer if needed to divide the width), feed-forward 4·width, and D's depth and norm style. It
  reads D's token, position and segment embeddings (§3.2, "Weight sharing": all embeddings tied)
  through its own E→width projection, so each tensor is stored once. Its head is BERT's MLM head
  (dense → GELU → LayerNorm → decoder tied to the token embeddings, + bias).
* G's samples are drawn for the whole batch at once by inverse transform: each masked position takes the first
  token whose cumulative softmax probability exceeds its own uniform draw, made in ``make_batch`` by its example's
  generator (so a sample is a function of (seed, step, example), however the batch is split, and the training step
  reads nothing back to the host). Up to float32 rounding of the cumulative sums this is exact sampling from p_G.
* A sample equal to the original counts as original (label 0, §2). D's head is the official one:
  dense → GELU → Linear(H, 1); L_Disc is the sigmoid cross-entropy over all non-padding positions.
* ``two_stage`` = p > 0 (§3.2, "Training algorithms") trains only G, with L_MLM, for the first
  fraction p of the run, then only D, with L_Disc and G frozen. Deviations: the paper starts D from
  G's weights, which needs equal sizes; here D keeps its own initialisation. And since the
  embeddings are D's, they keep training in the second stage while the rest of G stays frozen.
"""
from __future__ import annotations

import dataclasses
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from ..models import Transformer, TransformerConfig
from ..tokenizer import SpecialIds
from .base import FRACTION, POSITIVE, UNDER_ONE, Bound, Objective
from .masking import mask_rows, replacement_pool, uniforms
from .mlm import gather_selected, masked_entries
from .projection import Workspace, default_chunk_size, linear_cross_entropy, product_dtype


def generator_config(cfg: TransformerConfig, fraction: float) -> TransformerConfig:
    """The generator of a discriminator configured by ``cfg``: ``fraction`` of its width, as deep,
    reading embeddings of the discriminator's width E."""
    hidden = max(1, round(fraction * cfg.hidden))
    heads = max(1, hidden // 64)
    while hidden % heads:
        heads -= 1
    return dataclasses.replace(cfg, hidden=hidden, heads=heads, intermediate=4 * hidden,
                               embedding_size=cfg.embedding_width)


class Electra(Objective):
    """Generator + discriminator trained jointly (or in two stages) on replaced token detection.

    ``make_batch`` returns ``ids`` (G's masked input), ``positions`` (the masked positions of the
    flattened batch), ``targets`` (the original tokens there), both padded to a fixed count as MaskedLM's
    (:func:`~sesame.objectives.mlm.gather_selected`; ``masked`` real ones, the loss count), and
    ``draws`` (a uniform per position, from the row's generator, which G's sampling in ``forward`` reads at the
    masked positions).
    ``forward`` returns the summed losses ``{"mlm": ..., "disc": ...}`` and the batch counts their terms
    (masked tokens, positions), so the trainer minimises mean L_MLM + λ·mean L_Disc (``part_weights``).
    """

    name = "electra"
    options = ("disc_weight", "generator_fraction", "rate", "two_stage", "unchanged")
    part_names = ("mlm", "disc")
    bounds = {"rate": FRACTION, "generator_fraction": POSITIVE, "disc_weight": Bound("0 or more", lambda v: v >= 0),
              "two_stage": UNDER_ONE, "unchanged": UNDER_ONE}

    @cached_property
    def pool(self) -> torch.Tensor:
        """The ids a replacement is drawn from, a plain attribute (see Objective.__init__) made at the first batch:
        never for an objective built on the meta device to name its weights (an export), where it cannot be."""
        return replacement_pool(self.backbone.config.vocab_size, self.special_ids)

    def __init__(self, backbone: Transformer, specials: SpecialIds, generator_fraction: float = 0.25,
                 disc_weight: float = 50.0, two_stage: float = 0.0, rate: float = 0.15, unchanged: float = 0.0):
        super().__init__(backbone, specials)
        cfg = backbone.config
        self.two_stage, self.rate, self.unchanged = two_stage, rate, unchanged
        self.part_weights = {"disc": disc_weight}
        self.progress = 0.0
        self.generator = Transformer(generator_config(cfg, generator_fraction))
        self.generator.embed = None  # it reads the discriminator's embeddings
        width = cfg.embedding_width
        self.generator_head = nn.Sequential(nn.Linear(self.generator.config.hidden, width), nn.GELU(),
                                            nn.LayerNorm(width, eps=cfg.layer_norm_eps))
        self.generator_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.discriminator_head = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, 1))
        self.generator_head.apply(Transformer._init)
        self.discriminator_head.apply(Transformer._init)
        self.workspace = Workspace()

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        return seq_len - 2  # room for [CLS] and [SEP]

    def set_progress(self, fraction: float) -> None:
        """The fraction of the run spent, told by the trainer before every step (for ``two_stage``)."""
        self.progress = fraction

    @property
    def trains_generator(self) -> bool:
        return not self.two_stage or self.progress < self.two_stage

    @property
    def trains_discriminator(self) -> bool:
        return not self.two_stage or self.progress >= self.two_stage

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        b = windows.shape[0]
        cls = torch.full((b, 1), self.specials.cls, dtype=windows.dtype)
        sep = torch.full((b, 1), self.specials.sep, dtype=windows.dtype)
        ids = torch.cat([cls, windows, sep], dim=1)
        masked, selected = mask_rows(ids, self.special_ids, self.specials.mask, self.pool, generators, rate=self.rate,
                                     mask_frac=1.0 - self.unchanged, random_frac=0.0)
        selection = gather_selected(ids, selected, self.rate)
        draws = uniforms(generators, ids.shape[1:])
        return {"ids": masked, **selection, "draws": draws, "counts": {"mlm": selection["masked"], "disc": ids.numel()}}

    def generator_states(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """G's hidden states at the padded masked positions, (len(positions), G's width): a shape fixed by the
        batch's (:func:`~sesame.objectives.mlm.gather_selected`)."""
        ids = batch["ids"]
        hidden = self.generator(ids, padding=batch.get("padding"), embedded=self.backbone.embed(ids, None))
        return hidden.flatten(0, 1).index_select(0, batch["positions"])

    def predict(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """G's head output at the (real) masked positions, (masked, E): the logits are its product with
        the token embeddings, plus ``generator_bias``."""
        return self.generator_head(self.generator_states(batch)[: batch["masked"]])

    @torch.no_grad()
    def sample(self, predicted: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One token per row of ``predicted`` from G's softmax, by inverse transform on the whole batch at once: the
        first token whose cumulative probability exceeds the position's uniform in ``batch["draws"]`` (drawn by its
        example's generator, so an example is corrupted the same way however it is batched). Nothing is read back
        to the host; no gradient flows through the samples. The logits are made in chunks of rows as the fused
        projection's (:func:`~sesame.objectives.projection.default_chunk_size`), in the workspace's buffers."""
        low = product_dtype(predicted)
        weight, bias = self.backbone.embed.tokens.weight.to(low), self.generator_bias.to(low)
        draws = batch["draws"].flatten().index_select(0, masked_entries(batch, "positions"))
        chunk = default_chunk_size(len(predicted), len(weight), predicted.device)
        return torch.cat([self.inverse_transform(h.to(low), weight, bias, u)
                          for h, u in zip(predicted.split(chunk), draws.split(chunk))])

    def inverse_transform(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, draws: torch.Tensor
                          ) -> torch.Tensor:
        """For each row of ``hidden``, the first token whose cumulative softmax of ``hidden @ weight.T + bias``
        exceeds that row's ``draws`` share of its total (float32 sums, unnormalised)."""
        rows, vocab = len(hidden), len(weight)
        logits = torch.addmm(bias, hidden, weight.t(), out=self.workspace.matrix(
            "sample logits", rows, vocab, hidden.dtype, hidden.device))
        cumulative = logits if logits.dtype == torch.float32 else self.workspace.matrix(
            "sample sums", rows, vocab, torch.float32, hidden.device).copy_(logits)
        cumulative.sub_(cumulative.amax(1, keepdim=True)).exp_().cumsum_(1)
        chosen = torch.searchsorted(cumulative, (draws * cumulative[:, -1]).unsqueeze(1), right=True).squeeze(1)
        return chosen.clamp_(max=vocab - 1)  # a draw rounded up to the total

    def corrupt(self, batch: dict[str, torch.Tensor], samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(D's input: the masked positions filled with ``samples``, labels: 1.0 where it differs from the original)."""
        ids, positions = batch["ids"], masked_entries(batch, "positions")
        corrupted = ids.flatten().index_put((positions,), samples.to(ids.dtype)).view_as(ids)
        labels = torch.zeros(ids.numel(), device=ids.device)
        labels[positions] = (samples != masked_entries(batch, "targets")).float()
        return corrupted, labels.view_as(ids)

    def discriminate(self, ids: torch.Tensor, labels: torch.Tensor, padding: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """D's sigmoid cross-entropy summed over the non-padding positions (masked, not selected: selecting them
        would read their count back to the host)."""
        logits = self.discriminator_head(self.backbone(ids, padding=padding)).squeeze(-1)
        losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        return (losses if padding is None else losses.masked_fill(~padding.bool(), 0.0)).sum()

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The summed generator MLM loss and discriminator loss (each only in its stage when two-stage)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.trains_generator):
            states = self.generator_states(batch)
        losses, ids, labels = self.generate(states, batch)
        if ids is not None:
            losses["disc"] = self.discriminate(ids, labels, batch.get("padding"))
        return losses

    @torch.compiler.disable
    def generate(self, states: torch.Tensor, batch: dict[str, torch.Tensor]
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
        """G's head on the real ones of its padded ``states`` and its summed MLM loss (while G trains), and while D
        trains its input and labels (:meth:`corrupt`), else None. Eager under ``--compile`` (a graph break), as
        :func:`~sesame.objectives.mlm.masked_loss`: the real count varies; G's and D's networks stay compiled."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.trains_generator):
            predicted = self.generator_head(states[: batch["masked"]])
        losses = {}
        if self.trains_generator:
            losses["mlm"] = linear_cross_entropy(predicted, self.backbone.embed.tokens.weight,
                                                 masked_entries(batch, "targets"), self.generator_bias,
                                                 workspace=self.workspace)
        if not self.trains_discriminator:
            return losses, None, None
        return (losses, *self.corrupt(batch, self.sample(predicted, batch)))
