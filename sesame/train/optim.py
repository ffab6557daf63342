"""AdamW with BERT's weight-decay groups, and the learning-rate schedules: BERT's linear warmup / linear
decay and ULMFiT's slanted triangular rates."""
from __future__ import annotations

import torch
from torch import nn


def adamw(params: nn.Module | list[dict], lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) over a model's trainable parameters in two groups: biases and
    normalisation weights (all 1-D tensors) get no decay. ``params`` may instead be prebuilt groups
    (such as :func:`sesame.train.recipes.discriminative_param_groups`), each with its own ``lr``.
    Every group keeps its unscheduled rate as ``base_lr``, which the schedule multiplies.

    PyTorch's fused kernel does the whole update in one pass over each tensor (about 3x faster than
    the multi-tensor path on a CPU here, same arithmetic)."""
    if isinstance(params, nn.Module):
        trainable = [p for p in params.parameters() if p.requires_grad]
        params = [
            {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay, "base_lr": lr},
            {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0, "base_lr": lr},
        ]
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, fused=True)


def linear_warmup_decay(progress: float, warmup: float) -> float:
    """LR multiplier at ``progress`` ∈ [0, 1] of the run: rises linearly to 1 over the first ``warmup``
    fraction, then falls linearly to 0 at the end (BERT, Devlin et al. 2019, §A.2)."""
    if warmup > 0 and progress < warmup:
        return progress / warmup
    return max(0.0, (1.0 - progress) / max(1e-12, 1.0 - warmup))


def slanted_triangular(progress: float, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """LR multiplier η_t/η_max of ULMFiT's slanted triangular rates (Howard & Ruder 2018, §3.2, eq. 3) at
    ``progress`` ∈ [0, 1]: rises linearly from 1/``ratio`` to 1 over the first ``cut_frac`` ∈ [0, 1) of
    the run, then falls linearly back to 1/``ratio`` at the end.

    Eq. 3 with cut = T·cut_frac and t/T = progress: before the cut p = t/cut = progress/cut_frac; after
    it p = 1 − (t − cut)/(cut·(1/cut_frac − 1)) = 1 − (progress − cut_frac)/(1 − cut_frac), since
    cut·(1/cut_frac − 1) = T·(1 − cut_frac); then η_t/η_max = (1 + p·(ratio − 1))/ratio.
    Deviation: the paper's floor, cut = ⌊T·cut_frac⌋, is dropped (a time-based progress has no integer
    T). The floor moves the peak by under one step and ends eq. 3's decay up to 1/cut_frac steps before
    T (dipping just below 1/ratio); this form ends at exactly 1/ratio."""
    if progress < cut_frac:
        p = progress / cut_frac
    else:
        p = 1.0 - (progress - cut_frac) / (1.0 - cut_frac)
    return (1.0 + p * (ratio - 1.0)) / ratio
