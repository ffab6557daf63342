"""Hugging Face checkpoints ⇄ sesame runs, for the architectures of :mod:`.architectures`.

``from_hf(DIR, RUN)`` turns a ``transformers`` model directory (config.json; model.safetensors, a
sharded model.safetensors.index.json, or pytorch_model.bin read with ``weights_only=True``; and a
tokenizer, see :mod:`.hf_tokenizer`) into a ``pretrained`` run: the backbone under sesame's names,
and BERT's or ALBERT's [CLS] pooler as ``pooler.0``, which ``finetune`` starts a ``cls`` pooler from.
A language-model head that computes what sesame's does (``*ForMaskedLM``, ``*ForPreTraining``,
``GPT2LMHeadModel``) becomes the run's objective (``mlm``, ``mlm_nsp``, ``mlm_sop``, ``clm``), so
``sesame evaluate`` reports its loss; other heads are left behind (listed in the result, with the
reason where a pre-training head does not map). A
``*ForSequenceClassification`` whose head maps (BERT, ALBERT, RoBERTa) becomes a ``finetuned``
classify (or regress) run instead, its pooler and classifier sesame's ``pooler.0`` and ``head``.
``from_hf(DIR, RUN, generator=GEN)`` makes an ``ElectraForPreTraining`` discriminator and its
``ElectraForMaskedLM`` generator one ``electra`` run.
``to_hf(RUN, DIR)`` is the reverse: a pretrained run as the class of its objective's head where one
maps (else the base model, ``BertModel``, ...; an ``electra`` run's generator in ``DIR/generator``), or the
``*ForSequenceClassification`` of a fine-tuned classify / pair / regress run where the head maps.

One generic converter follows the architecture's row. Tensor by tensor:

* query, key and value are concatenated into sesame's one ``qkv`` projection (split again on export);
  GPT-2's Conv1D weights are stored (in, out) and transposed;
* RoBERTa's positions start after its padding index: a token at position p reads row
  padding_idx + 1 + p. Import drops the first padding_idx + 1 rows; export puts back zero rows (the
  padding row is zero in RoBERTa, and real tokens never read those rows);
* one token-type row (RoBERTa) is copied to a second, since sesame encodes pairs as segments 0 and 1;
  export drops the copy while it is still equal. A causal run with token types (sesame's own GPT-2
  family) exports to GPT-2, which has none, with type row 0 added into the positions: sesame's causal
  models never pass segment ids, so every token receives row 0;
* tokens the tokenizer import appends (GPT-2 has no pad, mask, cls or sep of its own) get a copy of
  their stand-in token's embedding row; export drops them while they are still copies.
"""
from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import nn

from ..errors import SesameError
from ..families import FAMILIES
from ..models import Transformer, TransformerConfig
from ..objectives import build_objective
from ..objectives.electra import generator_config
from ..rundir import load_tokenizer, new_run, read_config, write_config
from ..specs import RunConfig
from ..tasks import make_task
from ..tokenizer import TextTokenizer
from ..train.checkpoint import load_weights, read_json, save_weights, write_json
from .architectures import (ARCHITECTURES, EXPORTED_ACTIVATIONS, FAMILY_MODEL_TYPES, HF_ACTIVATIONS, Architecture,
                            architecture)
from .hf_tokenizer import export_tokenizer, import_tokenizer

BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids)$|(^|\.)attn\.(masked_)?bias$")  # saved by old versions
LEGACY = {".gamma": ".weight", ".beta": ".bias"}  # LayerNorm names of TensorFlow-converted checkpoints
CLASSIFY_TASKS = ("classify", "pair", "regress")
# objectives with sesame's MLM head and a second head, which *ForMaskedLM lacks
PART_HEADS = {"mlm_nsp": "next-sentence (NSP)", "mlm_sop": "sentence-order (SOP)", "span": "span-boundary (SBO)"}
POOLER_STD = 0.02  # transformers' initializer_range
EVAL_SEQ_LEN = 128  # a converted language model's evaluation window: sesame pretrain's default --seq-len
# an electra run's generator → the names of the mlm run it would be on its own (objectives/electra.py, mlm.py)
GENERATOR_NAMES = {"generator.": "backbone.", "generator_head.": "transform.", "generator_bias": "bias"}


@dataclass(frozen=True)
class Entry:
    """One run tensor and the checkpoint tensor(s) it is (several: concatenated along dim 0)."""

    sesame: str
    hf: tuple[str, ...]
    transposed: bool = False


@dataclass(frozen=True)
class Rows:
    """Where the checkpoint's embedding tables differ from the run's in rows."""

    offset: int  # position rows before sesame's position 0 (RoBERTa: padding_idx + 1)
    type_rows: int  # the checkpoint's token-type rows (0: none)
    vocab: int  # the checkpoint's vocabulary
    aliases: tuple[int, ...] = ()  # per appended token, the id whose row it copies


def _plan(arch: Architecture, backbone: Transformer) -> list[Entry]:
    """One entry per backbone parameter, from the architecture's module table."""
    linear = {name for name, m in backbone.named_modules() if isinstance(m, nn.Linear)}
    plan = []
    for name, _ in backbone.named_parameters():
        module, param = name.rsplit(".", 1)
        layer = re.fullmatch(r"(\w+)\.(\d+)\.(\w+)", module)
        key = f"{layer[1]}.{{i}}.{layer[3]}" if layer else module
        if key == "embed.types" and key not in arch.modules:
            continue  # a causal run's segment row 0, folded into the positions by _export_tensors
        if key not in arch.modules:
            raise SesameError(f"the run's {module} has no counterpart in {arch.base_class}")
        hf = arch.modules[key]
        plan.append(Entry(name, tuple(f"{n.format(i=layer[2] if layer else '')}.{param}"
                                      for n in (hf if isinstance(hf, tuple) else (hf,))),
                          arch.conv1d and module in linear and param == "weight"))
    return plan


