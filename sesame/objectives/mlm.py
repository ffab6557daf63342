"""Masked language modelling (BERT, Devlin et al. 2019, §3.1 and Appendix A.1).

15% of the non-special tokens of each sequence are selected; of those, 80% are replaced by
[MASK], 10% by a random (non-special) token and 10% are left unchanged. The loss is the
cross-entropy of the original token at the selected positions only, and the vocabulary projection
is computed only there, chunk by chunk and fused with the loss (``projection.linear_cross_entropy``).
Masks are drawn afresh every time a sequence is seen (dynamic masking, RoBERTa, Liu et al. 2019).
Deviation: selection is an independent Bernoulli(0.15) draw per token (as in RoBERTa and Hugging
Face) rather than exactly round(0.15·n) positions per sequence.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models import Transformer
from ..tokenizer import SpecialIds
from .base import Objective
from .projection import Workspace, linear_cross_entropy


def mask_tokens(ids: torch.Tensor, special_ids: torch.Tensor, mask_id: int, vocab_size: int,
                generator: torch.Generator, rate: float = 0.15, mask_frac: float = 0.8,
                random_frac: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(corrupted ids, selected)`` where ``selected`` marks the positions to predict."""
    eligible = ~torch.isin(ids, special_ids)
    selected = (torch.rand(ids.shape, generator=generator) < rate) & eligible
    action = torch.rand(ids.shape, generator=generator)
    corrupted = ids.clone()
    corrupted[selected & (action < mask_frac)] = mask_id
    randomize = selected & (action >= mask_frac) & (action < mask_frac + random_frac)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[special_ids] = False
    pool = allowed.nonzero().squeeze(1)
    picks = torch.randint(len(pool), (int(randomize.sum()),), generator=generator)
    corrupted[randomize] = pool[picks]
    return corrupted, selected


class MaskedLM(Objective):
    """BERT's masked LM with its prediction head (dense → GELU → LayerNorm → tied decoder + bias)."""

    name = "mlm"

    def __init__(self, backbone: Transformer, specials: SpecialIds, rate: float = 0.15):
        super().__init__(backbone, specials)
        cfg = backbone.config
        self.rate = rate
        width = cfg.embedding_width  # the tied decoder's input width (E < H under ALBERT's factorisation)
        self.transform = nn.Sequential(nn.Linear(cfg.hidden, width), nn.GELU(),
                                       nn.LayerNorm(width, eps=cfg.layer_norm_eps))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        nn.init.normal_(self.transform[0].weight, std=0.02)
        nn.init.zeros_(self.transform[0].bias)
        self.workspace = Workspace()

    @staticmethod
    def window_length(seq_len: int) -> int:
        return seq_len - 2  # room for [CLS] and [SEP]

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        b = windows.shape[0]
        cls = torch.full((b, 1), self.specials.cls, dtype=windows.dtype)
        sep = torch.full((b, 1), self.specials.sep, dtype=windows.dtype)
        return self.masked(torch.cat([cls, windows, sep], dim=1), generators)

    def corrupt(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence → ``(corrupted ids, selected positions)``."""
        return mask_tokens(ids, self.special_ids, self.specials.mask, self.backbone.config.vocab_size, generator,
                           self.rate)

    def masked(self, ids: torch.Tensor, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        """Corrupt each row of the model inputs ``ids``; ``positions`` index the flattened selected tokens."""
        rows = [self.corrupt(row, g) for row, g in zip(ids, generators)]
        selected = torch.stack([r[1] for r in rows])
        positions = selected.flatten().nonzero().squeeze(1)
        return {"ids": torch.stack([r[0] for r in rows]), "positions": positions, "targets": ids.flatten()[positions]}

    def mlm_loss(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Summed cross-entropy of the original tokens at the selected positions."""
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["positions"])
        return linear_cross_entropy(self.transform(picked), self.backbone.embed.tokens.weight, batch["targets"],
                                    self.bias, workspace=self.workspace)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.mlm_loss(self.backbone(batch["ids"]), batch)
