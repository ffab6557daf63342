"""Hugging Face's ``T5ForConditionalGeneration`` (T5 v1.0, Raffel et al. 2020, and v1.1: ``feed_forward_proj``
"gated-gelu", an untied ``lm_head``) and ``BartForConditionalGeneration`` (Lewis et al. 2020) as sesame's
:class:`~sesame.models.encoder_decoder.EncoderDecoder`, both ways:

* tensors: one module table per ``model_type`` (and feed-forward: T5 v1.1's gated one has ``wi_0`` and ``wi_1``
  for ``wi``; as in ``architectures.py``: sesame module → transformers module, ``{i}`` the layer, a tuple
  concatenated along dim 0) gives the plan of :class:`~sesame.interop.mapping.Entry` rows of a model
  (:func:`name_plan`), read by :func:`import_weights` and written back by :func:`export_weights`. The tied copies
  (``lm_head``, each stack's ``embed_tokens``) are the shared table: import checks that a stored copy equals it,
  export writes the table once, as transformers' ``save_pretrained`` does (``shared.weight``; BART's
  ``model.shared.weight`` and an all-zero ``final_logits_bias``). T5's ``lm_head`` may instead be an output layer of
  its own (v1.1: ``tie_word_embeddings`` false; transformers 5 writes true for every T5 and unties an ``lm_head``
  stored with other values than the shared table, and so does import: :func:`stores_own_head`). BART's position
  tables have two leading rows no position reads (transformers' offset of 2): import drops them, export puts them
  back;
* sequence classifiers (``T5ForSequenceClassification``, ``BartForSequenceClassification``): the base model under
  the class's prefix and ``classification_head``'s dense and out_proj as sesame's ``pooler.0`` and ``head``
  (:class:`~sesame.tasks.classify.EncoderDecoderSequenceModel`), the rest as above (:func:`classifier_weights`,
  :func:`split_classifier`);
* configurations: a T5Config or BartConfig dict (config.json) ⇄ :class:`EncoderDecoderConfig` fields
  (:func:`model_config`, :func:`hf_config`), refusing with one line what sesame does not compute (:data:`TYPES`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import SesameError
from ..models.encoder_decoder import STYLES, EncoderDecoderConfig
from .architectures import EXPORTED_ACTIVATIONS, HF_ACTIVATIONS
from .mapping import Entry, check_tensors, dense_entries, joined, split

# a sequence classifier's head: sesame's module → transformers' (dense → tanh, then out_proj; both classes alike)
CLASSIFIER_HEAD = {"pooler.0": "classification_head.dense", "head": "classification_head.out_proj"}
POSITION_OFFSET = {"t5": 0, "bart": 2}  # BartLearnedPositionalEmbedding's leading rows, which sesame has not


def _t5_modules(*, gated: bool) -> dict[str, str | tuple[str, ...]]:
    """T5's modules; a ``gated`` feed-forward (v1.1) has ``wi_0`` (activated) and ``wi_1`` (linear) for ``wi``."""
    modules: dict[str, str | tuple[str, ...]] = {"embed.tokens": "shared", "head": "lm_head"}
    wi = {"inp": "wi_0", "linear": "wi_1"} if gated else {"inp": "wi"}
    for side, ffn in (("encoder", 1), ("decoder", 2)):  # a decoder block's cross-attention is its layer 1
        block = f"{side}.block.{{i}}.layer"
        modules |= {
            f"{side}.position_bias.table": f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias",
            f"{side}.attention.{{i}}.qkv": tuple(f"{block}.0.SelfAttention.{p}" for p in "qkv"),
            f"{side}.attention.{{i}}.out": f"{block}.0.SelfAttention.o",
            f"{side}.attention.{{i}}.norm": f"{block}.0.layer_norm",
            **{f"{side}.feed_forward.{{i}}.{k}": f"{block}.{ffn}.DenseReluDense.{v}" for k, v in wi.items()},
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


MODULES = {("t5", False): _t5_modules(gated=False), ("t5", True): _t5_modules(gated=True),
           ("bart", False): _bart_modules()}  # (model type, gated feed-forward) → sesame module → transformers'


def modules(model_type: str, gated: bool = False) -> dict[str, str | tuple[str, ...]]:
    """The module table of ``model_type`` (with a ``gated`` feed-forward: T5 v1.1's)."""
    return MODULES[model_type, gated]


@dataclass(frozen=True)
class ModelType:
    """How transformers holds an :class:`EncoderDecoderConfig` of one style and its tensors.

    ``keys``: sesame field → config key; ``defaults``: the config class's values for keys a config.json leaves out;
    ``follows``: keys a config.json leaves out that take another key's value (T5's ``scale_decoder_outputs``: its
    ``tie_word_embeddings``); ``equal``: config keys that must equal another key (sesame's two stacks have the same
    heads and widths); ``required``: key → (the one value sesame computes, why); ``fixed``: the sesame fields the
    style implies; ``tokens``: config keys → the tokenizer role whose id they hold (checked on import, written on
    export); ``head_size``: the key of the width of a head, if the config has one (it must be d_model / heads);
    ``copies``: the checkpoint's tied copies of the shared table; ``bias``: an output bias that must be zero;
    ``ignored``: tensors older transformers saved that its models do not read; ``written``: config keys export sets
    to these values, those of decoding sesame does otherwise (BART's forced end token); ``gates``: the activation key
    may name a gated feed-forward (``gated-gelu``)."""

    base_class: str
    keys: dict[str, str]
    defaults: dict[str, Any]
    required: dict[str, tuple[Any, str]]
    fixed: dict[str, Any]
    tokens: dict[str, str]
    copies: tuple[str, ...]
    follows: dict[str, str] = field(default_factory=dict)
    equal: dict[str, str] = field(default_factory=dict)
    head_size: str | None = None
    bias: str | None = None
    ignored: tuple[str, ...] = ()
    written: dict[str, Any] = field(default_factory=dict)  # config keys export writes whatever the source held
    prefix: str = ""  # the task model's prefix of the base model's tensors (BART: "model.")
    gates: bool = False
    classifier: str = ""  # the *ForSequenceClassification class (BART's head on the decoder's last end token)
    classifier_prefix: str = ""  # its prefix of the base model's tensors


ACTIVATIONS = {**HF_ACTIVATIONS, "relu": "relu"}  # config value → sesame's activation
GATED = "gated-"  # T5's feed_forward_proj "gated-ACT": ACT(x·wi_0) ⊙ x·wi_1
UNTIED = "sesame's output layer is the shared token table"
# what neither style has: a run's fields that transformers' models cannot hold
PLAIN = {"type_vocab_size": 0, "embedding_size": None, "sharing": "none", "attention_window": None, "causal": False}
TYPES = {
    "t5": ModelType(
        "T5ForConditionalGeneration",
        keys={"vocab_size": "vocab_size", "hidden": "d_model", "layers": "num_layers",
              "decoder_layers": "num_decoder_layers", "heads": "num_heads", "intermediate": "d_ff",
              "max_positions": "n_positions", "dropout": "dropout_rate", "layer_norm_eps": "layer_norm_epsilon",
              "relative_buckets": "relative_attention_num_buckets",
              "relative_max_distance": "relative_attention_max_distance", "pad_id": "pad_token_id",
              "decoder_start_id": "decoder_start_token_id", "activation": "feed_forward_proj",
              "scale_logits": "scale_decoder_outputs", "tied": "tie_word_embeddings"},
        defaults={"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
                  "n_positions": 512, "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6,
                  "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "pad_token_id": 0,
                  "eos_token_id": 1, "feed_forward_proj": "relu", "tie_word_embeddings": True},
        # T5 v1.0 reads d_model^-0.5 of the states with its tied output layer, v1.1's untied one reads them unscaled
        follows={"scale_decoder_outputs": "tie_word_embeddings"},
        required={"is_encoder_decoder": (True, "an encoder and a decoder")},
        fixed={k: STYLES["t5"][k] for k in ("norm", "norm_kind", "bias", "scale_attention", "embedding_norm")},
        tokens={"eos_token_id": "sep"}, head_size="d_kv",
        copies=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"),
        ignored=("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",), gates=True,
        classifier="T5ForSequenceClassification", classifier_prefix="transformer."),
    "bart": ModelType(
        "BartForConditionalGeneration",
        keys={"vocab_size": "vocab_size", "hidden": "d_model", "layers": "encoder_layers",
              "decoder_layers": "decoder_layers", "heads": "encoder_attention_heads", "intermediate": "encoder_ffn_dim",
              "max_positions": "max_position_embeddings", "dropout": "dropout", "pad_id": "pad_token_id",
              "decoder_start_id": "decoder_start_token_id", "activation": "activation_function",
              "tied": "tie_word_embeddings"},
        defaults={"vocab_size": 50265, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
                  "encoder_attention_heads": 16, "encoder_ffn_dim": 4096, "max_position_embeddings": 1024,
                  "dropout": 0.1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
                  "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True},
        equal={"decoder_attention_heads": "encoder_attention_heads", "decoder_ffn_dim": "encoder_ffn_dim"},
        required={"scale_embedding": (False, "sesame does not scale BART's embeddings by √d_model"),
                  "tie_word_embeddings": (True, f"{UNTIED} in BART"),
                  "normalize_before": (False, "BART normalises after each sublayer (pre-norm is mBART's)"),
                  "add_final_layer_norm": (False, "BART has no final LayerNorm (mBART's)"),
                  "normalize_embedding": (True, "BART normalises its embeddings"),
                  "static_position_embeddings": (False, "BART's positions are learned"),
                  "add_bias_logits": (False, "sesame's output layer has no bias"),
                  "extra_pos_embeddings": (2, "BART's position tables have 2 unused leading rows"),
                  "is_encoder_decoder": (True, "an encoder and a decoder")},
        fixed={**{k: STYLES["bart"][k] for k in ("norm", "norm_kind", "embedding_norm", "layer_norm_eps")},
               "bias": True, "scale_attention": True, "relative_buckets": 0, "scale_logits": False, "gated": False,
               "tied": True},
        tokens={"bos_token_id": "cls", "eos_token_id": "sep"},
        # fairseq and transformers force </s> as a BART output's last token at the length limit (BartConfig's
        # default forced_eos_token_id, 2); sesame does not, and says so, so that transformers decodes as it does
        written={"forced_eos_token_id": None},
        copies=("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"),
        bias="final_logits_bias", prefix="model.", classifier="BartForSequenceClassification",
        classifier_prefix="model."),
}


def feed_forward(value: object, *, gates: bool) -> tuple[str, bool] | None:
    """A config's activation ``value`` as ``(sesame activation, gated)``, None where sesame does not compute it:
    ``relu``, ``gelu``, ... or, where the type ``gates``, ``gated-ACT`` (transformers reads T5's ``gated-gelu`` as
    the tanh GELU, ``gelu_new``)."""
    value = str(value)
    gated = gates and value.startswith(GATED)
    name = value.removeprefix(GATED) if gated else value
    name = "gelu_new" if gated and name == "gelu" else name
    return (ACTIVATIONS[name], gated) if name in ACTIVATIONS else None


def activation_value(model: dict) -> str | None:
    """The config value of the EncoderDecoderConfig fields ``model``'s feed-forward (None: a gated exact GELU, which
    transformers' T5 cannot name: its ``gated-gelu`` is the tanh form)."""
    name = EXPORTED_ACTIVATIONS.get(model["activation"], model["activation"])
    if not model["gated"]:
        return name
    return None if model["activation"] == "gelu" else GATED + ("gelu" if name == "gelu_new" else name)


def model_config(hf: dict, model_type: str, where: str) -> dict:
    """The :class:`EncoderDecoderConfig` fields (a dict, ``to_dict()``'s) of a ``model_type`` config.json ``hf``;
    ``where`` names it in the one-line error that lists each key sesame does not compute, with what it supports."""
    types = TYPES[model_type]
    given = {**types.defaults, **{k: v for k, v in hf.items() if v is not None}}
    for key, other in types.follows.items():
        given.setdefault(key, given[other])
    wrong = [f"{k} {given[k]!r} (sesame supports {v!r}: {why})" for k, (v, why) in types.required.items()
             if given.get(k, v) != v]
    wrong += [f"{k} {given[k]!r} (sesame supports {given[o]!r}, its {o}: both stacks alike)"
              for k, o in types.equal.items() if given.get(k, given[o]) != given[o]]
    activation = types.keys["activation"]
    ffn = feed_forward(given[activation], gates=types.gates)
    if ffn is None:
        gated = f", {GATED}ACT of those" if types.gates else ""
        wrong.append(f"{activation} {given[activation]!r} (sesame supports {', '.join(ACTIVATIONS)}{gated})")
    size, hidden, heads = types.head_size, given[types.keys["hidden"]], given[types.keys["heads"]]
    if size and given[size] * heads != hidden:
        wrong.append(f"{size} {given[size]!r} (sesame supports {types.keys['hidden']} / {types.keys['heads']}, "
                     f"{hidden // heads}: its heads split the width)")
    if wrong:
        raise SesameError(f"{where}: " + "; ".join(wrong))
    given.setdefault(types.keys["decoder_layers"], given[types.keys["layers"]])  # T5: as deep as the encoder
    given.setdefault("decoder_start_token_id", given["pad_token_id"])  # T5 starts from <pad>
    model = {**STYLES[model_type], **PLAIN, **types.fixed, **{f: given[k] for f, k in types.keys.items()}}
    model["activation"], model["gated"] = ffn
    try:
        return EncoderDecoderConfig(**model).to_dict()
    except ValueError as err:
        raise SesameError(f"{where}: {err}") from None


def hf_config(model: dict, model_type: str, *, source: dict, tokens: dict[str, int]) -> dict:
    """A ``model_type`` config.json for the :class:`EncoderDecoderConfig` fields ``model`` and the tokenizer's
    role ids ``tokens`` (``{"sep": 1, ...}``): the keys sesame determines, over ``source`` (the config.json it was
    imported from; ``{}``: transformers' defaults for the rest). Fails, naming the fields, where the model is not
    of the style (:func:`check_style`)."""
    types = TYPES[model_type]
    check_style(model, model_type)
    hf = {k: v for k, v in source.items() if k not in ("architectures", "transformers_version", "_name_or_path")}
    hf.update({k: model[f] for f, k in types.keys.items()})
    hf[types.keys["decoder_layers"]] = model["decoder_layers"] or model["layers"]  # None: as deep as the encoder
    hf.update({k: hf[o] for k, o in types.equal.items()})
    hf[types.keys["activation"]] = activation_value(model)
    hf.update({key: tokens[role] for key, role in types.tokens.items()}, **types.written)
    hf.update(model_type=model_type, architectures=[types.base_class], is_encoder_decoder=True)
    if types.head_size:
        hf[types.head_size] = model["hidden"] // model["heads"]
    return hf


def check_style(model: dict, model_type: str) -> None:
    """Fail unless the EncoderDecoderConfig fields ``model`` are a ``model_type`` model transformers can hold."""
    wrong = [f"{k} {model.get(k)!r} (needs {v!r})" for k, v in {**PLAIN, **TYPES[model_type].fixed}.items()
             if model.get(k) != v]
    if "relative_buckets" in TYPES[model_type].keys and not model["relative_buckets"]:
        wrong.append(f"relative_buckets 0 ({model_type} needs its relative position bias)")
    if model.get("gated") and activation_value(model) is None:
        wrong.append(f"a gated feed-forward of exact {model['activation']} ({model_type}'s {GATED}gelu is the tanh "
                     "form, gelu_tanh)")
    if wrong:
        raise SesameError(f"the model is not a {model_type} model: " + "; ".join(wrong))


def name_plan(model_type: str, model: nn.Module) -> list[Entry]:
    """One entry per parameter of an :class:`EncoderDecoder` of ``model_type``'s style."""
    table, plan = modules(model_type, model.config.gated), []
    for name, _ in model.named_parameters():
        module, param = name.rsplit(".", 1)
        layer = re.search(r"\.(\d+)\.", module)
        key = module.replace(layer[0], ".{i}.", 1) if layer else module
        if key not in table:
            raise SesameError(f"the model's {module} has no counterpart in a {model_type} checkpoint")
        hf = table[key]
        plan.append(Entry(name, tuple(f"{n.format(i=layer[1] if layer else '')}.{param}"
                                      for n in (hf if isinstance(hf, tuple) else (hf,)))))
    return plan


def _positions(model_type: str) -> list[str]:
    """The checkpoint's position tables (BART's), whose first :data:`POSITION_OFFSET` rows no position reads."""
    return [f"{hf}.weight" for k, hf in modules(model_type).items() if k.startswith("embed.positions.")]


def import_weights(model_type: str, weights: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict from a ``model_type`` checkpoint's tensors, which must be exactly the model's: every
    tensor of the plan in its shape, tied copies equal to the shared table, a zero output bias, nothing else."""
    types = TYPES[model_type]
    expected = export_weights(model_type, model.state_dict(), model)
    shared = weights.get(modules(model_type)["embed.tokens"] + ".weight")
    known = {*expected, *types.copies, *types.ignored}
    check_tensors(weights, expected, where=f"the {model_type} checkpoint", known=known, optional=(types.bias,))
    untied = [n for n in types.copies if n in weights and n not in expected and not torch.equal(weights[n], shared)]
    if untied:
        raise SesameError(f"the checkpoint's {', '.join(untied)} differ from the shared token table, and {UNTIED}; "
                          "only tied checkpoints convert")
    if types.bias in weights and bool(weights[types.bias].any()):
        raise SesameError(f"the checkpoint's {types.bias} is not zero, and sesame's tied output layer has no "
                          "bias; fine-tune from a checkpoint without one")
    state = joined(weights, name_plan(model_type, model))
    for name in state:
        if name.startswith("embed.positions."):
            state[name] = state[name][POSITION_OFFSET[model_type]:]
    return {k: v.contiguous() for k, v in state.items()}


def stores_own_head(model_type: str, weights: dict[str, torch.Tensor]) -> bool:
    """Whether a ``model_type`` checkpoint that may have an output layer of its own (T5's) stores one: an ``lm_head``
    with other values than the shared table, which transformers 5 loads untied whatever config.json says."""
    if "tied" in TYPES[model_type].fixed:
        return False
    head, shared = (weights.get(modules(model_type)[k] + ".weight") for k in ("head", "embed.tokens"))
    return head is not None and shared is not None and not torch.equal(head, shared)


def leading_rows(model_type: str, weights: dict[str, torch.Tensor]) -> dict[str, list]:
    """The position tables' unread leading rows that are not zero (BART's row 0 holds its initial values), as
    lists: what :func:`export_weights` needs to give the checkpoint back tensor for tensor."""
    rows = {n: weights[n][:POSITION_OFFSET[model_type]] for n in _positions(model_type)}
    return {n: r.tolist() for n, r in rows.items() if bool(r.any())}


def export_weights(model_type: str, state: dict[str, torch.Tensor], model: nn.Module,
                   leading: dict[str, list] | None = None) -> dict[str, torch.Tensor]:
    """The ``model_type`` checkpoint of ``model``'s state dict ``state``, with the names and tensors transformers'
    ``save_pretrained`` writes: the shared table once, BART's position tables with their leading rows (``leading``,
    else zeros) and its zero ``final_logits_bias``."""
    types, leading = TYPES[model_type], leading or {}
    out = split(state, name_plan(model_type, model))
    for name in _positions(model_type):
        table = out[name]
        rows = torch.tensor(leading[name], dtype=table.dtype) if name in leading else \
            torch.zeros(POSITION_OFFSET[model_type], table.shape[1], dtype=table.dtype, device=table.device)
        out[name] = torch.cat([rows.to(table.device), table])
    if types.bias:
        shared = out[modules(model_type)["embed.tokens"] + ".weight"]
        out[types.bias] = torch.zeros(1, shared.shape[0], dtype=shared.dtype, device=shared.device)
    return out


def _head_plan() -> list[Entry]:
    return [e for module, hf in CLASSIFIER_HEAD.items() for e in dense_entries(module, hf)]


def classifier_weights(model_type: str, tensors: dict[str, torch.Tensor], head: dict[str, torch.Tensor]
                       ) -> dict[str, torch.Tensor]:
    """The ``*ForSequenceClassification`` checkpoint of a model's tensors (:func:`export_weights`'s) and sesame's
    head ``head`` (``pooler.0`` and ``head``): the base model under the class's prefix, without the output bias
    (the class has no output layer), and ``classification_head``."""
    types = TYPES[model_type]
    out = {types.classifier_prefix + n.removeprefix(types.prefix): t for n, t in tensors.items() if n != types.bias}
    return out | split(head, _head_plan())


def split_classifier(model_type: str, weights: dict[str, torch.Tensor], where: str
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The inverse of :func:`classifier_weights`: a ``*ForSequenceClassification``'s tensors as (the base model's,
    named as in the conditional-generation checkpoint :func:`import_weights` reads; sesame's head tensors).
    ``where`` names the file in the error when the head is missing."""
    types, plan = TYPES[model_type], _head_plan()
    missing = [e.hf[0] for e in plan if e.hf[0] not in weights]
    if missing:
        raise SesameError(f"{where}: config.json names {types.classifier}, but {', '.join(missing)} are missing")
    head = {e.sesame: weights[e.hf[0]] for e in plan}
    taken = {e.hf[0] for e in plan}
    base = {(types.prefix + n.removeprefix(types.classifier_prefix) if n.startswith(types.classifier_prefix) else n): t
            for n, t in weights.items() if n not in taken}
    return base, head