def _import_tensors(weights: dict[str, torch.Tensor], plan: list[Entry], rows: Rows) -> dict[str, torch.Tensor]:
    state = {}
    for e in plan:
        parts = [weights[n].t() if e.transposed else weights[n] for n in e.hf]
        state[e.sesame] = torch.cat(parts) if len(parts) > 1 else parts[0]
    state["embed.positions.weight"] = state["embed.positions.weight"][rows.offset:]
    if rows.type_rows == 1:
        state["embed.types.weight"] = state["embed.types.weight"].repeat(2, 1)
    tokens = state["embed.tokens.weight"]
    state["embed.tokens.weight"] = torch.cat([tokens, tokens[list(rows.aliases)]])
    return {k: v.contiguous() for k, v in state.items()}


def _export_tensors(state: dict[str, torch.Tensor], plan: list[Entry], rows: Rows) -> dict[str, torch.Tensor]:
    state = dict(state)
    positions = state["embed.positions.weight"]
    if "embed.types.weight" in state and not rows.type_rows:  # a causal run to GPT-2: every token reads row 0
        positions = positions + state.pop("embed.types.weight")[0]
    elif "embed.types.weight" in state:
        state["embed.types.weight"] = state["embed.types.weight"][: rows.type_rows]
    padding = torch.zeros(rows.offset, positions.shape[1], dtype=positions.dtype, device=positions.device)
    state["embed.positions.weight"] = torch.cat([padding, positions])
    state["embed.tokens.weight"] = state["embed.tokens.weight"][: rows.vocab]
    out = {}
    for e in plan:
        for name, part in zip(e.hf, state[e.sesame].chunk(len(e.hf))):
            out[name] = (part.t() if e.transposed else part).contiguous()
    return out


def _dense_entries(module: str, hf_module: str) -> list[Entry]:
    """A dense layer outside the backbone (pooler, classifier head), kept as it is."""
    return [Entry(f"{module}.{p}", (f"{hf_module}.{p}",)) for p in ("weight", "bias")]


def _lm_entries(arch: Architecture, bias: str | None = None) -> list[Entry]:
    """The language-model head's tensors (sesame's MLM head; none for the CLM's tied output alone);
    ``bias`` names the checkpoint's output bias when it is stored under the decoder's name."""
    head = arch.lm
    entries = [e for module, hf in head.modules.items() for e in _dense_entries(module, hf)]
    return entries + ([Entry("bias", (bias or head.bias,))] if head.bias else [])


def _pair_entries(arch: Architecture, prefix: str = "") -> list[Entry]:
    """The [CLS] pooler (inside the base model, under ``prefix``) and the sentence-pair classifier."""
    return _dense_entries("pooler.0", prefix + arch.pooler) + _dense_entries(arch.pairs.module, arch.pairs.hf_module)


def _discriminator_entries(arch: Architecture) -> list[Entry]:
    """ELECTRA's replaced-token head, sesame's ``electra`` objective's ``discriminator_head``."""
    return [e for module, hf in arch.discriminator.items() for e in _dense_entries(module, hf)]


def _head_shapes(model: dict, vocab: int) -> dict[str, torch.Tensor]:
    """Meta tensors shaped as sesame's pre-training heads (objectives/mlm.py, pairs.py, electra.py) for ``model``
    with the checkpoint's ``vocab``: what a checkpoint's head must match (``decoder``: the tied output
    layer, the token embeddings and the bias)."""
    h, e = model["hidden"], model["embedding_size"] or model["hidden"]
    shapes = {"transform.0.weight": (e, h), "transform.0.bias": (e,), "transform.2.weight": (e,),
              "transform.2.bias": (e,), "bias": (vocab,), "pooler.0.weight": (h, h), "pooler.0.bias": (h,),
              "decoder.weight": (vocab, e), "decoder.bias": (vocab,)}
    shapes.update({f"{task}.{p}": s for task in ("nsp", "sop") for p, s in (("weight", (2, h)), ("bias", (2,)))})
    shapes.update({"discriminator_head.0.weight": (h, h), "discriminator_head.0.bias": (h,),
                   "discriminator_head.2.weight": (1, h), "discriminator_head.2.bias": (1,)})
    return {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}


