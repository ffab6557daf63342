"""Recurrent backbones: word embedding → stacked LSTM or GRU layers → hidden states.

One configurable stack serves the baselines (``lstm``, ``bilstm``, ``gru``: Hochreiter & Schmidhuber
1997, Cho et al. 2014), ULMFiT's AWD-LSTM (Merity et al. 2018, "Regularizing and Optimizing LSTM
Language Models"; Howard & Ruder 2018) and the task models that read ELMo or CoVe features.
AWD-LSTM's regularisers, all off unless configured:

* DropConnect on the hidden-to-hidden weights (Wan et al. 2013; Merity et al. §2): one mask on
  ``W_hh`` per forward pass, so every time step of a batch sees the same dropped weights and the next
  batch a new mask;
* embedding dropout (§4.3): whole word types are dropped (rows of the embedding matrix, scaled by
  1/(1 − p)), the same words in every position of the batch;
* locked (variational) dropout (Gal & Ghahramani 2016; §4.2): one mask per sequence and feature,
  shared across time, on the embeddings (``input_dropout``), between layers (``hidden_dropout``) and
  on the last layer's output (``dropout``);
* tied weights (Inan et al. 2017; Press & Wolf 2017): with ``tied`` the last layer is as wide as the
  embedding, so a language model's softmax can reuse ``embed.tokens.weight``.

``causal`` stacks run forwards only; a bidirectional stack (``causal=False``) runs a backward
direction too and concatenates both per layer; padded rows are packed, so the backward direction
starts at each row's last real token. ``features`` (the config of an ELMo biLM or CoVe encoder)
adds a frozen feature extractor whose output is concatenated to the word embeddings,
[x_k; ELMo_k] (Peters et al. 2018, §3.3) or [GloVe(x); CoVe(x)] (McCann et al. 2017, §4).

Deviations from AWD-LSTM: no activation regularisation (AR/TAR), and no averaged SGD (the trainer's
AdamW and schedules are used, as ULMFiT's fast.ai code does).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .padding import is_padded

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}


@dataclass
class RecurrentConfig:
    vocab_size: int
    arch: str = "recurrent"
    cell: str = "lstm"  # lstm | gru
    causal: bool = True  # forwards only; False: bidirectional, both directions concatenated
    embedding_size: int = 400
    hidden_size: int = 1150  # per direction
    layers: int = 3
    pad_id: int = 0
    tied: bool = False  # the last layer is embedding_size wide (a language model ties its softmax to the embedding)
    dropout: float = 0.0  # locked dropout on the last layer's output
    embedding_dropout: float = 0.0  # drops word types (AWD-LSTM's dropoute)
    input_dropout: float = 0.0  # locked dropout on the embeddings (dropouti)
    hidden_dropout: float = 0.0  # locked dropout between layers (dropouth)
    weight_dropout: float = 0.0  # DropConnect on W_hh (wdrop)
    # a frozen feature extractor's own config (an ElmoConfig or CoveConfig: ELMo, CoVe), read beside the embeddings;
    # config.json nests its to_dict(), which models.model_config parses back
    features: ElmoConfig | CoveConfig | None = None

    def __post_init__(self) -> None:
        if self.cell not in CELLS:
            raise ValueError(f"cell {self.cell!r}: choose one of {', '.join(CELLS)}")
        if self.layers < 1:
            raise ValueError(f"layers {self.layers}: must be at least 1")

    @property
    def directions(self) -> int:
        return 1 if self.causal else 2

    def layer_width(self, i: int) -> int:
        """Per-direction width of layer ``i`` (from 0)."""
        return self.embedding_size if self.tied and i == self.layers - 1 else self.hidden_size

    @property
    def hidden(self) -> int:
        """The width of the output: the last layer's, both directions."""
        return self.layer_width(self.layers - 1) * self.directions

    @property
    def embedding_width(self) -> int:
        return self.embedding_size

    def to_dict(self) -> dict:
        return asdict(self)


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout on (batch, time, features): one mask per row and feature, the same at every time step."""
    if not training or p == 0.0:
        return x
    mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(weight: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The embedding matrix with whole rows (word types) dropped with probability ``p``, the rest scaled by
    1/(1 − p)."""
    if not training or p == 0.0:
        return weight
    mask = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - p) / (1 - p)
    return weight * mask


