"""Text classification: a pooled sequence representation → linear layer → softmax over labels.

Encoders pool the first ([CLS]) position through BERT's pooler (dense + tanh, Devlin et al. 2019);
causal decoders read the last real token, which has seen the whole text (GPT, Radford et al. 2018).
``mean`` averages the final states of the real tokens (as Sentence-BERT does, Reimers & Gurevych
2019), useful for encoders whose [CLS] was never trained by a sentence-level objective.
Batches are padded only to their own longest text, and texts of similar length are batched together.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..models import Transformer

BUCKET_BATCHES = 50  # sort by length within windows of this many batches
POOLINGS = ("cls", "last", "mean")


class Classifier(nn.Module):
    def __init__(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float = 0.1):
        super().__init__()
        hidden = backbone.config.hidden
        self.backbone, self.pooling = backbone, pooling
        self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if pooling == "cls" else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, n_labels)
        for layer in (self.head, *([self.pooler[0]] if pooling == "cls" else [])):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.backbone(batch["ids"], padding=batch["padding"])
        real = batch["padding"]
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "mean":
            pooled = (hidden * real[..., None]).sum(1) / real.sum(1, keepdim=True)
        else:
            pooled = hidden[torch.arange(hidden.shape[0]), real.sum(1) - 1]
        return self.head(self.dropout(self.pooler(pooled)))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.logits(batch), batch["targets"], reduction="sum")


def collate(sequences: list[list[int]], pad_id: int, targets: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence of the batch; ``padding`` is True at real tokens."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in sequences])
    batch = {"ids": ids, "padding": torch.arange(width) < lengths[:, None]}
    if targets is not None:
        batch["targets"] = torch.tensor(targets, dtype=torch.long)
    return batch


def bucketed_batches(lengths: list[int], batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Shuffle, sort by length inside windows of ``BUCKET_BATCHES`` batches, cut, shuffle the batches."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    window = batch_size * BUCKET_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start: start + window], key=lambda i: lengths[i])
        batches += [chunk[j: j + batch_size] for j in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def steps_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)