def _check_new(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise SesameError(f"--out {out}: exists and is not empty; choose a new directory")


def _meta_backbone(model: dict) -> Transformer:
    """The backbone a config describes, without memory: for names and shapes only."""
    with torch.device("meta"):
        return Transformer(TransformerConfig(**model))


# -- import ----------------------------------------------------------------------------------------

def _read_weights(src: Path, flag: str = "--from-hf") -> tuple[dict[str, torch.Tensor], Path]:
    """The checkpoint's tensors (floating point ones as float32), and the file they came from."""
    index = src / "model.safetensors.index.json"
    try:
        if (src / "model.safetensors").is_file():
            path = src / "model.safetensors"
            weights = load_file(str(path))
        elif index.is_file():
            path, weights = index, {}
            for shard in sorted(set(read_json(index)["weight_map"].values())):
                weights.update(load_file(str(src / shard)))
        elif (src / "pytorch_model.bin").is_file():
            path = src / "pytorch_model.bin"
            weights = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise SesameError(f"{flag} {src}: no weights; expected model.safetensors, "
                              "model.safetensors.index.json or pytorch_model.bin")
    except (SafetensorError, OSError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError) as err:
        raise SesameError(f"{path}: unreadable as a weights file ({err}); only plain tensors load "
                          "(safetensors, or pytorch_model.bin without pickled code)") from None
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise SesameError(f"{path}: not a state dict of tensors")
    return {name: t.float() if t.is_floating_point() else t for name, t in weights.items()}, path


def _backbone_names(weights: dict[str, torch.Tensor], arch: Architecture) -> dict[str, torch.Tensor]:
    """Names relative to the base model: a task model's ``prefix.`` dropped, legacy gamma/beta renamed."""
    out = {}
    for name, tensor in weights.items():
        for old, new in LEGACY.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        out[name.removeprefix(arch.prefix + ".")] = tensor
    return out


def _model_config(hf: dict, arch: Architecture, where: str) -> dict:
    """TransformerConfig fields of a Hugging Face config (vocabulary and pad id still the checkpoint's)."""
    hf = {**arch.defaults, **hf}
    missing = [k for k in arch.config.values() if k not in hf]
    if missing:
        raise SesameError(f"{where}: lacks {', '.join(missing)}")
    wrong = [f"{k} {hf[k]!r} (sesame supports {v!r})" for k, v in arch.hf_fixed.items() if hf.get(k, v) != v]
    activation = arch.config["activation"]
    if hf[activation] not in HF_ACTIVATIONS:
        wrong.append(f"{activation} {hf[activation]!r} (sesame supports {', '.join(HF_ACTIVATIONS)})")
    if wrong:
        raise SesameError(f"{where}: " + "; ".join(wrong))
    model = {**arch.fixed, **{f: hf[k] for f, k in arch.config.items()}}
    model["activation"] = HF_ACTIVATIONS[model["activation"]]
    model["intermediate"] = model["intermediate"] or 4 * model["hidden"]  # GPT-2's n_inner None
    if model.get("embedding_size") == model["hidden"]:
        model["embedding_size"] = None
    if arch.position_offset:
        model["max_positions"] -= hf["pad_token_id"] + 1
    if model["type_vocab_size"] == 1:
        model["type_vocab_size"] = 2
    if arch.groups:
        groups = {1: "all", model["layers"]: "none"}
        if hf["num_hidden_groups"] not in groups:
            raise SesameError(f"{where}: num_hidden_groups {hf['num_hidden_groups']}: sesame shares all layers (1) "
                              f"or none ({model['layers']})")
        model["sharing"] = groups[hf["num_hidden_groups"]]
    return model


def _check_tensors(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], arch: Architecture,
                   path: Path, config_path: Path) -> list[str]:
    """Fail on missing, mis-shaped or unknown tensors; return the heads left behind."""
    missing = [n for n in expected if n not in weights]
    shapes = [f"{n} {tuple(weights[n].shape)} (config.json implies {tuple(t.shape)})"
              for n, t in expected.items() if n in weights and weights[n].shape != t.shape]
    others = [n for n in weights if n not in expected and not BUFFERS.search(n)]
    unexpected = [n for n in others if n.split(".")[0] not in arch.heads]
    if missing or shapes or unexpected:
        problems = [f"{what}: {', '.join(names)}" for what, names in
                    (("missing", missing), ("mis-shaped", shapes), ("unexpected", unexpected)) if names]
        raise SesameError(f"{path} does not match {config_path} ({arch.model_type}); " + "; ".join(problems)
                          + ". Check that config.json describes these weights")
    return sorted({n.split(".")[0] for n in others})


def _is_sequence_classifier(hf: dict) -> bool:
    return any(name.endswith("ForSequenceClassification") for name in hf.get("architectures") or [])


def _num_labels(hf: dict) -> int:
    """transformers writes ``id2label``; a hand-written config.json may give ``num_labels`` (default 2)."""
    return len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)


def sequence_task(hf: dict, arch: Architecture) -> tuple[str | None, str]:
    """The task a checkpoint's config.json makes it: ``classify``, or ``regress`` (``problem_type``
    regression, or one label), for a ``*ForSequenceClassification`` whose head maps onto sesame's;
    else ``(None, the reason)``."""
    if not _is_sequence_classifier(hf):
        names = ", ".join(hf.get("architectures") or [arch.base_class])
        return None, f"a {names} checkpoint, without a sequence-classification head"
    if arch.classifier is None:
        return None, f"{arch.model_type}'s sequence classifier does not match sesame's: {arch.not_classifier}"
    if hf.get("problem_type") == "multi_label_classification":
        return None, "a multi-label classifier; sesame's classify task picks one label per text"
    regression = hf.get("problem_type") == "regression" or _num_labels(hf) == 1
    return "regress" if regression else "classify", ""