class RecurrentLayer(nn.Module):
    """One LSTM or GRU layer (one or both directions) with DropConnect on its hidden-to-hidden weights:
    ``weight_hh`` is multiplied by a fresh Bernoulli(1 − p) mask, scaled by 1/(1 − p), once per forward."""

    def __init__(self, cell: str, inputs: int, width: int, bidirectional: bool, weight_dropout: float):
        super().__init__()
        self.rnn = CELLS[cell](inputs, width, batch_first=True, bidirectional=bidirectional)
        self.weight_dropout = weight_dropout
        self.hh = [name for name, _ in self.rnn.named_parameters() if name.startswith("weight_hh")]

    def dropped_weights(self) -> dict[str, torch.Tensor]:
        """The hidden-to-hidden weights this forward pass uses (DropConnect's masks applied while training)."""
        p = self.weight_dropout
        if not self.training or p == 0.0:
            return {}
        return {name: nn.functional.dropout(getattr(self.rnn, name), p, True) for name in self.hh}

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        inputs = x if lengths is None else pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        weights = self.dropped_weights()
        out, _ = functional_call(self.rnn, weights, (inputs,), strict=False) if weights else self.rnn(inputs)
        if lengths is not None:
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out


class Recurrent(nn.Module):
    """Token ids (+ padding mask) → hidden states (batch, time, ``config.hidden``), or with ``all_layers``
    the embeddings (with any features) and every layer's states. ``types`` are accepted and ignored, as
    the task heads pass segment ids to every backbone."""

    def __init__(self, cfg: RecurrentConfig, features: nn.Module | None = None):
        """``features``: the feature extractor ``cfg.features`` describes (:func:`sesame.models.build_model` builds
        it), a backbone with ``features(ids, padding)`` → (batch, time, ``config.feature_width``)."""
        super().__init__()
        if (features is not None) != bool(cfg.features):
            raise ValueError("a recurrent model reads a feature extractor exactly when its config describes one")
        self.config = cfg
        self.embed = nn.Module()
        self.embed.tokens = nn.Embedding(cfg.vocab_size, cfg.embedding_size)
        self.features = features
        width = cfg.embedding_size + (self.features.config.feature_width if self.features is not None else 0)
        self.layers = nn.ModuleList()
        for i in range(cfg.layers):
            self.layers.append(RecurrentLayer(cfg.cell, width, cfg.layer_width(i), not cfg.causal, cfg.weight_dropout))
            width = cfg.layer_width(i) * cfg.directions
        nn.init.uniform_(self.embed.tokens.weight, -0.1, 0.1)  # AWD-LSTM's initialisation

    def layer_modules(self) -> list[list[nn.Module]]:
        """Layer groups for discriminative rates and gradual unfreezing, bottom to top: the embeddings
        (and any feature extractor), then one group per recurrent layer."""
        bottom = [self.embed] + ([self.features] if self.features is not None else [])
        return [bottom] + [[layer] for layer in self.layers]

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None, padding: torch.Tensor | None = None,
                all_layers: bool = False) -> torch.Tensor | list[torch.Tensor]:
        cfg = self.config
        weight = embedding_dropout(self.embed.tokens.weight, cfg.embedding_dropout, self.training)
        x = nn.functional.embedding(ids, weight)
        if self.features is not None:
            x = torch.cat([x, self.features.features(ids, padding)], -1)
        x = locked_dropout(x, cfg.input_dropout, self.training)
        packed = not cfg.causal and is_padded(padding)
        lengths = padding.sum(1).cpu() if packed else None
        layers = [x]
        for i, layer in enumerate(self.layers):
            x = layer(x, lengths)
            last = i == len(self.layers) - 1
            x = locked_dropout(x, cfg.dropout if last else cfg.hidden_dropout, self.training)
            layers.append(x)
        return layers if all_layers else x
