"""The contract every pre-training objective fulfils."""
from __future__ import annotations

import torch
from torch import nn

from ..models import Transformer
from ..tokenizer import SpecialIds


class Objective(nn.Module):
    """A backbone plus the head(s) one pre-training task needs.

    ``make_batch`` turns clean token windows into model inputs and targets, drawing the randomness of
    row ``i`` from ``generators[i]`` only, so an example is corrupted the same way however it is
    batched; ``forward`` returns the loss summed over ``batch["targets"]``, so the trainer can
    average over a whole global batch across micro-batches and processes.
    """

    name = ""

    def __init__(self, backbone: Transformer, specials: SpecialIds):
        super().__init__()
        self.backbone = backbone
        self.specials = specials
        self.register_buffer("special_ids", torch.tensor(specials.all), persistent=False)

    @staticmethod
    def window_length(seq_len: int) -> int:
        """How many corpus tokens one example of ``seq_len`` model positions consumes."""
        raise NotImplementedError

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def tied_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.backbone.embed.tokens.weight.t()