def _pretraining_heads(weights: dict[str, torch.Tensor], given: dict, arch: Architecture
                       ) -> tuple[str | None, list[Entry], list[Entry], list[str]]:
    """What a checkpoint's pre-training heads import as: ``(objective, entries, checked, notes)``;
    ``checked`` are tensors whose shape is checked but which are not imported (tied copies, a pooler
    left behind), under the :func:`_head_shapes` name of their shape.

    The language-model head (:class:`~.architectures.LMHead`) becomes sesame's ``mlm`` or ``clm`` head
    where it computes the same function: the backbone's GELU, and an output layer tied to the token embeddings
    (a stored copy must equal them). With BERT's NSP or ALBERT's SOP head and the pooler it reads, the
    objective is ``mlm_nsp`` / ``mlm_sop``; without them an ``mlm`` run cannot hold the pooler, which
    is then left behind. ``objective`` is None (the pooler kept) when no head maps; notes say why."""
    head, notes = arch.lm, []
    pooler = _dense_entries("pooler.0", arch.pooler) if arch.pooler and f"{arch.pooler}.weight" in weights else []
    if arch.discriminator and any(n.startswith("discriminator_predictions.") for n in weights):
        notes.append("ELECTRA's discriminator head is left behind: sesame's electra objective also needs the "
                     "generator, which transformers keeps in a checkpoint of its own; give that directory with "
                     "--generator to import both as one electra run")
    bias = next((n for n in (head.bias, f"{head.decoder}.bias") if n in weights), None) if head and head.bias else None
    if head is None or not (bias or not head.bias and head.hf_class in (given.get("architectures") or [])):
        return None, pooler, [], notes
    tied = {f"{head.decoder}.weight": weights.get(f"{arch.modules['embed.tokens']}.weight"),
            f"{head.decoder}.bias": weights.get(bias)}  # a stored copy → what it must equal
    copies = [Entry(f"decoder.{n.rsplit('.', 1)[1]}", (n,)) for n in tied if n in weights and n != bias]
    activation = given[head.activation] if head.activation else "gelu"
    backbone_activation = given[arch.config["activation"]]
    why = ""
    if not head.same_activation(HF_ACTIVATIONS.get(activation, activation), HF_ACTIVATIONS[backbone_activation]):
        why = (f"its head applies {activation!r} where sesame's {head.objective} head applies the backbone's "
               f"{backbone_activation!r}")
    elif any(tied[e.hf[0]] is not None and not torch.equal(weights[e.hf[0]], tied[e.hf[0]]) for e in copies) or (
            f"{head.decoder}.weight" not in weights and given.get("tie_word_embeddings") is False):
        why = "its output layer is not tied to the token embeddings, as sesame's is"
    if why:
        return None, pooler, [], [*notes, f"{head.hf_class}'s language-model head is left behind: {why}"]
    entries = _lm_entries(arch, bias)
    pairs = arch.pairs
    if pairs and pooler and f"{pairs.hf_module}.weight" in weights:
        return pairs.objective, entries + _pair_entries(arch), copies, notes
    if pooler:
        notes.append(f"the [CLS] pooler is left behind: sesame's {head.objective} objective has none "
                     "(fine-tuning with pooling cls starts a fresh one)")
    return head.objective, entries, copies + pooler, notes


def _discriminator_head(weights: dict[str, torch.Tensor], given: dict, arch: Architecture, where: Path
                        ) -> list[Entry]:
    """``ElectraForPreTraining``'s head as sesame's ``discriminator_head`` (dense → exact GELU → Linear(H, 1),
    objectives/electra.py), which it computes only with ``hidden_act`` gelu; anything else is refused."""
    entries = _discriminator_entries(arch)
    if entries[0].hf[0] not in weights:
        names = ", ".join(given.get("architectures") or [arch.base_class])
        raise SesameError(f"{where}: {names} has no ELECTRA discriminator head ({entries[0].hf[0]}); --generator "
                          "needs the ElectraForPreTraining discriminator of the pair")
    activation = given[arch.config["activation"]]
    if activation != "gelu":
        raise SesameError(f"{where}: hidden_act {activation!r}: ElectraForPreTraining's head applies it where sesame's "
                          "electra discriminator head applies exact GELU ('gelu'), so the pair cannot become an "
                          "electra run; import the discriminator alone (without --generator)")
    return entries


def _labels(hf: dict, where: str) -> list[str]:
    """A classifier's label names, ordered by id (``id2label``; transformers' LABEL_i without one)."""
    id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(_num_labels(hf))}
    try:
        by_id = {int(i): str(name) for i, name in id2label.items()}
    except (AttributeError, TypeError, ValueError):  # not a dict of ids
        by_id = {}
    labels = [by_id.get(i) for i in range(len(id2label))]
    if None in labels or len(set(labels)) < len(labels):
        raise SesameError(f"{where}: id2label {id2label} must name the ids 0 to {len(id2label) - 1}, each with its "
                          "own label")
    return labels


def _max_length(src: Path, model: dict) -> int:
    """The tokens an imported classifier reads: tokenizer_config.json's ``model_max_length`` when it is
    below the model's positions (sesame's export writes the run's ``max_length`` there), else all of them."""
    path = src / "tokenizer_config.json"
    given = read_json(path).get("model_max_length") if path.is_file() else None
    return given if isinstance(given, int) and 8 <= given < model["max_positions"] else model["max_positions"]


def _identity_projection(arch: Architecture, hidden: int) -> dict[str, torch.Tensor]:
    """ALBERT's embedding → hidden projection as the identity: what a stack with E == H computes
    without one (sesame builds none then; ``AlbertModel`` always has one)."""
    return {arch.modules["project"] + ".weight": torch.eye(hidden), arch.modules["project"] + ".bias": torch.zeros(hidden)}


def _drop_identity_projection(weights: dict[str, torch.Tensor], arch: Architecture, path: Path) -> None:
    """An E == H checkpoint's projection, removed from ``weights`` if it is the identity (sesame has none then)."""
    name = arch.modules["project"]
    if name + ".weight" not in weights:
        return  # reported as missing by the tensor check
    weight, bias = weights.pop(name + ".weight"), weights.pop(name + ".bias", None)
    if not (torch.equal(weight.float(), torch.eye(*weight.shape)) and (bias is None or not bias.any())):
        raise SesameError(f"{path}: {name} is not the identity, but embedding_size equals hidden_size and sesame's "
                          "stack has no projection then; this checkpoint cannot be converted")


