"""Pre-training objectives: clean token windows → (inputs, targets) → loss, with their own heads."""
from __future__ import annotations

from ..models import Transformer
from ..tokenizer import TextTokenizer
from .base import Objective
from .clm import CausalLM
from .mlm import MaskedLM

OBJECTIVES: dict[str, type[Objective]] = {"mlm": MaskedLM, "clm": CausalLM}


def build_objective(name: str, backbone: Transformer, tokenizer: TextTokenizer, options: dict | None = None
                    ) -> Objective:
    """The objective ``name`` (a key of OBJECTIVES) around ``backbone``, with its recorded options."""
    return OBJECTIVES[name].build(backbone, tokenizer, **(options or {}))


__all__ = ["Objective", "MaskedLM", "CausalLM", "OBJECTIVES", "build_objective"]
