"""Hugging Face's ``T5ForConditionalGeneration`` and ``BartForConditionalGeneration`` tensors as sesame's
:class:`~sesame.models.encoder_decoder.EncoderDecoder` holds them: one module table per ``model_type`` (as in
``architectures.py``: sesame module → transformers module, ``{i}`` the layer, a tuple concatenated along dim 0),
the plan of :class:`~sesame.interop.mapping.Entry` rows it gives for a model, and the import of a state dict.
The tied copies (``lm_head``, each stack's ``embed_tokens``) are the shared table and are not read."""
from __future__ import annotations

import re

import torch
from torch import nn

from ..errors import SesameError
from .mapping import Entry

POSITION_OFFSET = {"t5": 0, "bart": 2}  # BartLearnedPositionalEmbedding's leading rows, which sesame has not


def _t5_modules() -> dict[str, str | tuple[str, ...]]:
    modules: dict[str, str | tuple[str, ...]] = {"embed.tokens": "shared"}
    for side, ffn in (("encoder", 1), ("decoder", 2)):  # a decoder block's cross-attention is its layer 1
        block = f"{side}.block.{{i}}.layer"
        modules |= {
            f"{side}.position_bias.table": f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias",
            f"{side}.attention.{{i}}.qkv": tuple(f"{block}.0.SelfAttention.{p}" for p in "qkv"),
            f"{side}.attention.{{i}}.out": f"{block}.0.SelfAttention.o",
            f"{side}.attention.{{i}}.norm": f"{block}.0.layer_norm",
            f"{side}.feed_forward.{{i}}.inp": f"{block}.{ffn}.DenseReluDense.wi",
            f"{side}.feed_forward.{{i}}.out": f"{block}.{ffn}.DenseReluDense.wo",
            f"{side}.feed_forward.{{i}}.norm": f"{block}.{ffn}.layer_norm",
            f"{side}.final_norm": f"{side}.final_layer_norm",
        }
    return modules | {
        "decoder.cross_attention.{i}.qkv": tuple(f"decoder.block.{{i}}.layer.1.EncDecAttention.{p}" for p in "qkv"),
        "decoder.cross_attention.{i}.out": "decoder.block.{i}.layer.1.EncDecAttention.o",
        "decoder.cross_attention.{i}.norm": "decoder.block.{i}.layer.1.layer_norm",
    }


def _bart_modules() -> dict[str, str | tuple[str, ...]]:
    modules: dict[str, str | tuple[str, ...]] = {"embed.tokens": "model.shared"}
    for side in ("encoder", "decoder"):
        layer = f"model.{side}.layers.{{i}}"
        modules |= {
            f"embed.positions.{side}": f"model.{side}.embed_positions",
            f"embed.norm.{side}": f"model.{side}.layernorm_embedding",
            f"{side}.attention.{{i}}.qkv": tuple(f"{layer}.self_attn.{p}_proj" for p in "qkv"),
            f"{side}.attention.{{i}}.out": f"{layer}.self_attn.out_proj",
            f"{side}.attention.{{i}}.norm": f"{layer}.self_attn_layer_norm",
            f"{side}.feed_forward.{{i}}.inp": f"{layer}.fc1",
            f"{side}.feed_forward.{{i}}.out": f"{layer}.fc2",
            f"{side}.feed_forward.{{i}}.norm": f"{layer}.final_layer_norm",
        }
    return modules | {
        "decoder.cross_attention.{i}.qkv": tuple(f"model.decoder.layers.{{i}}.encoder_attn.{p}_proj" for p in "qkv"),
        "decoder.cross_attention.{i}.out": "model.decoder.layers.{i}.encoder_attn.out_proj",
        "decoder.cross_attention.{i}.norm": "model.decoder.layers.{i}.encoder_attn_layer_norm",
    }


MODULES = {"t5": _t5_modules(), "bart": _bart_modules()}


def name_plan(model_type: str, model: nn.Module) -> list[Entry]:
    """One entry per parameter of an :class:`EncoderDecoder` of ``model_type``'s style."""
    modules, plan = MODULES[model_type], []
    for name, _ in model.named_parameters():
        module, param = name.rsplit(".", 1)
        layer = re.search(r"\.(\d+)\.", module)
        key = module.replace(layer[0], ".{i}.", 1) if layer else module
        if key not in modules:
            raise SesameError(f"the model's {module} has no counterpart in a {model_type} checkpoint")
        hf = modules[key]
        plan.append(Entry(name, tuple(f"{n.format(i=layer[1] if layer else '')}.{param}"
                                      for n in (hf if isinstance(hf, tuple) else (hf,)))))
    return plan


def import_weights(model_type: str, weights: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict from a ``model_type`` checkpoint's tensors."""
    bias = weights.get("final_logits_bias")
    if bias is not None and bool(bias.any()):
        raise SesameError("the checkpoint's final_logits_bias is not zero, and sesame's tied output layer has no "
                          "bias; fine-tune from a checkpoint without one")
    state = {e.sesame: torch.cat([weights[n] for n in e.hf]) for e in name_plan(model_type, model)}
    for name in state:
        if name.startswith("embed.positions."):
            state[name] = state[name][POSITION_OFFSET[model_type]:]
    return {k: v.contiguous() for k, v in state.items()}