@dataclass
class Imported:
    """A converted checkpoint before it is written: the run's config.json, tensors, tokenizer, labels and summary."""

    config: RunConfig
    state: dict[str, torch.Tensor]
    tok: TextTokenizer
    labels: list[str]
    summary: dict


def _import(src: Path, discriminator: bool = False, flag: str = "--from-hf") -> Imported:
    """The run the model directory ``src`` converts to (:func:`from_hf`); with ``discriminator``, an
    ``ElectraForPreTraining`` whose head becomes the ``electra`` objective's (its generator still to add)."""
    config_path = src / "config.json"
    if not config_path.is_file():
        raise SesameError(f"{flag} {src}: no config.json; give a transformers model directory (save_pretrained)")
    hf_config = read_json(config_path)
    arch = architecture(hf_config.get("model_type"), str(config_path))
    if discriminator and not arch.discriminator:
        raise SesameError(f"{config_path}: a {arch.model_type} checkpoint; --generator pairs an ELECTRA discriminator "
                          "(ElectraForPreTraining) with its generator (ElectraForMaskedLM)")
    model = _model_config(hf_config, arch, str(config_path))
    tok, record, aliases = import_tokenizer(src, arch, model["vocab_size"])
    given = {**arch.defaults, **hf_config}
    if arch.position_offset and tok.specials.pad != given["pad_token_id"]:
        raise SesameError(f"{config_path}: pad_token_id {given['pad_token_id']} is not the tokenizer's pad token "
                          f"({tok.specials.pad}); RoBERTa's positions count from the padding index, so they must agree")
    rows = Rows(offset=given["pad_token_id"] + 1 if arch.position_offset else 0,
                type_rows=given.get("type_vocab_size", 0), vocab=model["vocab_size"], aliases=tuple(aliases.values()))
    model.update(vocab_size=model["vocab_size"] + len(aliases), pad_id=tok.specials.pad)
    try:
        model = TransformerConfig(**model).to_dict()
    except ValueError as err:
        raise SesameError(f"{config_path}: {err}") from None
    weights, path = _read_weights(src, flag)
    weights = _backbone_names(weights, arch)
    if arch.always_projects and model["embedding_size"] is None:
        _drop_identity_projection(weights, arch, path)
    meta = _meta_backbone(model)
    plan = _plan(arch, meta)
    expected = _export_tensors(meta.state_dict(), plan, rows)
    task, why_not = sequence_task(hf_config, arch)
    labels = _labels(hf_config, str(config_path)) if task == "classify" else []
    objective, checked, notes = None, [], []
    if task:  # the exact inverse of export's head: names relative to the base model, as the weights now are
        extra = [Entry(e.sesame, (e.hf[0].removeprefix(arch.prefix + "."),))
                 for module, name in arch.classifier.items() for e in _dense_entries(module, name)]
        with torch.device("meta"):  # the shapes of sesame's own pooler and head
            shapes = make_task(task).build(meta, max(1, len(labels)), "cls", 0.0).state_dict()
    else:
        objective, extra, checked, notes = (("electra", _discriminator_head(weights, given, arch, config_path), [], [])
                                            if discriminator else _pretraining_heads(weights, given, arch))
        shapes = _head_shapes(model, rows.vocab)
        if _is_sequence_classifier(hf_config):
            notes.insert(0, f"{why_not}; its backbone alone is imported")
    expected.update({e.hf[0]: shapes[e.sesame] for e in extra + checked})
    dropped = _check_tensors(weights, expected, arch, path, config_path)
    state = {"backbone." + k: v for k, v in _import_tensors(weights, plan, rows).items()}
    state.update({e.sesame: weights[e.hf[0]].contiguous() for e in extra})
    if "bias" in state:  # the output bias has a row per token, like the embeddings: appended tokens copy theirs
        state["bias"] = torch.cat([state["bias"], state["bias"][list(rows.aliases)]])
    if objective and rows.aliases:
        notes.append(f"the appended tokens {', '.join(record['aliases'])} share the output rows of the tokens they "
                     f"copy ({', '.join(sorted(set(record['aliases'].values())))}), so sesame's {objective} "
                     "probabilities are transformers' divided by 1 + the copies' probability: its loss and "
                     "perplexity come out slightly above transformers'")
    origin = {"model_type": arch.model_type, "source": str(src.resolve()), "config": hf_config, "tokenizer": record}
    if task:
        job = make_task(task)
        config = RunConfig(kind="finetuned", task=task, task_options=job.options(), family=arch.family,
                           pooling="cls", model=model, max_length=_max_length(src, model), select=job.select, hf=origin)
    else:
        config = RunConfig(kind="pretrained", family=arch.family, objective=objective,
                           pooling=FAMILIES[arch.family].pooling, model=model, hf=origin)
        if objective:  # the window `sesame evaluate` reads by default (--seq-len overrides it)
            config.seq_len = min(EVAL_SEQ_LEN, model["max_positions"])
    summary = {"model_type": arch.model_type, "family": arch.family, "kind": config.kind, "task": task,
               "objective": objective, "labels": labels, "layers": model["layers"], "hidden": model["hidden"],
               "vocab_size": model["vocab_size"], "pooler": any(e.sesame.startswith("pooler.") for e in extra),
               "dropped_heads": dropped, "renamed_tokens": record["renamed"],
               "appended_tokens": list(record["aliases"]), "notes": notes}
    return Imported(config, state, tok, labels, summary)


