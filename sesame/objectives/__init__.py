"""Pre-training objectives: clean token windows → (inputs, targets) → loss, with their own heads."""
from __future__ import annotations

from ..models import Transformer
from ..tokenizer import TextTokenizer
from .base import Objective
from .bilm import BiLM
from .clm import AwdLM, CausalLM
from .mlm import MaskedLM
from .electra import Electra
from .pairs import AlbertPretraining, BertPretraining
from .plm import PermutationLM
from .seq2seq import Denoising, SpanCorruption
from .span import SpanBERT
from .translation import Translation

OBJECTIVES: dict[str, type[Objective]] = {
    o.name: o for o in (MaskedLM, BertPretraining, AlbertPretraining, SpanBERT, Electra, CausalLM, AwdLM, BiLM,
                        Translation, SpanCorruption, Denoising, PermutationLM)
}


def build_objective(name: str, backbone: Transformer, tokenizer: TextTokenizer, options: dict | None = None
                    ) -> Objective:
    """The objective ``name`` (a key of OBJECTIVES) around ``backbone``, with its recorded options."""
    return OBJECTIVES[name].build(backbone, tokenizer, **(options or {}))


__all__ = ["Objective", "MaskedLM", "BertPretraining", "AlbertPretraining", "SpanBERT", "Electra", "CausalLM", "AwdLM",
           "BiLM", "Translation", "SpanCorruption", "Denoising", "PermutationLM", "OBJECTIVES", "build_objective"]
