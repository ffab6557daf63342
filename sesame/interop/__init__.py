"""Hugging Face checkpoint import and export: ``from_hf`` (a transformers model directory → a
``pretrained`` run) and ``to_hf`` (a run → a directory transformers loads). See docs/interop.md."""
from .hf import from_hf, to_hf

__all__ = ["from_hf", "to_hf"]