def _add_generator(run: Imported, gen: Imported, where: str) -> None:
    """Complete the discriminator ``run`` (``_import(..., discriminator=True)``) with the imported
    ``ElectraForMaskedLM`` ``gen`` as its ``electra`` objective's generator.

    sesame's generator (objectives/electra.py) reads the discriminator's embeddings and is the size
    :func:`generator_config` gives for ``generator_fraction`` = its width / the discriminator's. The
    released ELECTRA pairs were trained with tied embeddings, and their configs fit: discriminator /
    generator width small 256/256 (fraction 1), base 768/256, large 1024/256, at 64 per head and 4·width
    feed-forward."""
    g = gen.summary
    if (g["model_type"], g["objective"]) != ("electra", "mlm"):
        found = ", ".join(gen.config.hf["config"].get("architectures") or [f"a {g['model_type']} model"])
        why = "".join(f" ({n})" for n in g["notes"] if n.startswith("ElectraForMaskedLM's"))  # its head's reason
        raise SesameError(f"{where}: the generator is {found}, not an ElectraForMaskedLM whose head imports{why}; "
                          "give the generator checkpoint of this discriminator")
    model, got = run.config.model, dict(gen.config.model)
    fraction = got["hidden"] / model["hidden"]
    needed = generator_config(TransformerConfig(**model), fraction).to_dict()
    for m in (needed, got):
        m["embedding_size"] = m["embedding_size"] or m["hidden"]
    differ = [f"{k} {got[k]!r} (needs {v!r})" for k, v in needed.items() if got[k] != v]
    if differ:
        raise SesameError(f"{where}: the generator does not fit sesame's electra generator of this discriminator "
                          f"(generator_fraction {fraction:g}, its hidden size / the discriminator's: as deep, heads = "
                          "width // 64, feed-forward 4·width, the same embeddings and settings): " + "; ".join(differ)
                          + "; import the two separately (without --generator) instead")
    if gen.tok.backend.get_vocab() != run.tok.backend.get_vocab():
        raise SesameError(f"{where}: the two checkpoints' vocabularies differ; give the generator trained with this "
                          "discriminator")
    modules = ARCHITECTURES["electra"].modules
    differ = [modules[k.removeprefix("backbone.").rsplit(".", 1)[0]] + "." + k.rsplit(".", 1)[1]
              for k in run.state if k.startswith("backbone.embed.") and not torch.equal(run.state[k], gen.state[k])]
    if differ:
        raise SesameError(f"{where}: the generator's embeddings differ from the discriminator's ({', '.join(differ)}); "
                          "sesame's electra generator reads the discriminator's, as the released ELECTRA pairs "
                          "(trained tied) do: give the generator trained with this discriminator")
    for name, tensor in gen.state.items():
        if not name.startswith("backbone.embed."):
            ours, mlm = next((o, m) for o, m in GENERATOR_NAMES.items() if name.startswith(m))
            run.state[ours + name.removeprefix(mlm)] = tensor
    run.config.objective_options = {"generator_fraction": fraction}
    run.config.hf["generator"] = {"source": gen.config.hf["source"], "config": gen.config.hf["config"]}
    run.summary.update(generator_fraction=fraction,
                       notes=run.summary["notes"] + [f"generator: {note}" for note in g["notes"]])


def from_hf(src: str | Path, out: str | Path, generator: str | Path | None = None) -> dict:
    """Convert the Hugging Face model directory ``src`` into the run ``out``: ``pretrained``, or
    ``finetuned`` for a sequence classifier whose head maps (:func:`sequence_task`). With ``generator``
    (an ``ElectraForMaskedLM`` directory) ``src`` must be its ``ElectraForPreTraining`` discriminator,
    and the run is one ``electra`` run holding both (:func:`_add_generator`). Returns a summary."""
    src, out = Path(src), Path(out)
    _check_new(out)
    imported = _import(src, discriminator=generator is not None)
    if generator is not None:
        _add_generator(imported, _import(Path(generator), flag="--generator"),
                       f"--from-hf {src} --generator {generator}")
    with new_run(out, imported.config.kind, resume=False) as run:
        imported.tok.save(run / "tokenizer.json")
        save_weights(run / "model.safetensors", imported.state)
        if imported.labels:
            write_json(run / "labels.json", imported.labels)
        write_config(run, imported.config)
    return imported.summary


# -- export ----------------------------------------------------------------------------------------

def _check_exportable(model: dict, arch: Architecture, where: str) -> None:
    """Fail unless the run's backbone is exactly an ``arch`` model."""
    problems = [f"{f} is {model[f]!r}, {arch.model_type} needs {v!r}" for f, v in arch.fixed.items()
                if f != "type_vocab_size" and model[f] != v]
    if model["adapter_size"] or model["scalar_mix"]:
        problems.append("it has adapters or a scalar mix, which transformers models lack")
    if arch.groups and model["sharing"] not in ("all", "none"):
        problems.append(f"sharing {model['sharing']!r}: ALBERT shares all layers or none")
    if "embed.types" in arch.modules and not model["type_vocab_size"]:
        problems.append(f"it has no token-type embeddings, which {arch.base_class} needs")
    if "embed.types" not in arch.modules and model["type_vocab_size"] and not model["causal"]:
        problems.append(f"it has token-type embeddings, which {arch.base_class} lacks")
    if problems:
        raise SesameError(f"{where}: the model does not fit {arch.base_class}: " + "; ".join(problems))


