"""Modules inserted into a built Transformer stack (BERT, GPT, ALBERT, XLNet, T5, BART), not part of its config.

Fine-tuning recipes (:mod:`sesame.train.recipes`) ask for them; a run records them in config.json's ``additions``
(:class:`Additions`) and every reader of the run inserts them again after building the backbone
(:func:`sesame.run.build_backbone`). The stacks leave a place for each: every attention and feed-forward
sublayer an ``adapter`` (the identity until one is inserted), every stack a ``mix`` (None), so the state-dict
names are ``attention.0.adapter.down.weight``, ``mix.scalars`` and so on, whatever inserted them.

* :class:`Adapter` (Houlsby et al. 2019, §2.1): a bottleneck on the output of every attention and feed-forward
  sublayer, before its residual connection, ``y + W_up·GELU(W_down·y)``, starting near the identity;
* :class:`ScalarMix` (Peters et al. 2018, eq. 1): the stack's output is γ·Σ_j softmax(s)_j·h_j over the
  embeddings and every layer instead of the last layer alone (ELMo's biLM carries its own, :mod:`.elmo`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .transformer import FeedForward, SelfAttention, Transformer, TransformerConfig
from .xlnet import RelativeAttention, XLNet

SUBLAYERS = (SelfAttention, FeedForward, RelativeAttention)  # cross-attention and gated feed-forwards included
STACKS = (Transformer, XLNet)  # an encoder-decoder holds two


class Adapter(nn.Module):
    """Houlsby et al. (2019) bottleneck adapter: y + W_up·GELU(W_down·y), hidden → m → hidden. Its
    projections start at N(0, 10⁻³) with zero biases, so it starts as (nearly) the identity and the
    pre-trained network's function is kept at the start of fine-tuning (their §2.1)."""

    def __init__(self, hidden: int, size: int):
        super().__init__()
        self.down, self.up = nn.Linear(hidden, size), nn.Linear(size, hidden)
        for layer in (self.down, self.up):
            nn.init.normal_(layer.weight, std=1e-3)
            nn.init.zeros_(layer.bias)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y + self.up(F.gelu(self.down(y)))


class ScalarMix(nn.Module):
    """ELMo's task-specific combination of layers (Peters et al. 2018, eq. 1): γ·Σ_j softmax(s)_j·h_j,
    with s = 0 (an even mix) and γ = 1 at the start."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        weights = torch.softmax(self.scalars, dim=0)
        return self.gamma * sum(w * h for w, h in zip(weights, layers))


@dataclass(frozen=True, kw_only=True)
class Additions:
    """What is inserted into a run's backbone once it is built: config.json's ``additions``."""
    adapter_size: int | None = None  # Houlsby adapters' bottleneck width (None: no adapters)
    scalar_mix: bool = False  # the stack's output is ELMo's learned mix of all layers

    def __bool__(self) -> bool:
        """Whether anything is inserted."""
        return bool(self.adapter_size or self.scalar_mix)

    def insert(self, backbone: nn.Module) -> nn.Module:
        """``backbone`` with these modules inserted (in place), at their initial values."""
        if self and not takes_additions(backbone.config):
            raise ValueError(f"adapters and a scalar mix join Transformer stacks, not a {type(backbone).__name__}")
        if self.adapter_size:
            for sublayer in [m for m in backbone.modules() if isinstance(m, SUBLAYERS)]:
                sublayer.adapter = Adapter(backbone.config.hidden, self.adapter_size)
        if self.scalar_mix:
            for stack in [m for m in backbone.modules() if isinstance(m, STACKS)]:
                stack.mix = ScalarMix(stack.config.layers + 1)
        return backbone


def takes_additions(config: object) -> bool:
    """Whether a backbone of ``config`` (a config object) is made of Transformer stacks, which :class:`Additions`
    join."""
    return isinstance(config, TransformerConfig)


def inserted(name: str) -> bool:
    """Whether the state-dict name ``name`` is a parameter of an adapter or a scalar mix (ELMo's too), which
    weights saved without them lack and a model without them leaves behind."""
    parts = name.split(".")
    return parts[-3:-2] == ["adapter"] or parts[-2:-1] == ["mix"]
