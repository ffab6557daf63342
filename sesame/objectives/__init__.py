"""Pre-training objectives: clean token windows → (inputs, targets) → loss, with their own heads."""
from __future__ import annotations

from ..models import Transformer
from ..tokenizer import SpecialIds
from .base import Objective
from .clm import CausalLM
from .mlm import MaskedLM

OBJECTIVES: dict[str, type[Objective]] = {"mlm": MaskedLM, "clm": CausalLM}


def build_objective(name: str, backbone: Transformer, specials: SpecialIds) -> Objective:
    return OBJECTIVES[name](backbone, specials)


__all__ = ["Objective", "MaskedLM", "CausalLM", "OBJECTIVES", "build_objective"]