def _still_copies(tokens: torch.Tensor, record: dict | None, vocab: int, backend_ids: dict[str, int]) -> bool:
    """Whether the appended alias tokens are the last rows and still equal the rows they copied."""
    if not record or not record["aliases"]:
        return False
    ids = [backend_ids[name] for name in record["aliases"]]
    renamed = record["renamed"]
    sources = [backend_ids[renamed.get(s, s)] for s in record["aliases"].values()]
    return sorted(ids) == list(range(vocab, tokens.shape[0])) and torch.equal(tokens[ids], tokens[sources])


def _classifier(config: RunConfig, run: Path, arch: Architecture, where: str) -> tuple[list[Entry], dict]:
    """The head entries and config keys of the matching *ForSequenceClassification."""
    task, options = config.task, config.task_options
    if task not in CLASSIFY_TASKS:
        raise SesameError(f"{where}: a {task} run; only {', '.join(CLASSIFY_TASKS)} runs export (as "
                          "*ForSequenceClassification)")
    if arch.classifier is None:
        raise SesameError(f"{where}: {arch.model_type}'s sequence classifier does not match sesame's: "
                          f"{arch.not_classifier}")
    if config.pooling != "cls" or options.get("symmetric"):
        pooled = f"pooling {config.pooling!r}" + (" of both orders of a pair" if options.get("symmetric") else "")
        raise SesameError(f"{where}: {pooled}; transformers' classifier reads the first token of one sequence "
                          "(pooling cls)")
    labels = read_json(run / "labels.json") if task != "regress" else []
    head = {"num_labels": len(labels) or 1,
            "problem_type": "regression" if task == "regress" else "single_label_classification"}
    if labels:
        head.update(id2label={str(i): name for i, name in enumerate(labels)},
                    label2id={name: i for i, name in enumerate(labels)})
    return [e for module, hf in arch.classifier.items() for e in _dense_entries(module, hf)], head


def _export_heads(config: RunConfig, model: dict, arch: Architecture) -> tuple[list[Entry], str, list[str]]:
    """A pretrained run's objective head in transformers: ``(entries, class, notes)`` of the
    ``*ForMaskedLM``, ``*ForPreTraining``, ``GPT2LMHeadModel`` or ``ElectraForPreTraining`` with the same
    function, or no entries and the base model (the reason in the notes) where none has it."""
    objective, head, pairs = config.objective, arch.lm, arch.pairs
    if objective is None:
        return [], arch.base_class, []
    exact = model["activation"] == "gelu"  # sesame's ELECTRA discriminator head applies exact GELU
    other = f"the backbone's activation, {EXPORTED_ACTIVATIONS[model['activation']]} here, not exact GELU"
    why = f"{arch.model_type} has no such head in transformers"
    if objective == "electra" and arch.discriminator:
        if exact:  # the generator goes to a directory of its own (to_hf)
            return _discriminator_entries(arch), "ElectraForPreTraining", []
        why = f"ElectraForPreTraining's head applies {other}"
    if head and head.objective == ("mlm" if objective in PART_HEADS or objective == "mlm" else objective):
        name = pairs.hf_class if pairs and objective == pairs.objective else head.hf_class
        if head.same_activation(model["activation"] if head.activation else "gelu", model["activation"]):
            if name != head.hf_class:
                return _lm_entries(arch) + _pair_entries(arch, arch.prefix + "."), name, []
            notes = [f"its {PART_HEADS[objective]} head is left behind: {name} has none"] \
                if objective in PART_HEADS else []
            return _lm_entries(arch), name, notes
        why = (f"{name}'s head applies exact GELU where sesame's applies the backbone's "
               f"{EXPORTED_ACTIVATIONS[model['activation']]}")
    return [], arch.base_class, [f"its {objective} head is left behind: {why}"]


def _hf_config(model: dict, arch: Architecture, source: dict, rows: Rows) -> dict:
    """The transformers config of the run's backbone: the imported checkpoint's own config (when the
    run came from one) with every value the run determines set from it."""
    hf = {k: v for k, v in source.items() if k not in ("architectures", "id2label", "label2id", "num_labels",
                                                        "problem_type", "transformers_version")}
    hf.update({k: model[f] for f, k in arch.config.items()})
    hf.update(arch.hf_fixed, model_type=arch.model_type, vocab_size=rows.vocab)
    hf[arch.config["activation"]] = EXPORTED_ACTIVATIONS[model["activation"]]
    hf[arch.config["max_positions"]] = model["max_positions"] + rows.offset
    if "type_vocab_size" in arch.config:
        hf["type_vocab_size"] = rows.type_rows
    if "embedding_size" in arch.config:
        hf["embedding_size"] = model["embedding_size"] or model["hidden"]
    if arch.groups:
        hf["num_hidden_groups"] = 1 if model["sharing"] == "all" else model["layers"]
    return hf


def _generator_run(config: RunConfig, weights: dict[str, torch.Tensor], tok: TextTokenizer
                   ) -> tuple[dict, dict[str, torch.Tensor]]:
    """An ``electra`` run's generator as the ``mlm`` run it would be on its own: the configuration the
    objective builds it with, the discriminator's embeddings, its layers and head under an mlm run's
    names, and the checkpoint config it was imported from (if it was)."""
    with torch.device("meta"):
        objective = build_objective("electra", Transformer(TransformerConfig(**config.model)), tok,
                                    config.objective_options)
    state = {k: v for k, v in weights.items() if k.startswith("backbone.embed.")}
    for name, tensor in weights.items():
        ours = next((o for o in GENERATOR_NAMES if name.startswith(o)), None)
        if ours:
            state[GENERATOR_NAMES[ours] + name.removeprefix(ours)] = tensor
    record = config.hf
    if record:
        record = {**record, "config": (record.get("generator") or {}).get("config", {})}
    return replace(config, objective="mlm", model=objective.generator.config.to_dict(), hf=record), state


