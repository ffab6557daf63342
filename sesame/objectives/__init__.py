"""Pre-training objectives: clean token windows → (inputs, targets) → loss, with their own heads."""
from __future__ import annotations

import inspect

from ..models import Transformer
from ..tokenizer import TextTokenizer
from .base import Objective
from .bilm import BiLM
from .clm import AwdLM, CausalLM
from .mlm import MaskedLM
from .electra import Electra
from .pairs import AlbertPretraining, BertPretraining
from .span import SpanBERT
from .translation import Translation

OBJECTIVES: dict[str, type[Objective]] = {
    o.name: o for o in (MaskedLM, BertPretraining, AlbertPretraining, SpanBERT, Electra, CausalLM, AwdLM, BiLM,
                        Translation)
}


def objective_option_names(cls: type[Objective]) -> set[str]:
    """The options a user may give ``cls``: the named parameters of ``build`` and ``__init__``, up the
    class hierarchy as far as ``__init__`` passes ``**options`` on, less those ``build`` fills itself."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        for method in (klass.__dict__.get("build"), init):
            if method is not None:
                params = inspect.signature(getattr(method, "__func__", method)).parameters.values()
                names |= {p.name for p in params if p.default is not p.empty or p.kind == p.KEYWORD_ONLY}
        if init is not None and not any(p.kind == p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return names - set(cls.internal_options)


def build_objective(name: str, backbone: Transformer, tokenizer: TextTokenizer, options: dict | None = None
                    ) -> Objective:
    """The objective ``name`` (a key of OBJECTIVES) around ``backbone``, with its recorded options."""
    return OBJECTIVES[name].build(backbone, tokenizer, **(options or {}))


__all__ = ["Objective", "MaskedLM", "BertPretraining", "AlbertPretraining", "SpanBERT", "Electra", "CausalLM", "AwdLM",
           "BiLM", "Translation", "OBJECTIVES", "build_objective", "objective_option_names"]
