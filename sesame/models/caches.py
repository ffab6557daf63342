"""Decoding caches: the self-attention keys and values of the tokens seen so far (:class:`KVCache`), and an
encoder's output as a decoder's cross-attention reads it (:class:`Memory`, with each layer's keys and values
projected once)."""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from .padding import is_padded


class Shape(Protocol):
    """What a cache reads of a stack's config (:class:`~sesame.models.transformer.TransformerConfig`)."""
    layers: int
    heads: int
    hidden: int


class LayerCache:
    """One layer's view of a :class:`KVCache`."""

    def __init__(self, cache: KVCache, layer: int):
        self.cache, self.layer = cache, layer

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' keys and values (batch, heads, new, head size); return all keys and values so far."""
        start = self.cache.length
        end = start + k.shape[2]
        keys, values = self.cache.keys[self.layer], self.cache.values[self.layer]
        keys[:, :, start:end], values[:, :, start:end] = k, v
        return keys[:, :, :end], values[:, :, :end]


class KVCache:
    """Every layer's attention keys and values for the tokens seen so far, in buffers allocated once for
    ``capacity`` positions, so decoding appends in place. ``length`` counts the cached tokens. The buffers live
    on the model's ``device``, in the ``dtype`` its keys and values are computed in (bfloat16 under bf16
    autocast); :meth:`sesame.language_model.LanguageModel.cache` makes one so."""

    def __init__(self, cfg: Shape, batch: int, capacity: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        shape = (batch, cfg.heads, capacity, cfg.hidden // cfg.heads)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.length = 0

    def layer(self, i: int) -> LayerCache:
        return LayerCache(self, i)

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep the batch rows ``rows``, in that order (beam search's surviving hypotheses); ``rows`` may be on
        any device."""
        rows = rows.to(self.keys[0].device) if self.keys else rows
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]


class Memory:
    """An encoder's output as the decoder's cross-attention reads it: ``states`` (batch, source, hidden), ``mask``
    (batch, 1, 1, source; True at real tokens, None where :func:`~.padding.is_padded` finds nothing padded) and
    each decoder layer's keys and values, projected from the states on first use and kept: the cross-attention
    cache, so a decoder run token by token projects them once. It holds one set of weights' projections: encode
    again after the weights change."""

    def __init__(self, states: torch.Tensor, padding: torch.Tensor | None = None):
        self.states = states
        self.mask = padding[:, None, None, :].bool() if is_padded(padding) else None
        self.keys_values: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def layer(self, i: int, project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s keys and values: ``project(states)`` the first time, the kept ones after."""
        if i not in self.keys_values:
            self.keys_values[i] = project(self.states)
        return self.keys_values[i]

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep the batch rows ``rows``, in that order (beam search's surviving hypotheses)."""
        rows = rows.to(self.states.device)
        self.states = self.states.index_select(0, rows)
        self.mask = self.mask.index_select(0, rows) if self.mask is not None else None
        self.keys_values = {i: (k.index_select(0, rows), v.index_select(0, rows))
                            for i, (k, v) in self.keys_values.items()}