def _write_hf(config: RunConfig, weights: dict[str, torch.Tensor], tok: TextTokenizer, run: Path, out: Path,
              generator: bool = False) -> dict:
    """Write the run (``config``, ``weights``) as a transformers model directory ``out``; ``generator``:
    an electra run's generator (:func:`_generator_run`), whose head applies exact GELU whatever the
    backbone's activation, as ``ElectraForMaskedLM``'s does."""
    where = f"--to-hf {run}"
    record = config.hf
    model_type = record["model_type"] if record else FAMILY_MODEL_TYPES.get(config.family)
    if model_type is None:
        raise SesameError(f"{where}: family {config.family!r} has no transformers architecture here; exportable "
                          f"families: {', '.join(FAMILY_MODEL_TYPES)}")
    arch = ARCHITECTURES[model_type]
    model = TransformerConfig(**config.model).to_dict()  # older runs: today's defaults for new fields
    _check_exportable(model, arch, where)
    backbone = {k.removeprefix("backbone."): v for k, v in weights.items() if k.startswith("backbone.")}
    tokens = backbone["embed.tokens.weight"]
    source = record["config"] if record else {}
    vocab = source.get("vocab_size", tokens.shape[0])
    drop = all(_still_copies(t, record and record["tokenizer"], vocab, tok.backend.get_vocab())
               for t in (tokens, weights.get("bias")) if t is not None)  # the MLM head's bias has rows too
    types = backbone.get("embed.types.weight")
    one_type = source.get("type_vocab_size") == 1 and types is not None and torch.equal(types[0], types[1])
    rows = Rows(offset=model["pad_id"] + 1 if arch.position_offset else 0,
                type_rows=0 if "embed.types" not in arch.modules else 1 if one_type else model["type_vocab_size"],
                vocab=vocab if drop else tokens.shape[0])

    notes = []
    extra, head = [], {}
    if config.kind == "finetuned":
        extra, head = _classifier(config, run, arch, where)
        prefix, name = arch.prefix + ".", arch.base_class.removesuffix("Model") + "ForSequenceClassification"
    else:
        extra, name, notes = (_lm_entries(arch), arch.lm.hf_class, []) if generator else \
            _export_heads(config, model, arch)
        prefix = "" if name == arch.base_class else arch.prefix + "."
        if name != arch.base_class:
            head = {"tie_word_embeddings": True}  # sesame's output layer is the token embeddings
        elif arch.pooler:
            extra = _dense_entries("pooler.0", arch.pooler)
            if "pooler.0.weight" not in weights:
                hidden = model["hidden"]
                weights = {**weights, "pooler.0.weight": torch.randn(hidden, hidden, generator=torch.Generator()
                                                                     .manual_seed(0)) * POOLER_STD,
                           "pooler.0.bias": torch.zeros(hidden)}
                notes.append(f"the run has no trained [CLS] pooler; {arch.base_class}'s pooler is freshly initialised "
                             f"(N(0, {POOLER_STD}), seed 0), as transformers would")
    tensors = {prefix + k: v for k, v in _export_tensors(backbone, _plan(arch, _meta_backbone(model)), rows).items()}
    if arch.always_projects and model["embedding_size"] is None:
        tensors.update({prefix + k: v for k, v in _identity_projection(arch, model["hidden"]).items()})
    tensors.update({e.hf[0]: (weights[e.sesame][: rows.vocab] if e.sesame == "bias" else weights[e.sesame])
                    .contiguous() for e in extra})

    tokenizer_json, specials = export_tokenizer(tok, record and record["tokenizer"], drop)
    ids = Tokenizer.from_str(tokenizer_json).get_vocab()
    specials = {k: v for k, v in specials.items() if v in ids}
    hf = _hf_config(model, arch, source, rows)
    hf.update(head, architectures=[name], pad_token_id=ids.get(specials.get("pad_token")))
    hf.update({f"{r}_token_id": ids[specials[f"{r}_token"]] for r in ("bos", "eos") if f"{r}_token" in specials})

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    (out / "tokenizer.json").write_text(tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **specials,
        "model_max_length": config.max_length if config.kind == "finetuned" else model["max_positions"],
        "model_input_names": list(arch.inputs)}, indent=2) + "\n")
    return {"model_type": arch.model_type, "architecture": name, "vocab_size": rows.vocab, "notes": notes}


def to_hf(run: str | Path, out: str | Path) -> dict:
    """Export the run ``run`` as a transformers model directory ``out``; returns a summary with notes.
    An ``electra`` run's generator is written beside it, as ``ElectraForMaskedLM`` in ``out/generator``."""
    run, out = Path(run), Path(out)
    config = read_config(run, "--to-hf", ("pretrained", "finetuned"))
    _check_new(out)
    tok = load_tokenizer(run, "--to-hf")
    weights = load_weights(run / "model.safetensors")
    summary = _write_hf(config, weights, tok, run, out)
    if config.objective == "electra":
        _write_hf(*_generator_run(config, weights, tok), tok, run, out / "generator", generator=True)
        summary["generator"] = str(out / "generator")
    return summary
