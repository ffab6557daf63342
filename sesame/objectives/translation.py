"""CoVe's translation objective (McCann et al. 2017, §3): teacher forcing on parallel sentences, minimising
−Σ_t log p(y_t | H, y_1..y_{t−1}), the cross-entropy of each reference word given the source and the
reference words before it.

It reads sentence pairs, not windows of a token stream, so ``sesame cove`` (:mod:`sesame.apps.cove`) trains
it, not ``sesame pretrain``; its batches (:func:`sesame.apps.cove.collate`) hold the source ``ids`` and
``padding``, the reference ``target`` (``<s> y_1 .. y_n </s>``) and ``target_padding`` (masks True at real
tokens), and ``targets``, the tokens the decoder predicts (all but each row's ``<s>``), flattened. The
MT-LSTM is ``backbone``, so a run's weights are ``backbone.*`` as for the other objectives.
"""
from __future__ import annotations

import torch

from ..errors import SesameError
from ..models.cove import MTLSTM
from ..tokenizer import SpecialIds
from .base import Objective
from .projection import linear_cross_entropy


class Translation(Objective):
    name = "translation"
    scored_by = "sesame translate --model RUN --input SRC --reference TGT"  # BLEU, not a windowed loss

    def __init__(self, backbone: MTLSTM, specials: SpecialIds) -> None:
        super().__init__(backbone, specials)
        if not isinstance(backbone, MTLSTM):
            raise ValueError(f"the translation objective needs an MT-LSTM (arch 'cove'), not {type(backbone).__name__}")

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        raise SesameError("--objective translation: CoVe's MT-LSTM learns from parallel sentences, not windows of a "
                          "corpus; train it with `sesame cove`")

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Σ −log p(y_t | H, y_<t) over the batch's real target tokens after ``<s>`` (step t reads y_{t−1})."""
        hidden = self.backbone.teacher_forced(batch["ids"], batch["padding"], batch["target"])
        real = batch["target_padding"][:, 1:]
        out = self.backbone.out
        return linear_cross_entropy(hidden[real], out.weight, batch["target"][:, 1:][real], out.bias)
