"""Backbones: token ids in, hidden states out."""
from .transformer import Transformer, TransformerConfig

__all__ = ["Transformer", "TransformerConfig"]
