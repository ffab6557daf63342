"""Causal language modelling (GPT, Radford et al. 2018, eq. 1): maximise Σ log P(u_i | u_<i).

Sequences are packed: contiguous windows of the token stream, documents separated by the
tokenizer's separator token, so no position is wasted on padding.

The loss goes through :func:`~sesame.objectives.projection.linear_cross_entropy`, which never
materialises the (positions × vocabulary) logits.

:class:`AwdLM` adds AWD-LSTM's variable-length backpropagation through time (ULMFiT's pre-training).
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
    def window_length(seq_len: int, **options) -> int:
        return seq_len + 1  # inputs are the first seq_len tokens, targets the last seq_len

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"ids": windows[:, :-1], "targets": windows[:, 1:]}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The summed loss over ``targets``: at every input position, or, when the batch has ``positions``
        (indices into the flattened (batch × time) grid), only there."""
        hidden = self.backbone(batch["ids"]).flatten(0, 1)
        if "positions" in batch:
            hidden = hidden.index_select(0, batch["positions"])
        return linear_cross_entropy(hidden, self.backbone.embed.tokens.weight, batch["targets"].flatten(),
                                    workspace=self.workspace)


SHORT_PROBABILITY = 0.05  # a window's base length is seq_len / 2 with this probability, else seq_len
LENGTH_STD = 5.0  # standard deviation of the drawn length around its base
MIN_LENGTH = 5  # no drawn length below this (Merity et al.'s code: max(5, ...))


def bptt_length(seq_len: int, generator: torch.Generator) -> int:
    """One draw of AWD-LSTM's BPTT length (Merity et al. 2018, §4.1): base = seq_len with probability 0.95,
    else seq_len / 2; length ~ N(base, 5²), rounded and clipped to [min(5, seq_len), seq_len]."""
    base = seq_len / 2 if float(torch.rand(1, generator=generator)) < SHORT_PROBABILITY else seq_len
    drawn = round(base + LENGTH_STD * float(torch.randn(1, generator=generator)))
    return min(seq_len, max(min(MIN_LENGTH, seq_len), drawn))


class AwdLM(CausalLM):
    """The causal LM trained with variable-length backpropagation through time (AWD-LSTM, Merity et al. 2018,
    §4.1; the language model of ULMFiT, Howard & Ruder 2018, §3.1): while training, each example draws its
    own length L from its own generator (:func:`bptt_length`), so the windows' cut points move from epoch to
    epoch instead of every token always sitting at the same offset. Only the first L inputs of a row carry
    targets; the batch is cropped to its longest draw and the vocabulary projection runs only at positions
    with a target, so the positions past a row's length cost no softmax. In evaluation (the objective in
    ``eval()`` mode) every window is scored whole, as :class:`CausalLM` scores it, so validation losses of
    the two compare directly.

    Deviations from AWD-LSTM: the hidden state is not carried across batches (every window starts from a
    zero state, as the trainer's windows are shuffled); the learning rate is not rescaled by L / seq_len;
    no activation regularisation (AR/TAR); lengths are capped at seq_len (a window holds seq_len + 1 tokens),
    where Merity et al. allowed up to seq_len + 20; the tokens of a window past its drawn length are skipped
    for that epoch rather than starting the next window.
    """

    name = "awd_lm"

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if not self.training:
            return super().make_batch(windows, generators, partners)
        seq_len = windows.shape[1] - 1
        lengths = torch.tensor([bptt_length(seq_len, g) for g in generators])
        longest = int(lengths.max())
        kept = torch.arange(longest)[None, :] < lengths[:, None]
        positions = kept.flatten().nonzero().squeeze(1)
        return {"ids": windows[:, :longest], "positions": positions,
                "targets": windows[:, 1:longest + 1].flatten()[positions]}
