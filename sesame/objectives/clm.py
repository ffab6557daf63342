"""Causal language modelling (GPT, Radford et al. 2018, eq. 1): maximise Σ log P(u_i | u_<i).

Sequences are packed: contiguous windows of the token stream, documents separated by the
tokenizer's separator token, so no position is wasted on padding.

The loss goes through :func:`~sesame.objectives.projection.linear_cross_entropy`, which never
materialises the (positions × vocabulary) logits.
"""
from __future__ import annotations

import torch

from ..models import Transformer
from ..tokenizer import SpecialIds
from .base import Objective
from .projection import Workspace, linear_cross_entropy

class CausalLM(Objective):
    name = "clm"

    def __init__(self, backbone: Transformer, specials: SpecialIds) -> None:
        super().__init__(backbone, specials)
        if backbone.config.embedding_width != backbone.config.hidden:
            raise ValueError("the causal LM ties its output to the input embedding: embedding_size must equal hidden")
        self.workspace = Workspace()

    @staticmethod
    def window_length(seq_len: int) -> int:
        return seq_len + 1  # inputs are the first seq_len tokens, targets the last seq_len

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"ids": windows[:, :-1], "targets": windows[:, 1:]}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.backbone(batch["ids"])
        return linear_cross_entropy(hidden.flatten(0, 1), self.backbone.embed.tokens.weight,
                                    batch["targets"].flatten(), workspace=self.workspace)
