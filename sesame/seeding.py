"""Seeds of random draws that are functions of (seed, index) alone, so a draw is the same however it is batched
or resumed: an example's masking, a mixture's task, a prompt's sampling."""
from __future__ import annotations

from typing import Sequence

import torch


def example_seed(seed: int, index: int) -> int:
    return (seed * 0x9E3779B1 + index * 0x85EBCA77 + 1) % (1 << 62)


def generators(seed: int, indices: Sequence[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(example_seed(seed, i)) for i in indices]
