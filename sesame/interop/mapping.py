"""The shared name map of Hugging Face import and export: which sesame tensor is which transformers tensor
(:class:`Entry`), the rows of an embedding that tokens were appended to or renamed in (:class:`Rows`), and
the head entries of each pre-training objective and classifier, and the reading of a checkpoint's tensors."""
from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ..errors import SesameError
from ..models import Transformer, TransformerConfig
from ..outputs import check_dir, claim_dir
from ..train.checkpoint import read_json
from .architectures import Architecture

# objectives with sesame's MLM head and a second head, which *ForMaskedLM lacks
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


def name_plan(arch: Architecture, backbone: Transformer) -> list[Entry]:
    """One entry per backbone parameter, from the architecture's module table."""
    linear = {name for name, m in backbone.named_modules() if isinstance(m, nn.Linear)}
    plan = []
    for name, _ in backbone.named_parameters():
        module, param = name.rsplit(".", 1)
        layer = re.fullmatch(r"(\w+)\.(\d+)\.(\w+)", module)
        key = f"{layer[1]}.{{i}}.{layer[3]}" if layer else module
        if key == "embed.types" and key not in arch.modules:
            continue  # a causal run's segment row 0, folded into the positions by export_tensors
        if key not in arch.modules:
            raise SesameError(f"the run's {module} has no counterpart in {arch.base_class}")
        hf = arch.modules[key]
        plan.append(Entry(name, tuple(f"{n.format(i=layer[2] if layer else '')}.{param}"
                                      for n in (hf if isinstance(hf, tuple) else (hf,))),
                          arch.conv1d and module in linear and param == "weight"))
    return plan


def joined(weights: dict[str, torch.Tensor], plan: list[Entry]) -> dict[str, torch.Tensor]:
    """The plan's sesame tensors from the checkpoint's: each entry's parts concatenated along dim 0."""
    state = {}
    for e in plan:
        parts = [weights[n].t() if e.transposed else weights[n] for n in e.hf]
        state[e.sesame] = torch.cat(parts) if len(parts) > 1 else parts[0]
    return state


def split(state: dict[str, torch.Tensor], plan: list[Entry]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`joined`: the checkpoint's tensors from the plan's sesame tensors."""
    out = {}
    for e in plan:
        for name, part in zip(e.hf, state[e.sesame].chunk(len(e.hf))):
            out[name] = (part.t() if e.transposed else part).contiguous()
    return out


def import_tensors(weights: dict[str, torch.Tensor], plan: list[Entry], rows: Rows) -> dict[str, torch.Tensor]:
    state = joined(weights, plan)
    state["embed.positions.weight"] = state["embed.positions.weight"][rows.offset:]
    if rows.type_rows == 1:
        state["embed.types.weight"] = state["embed.types.weight"].repeat(2, 1)
    tokens = state["embed.tokens.weight"]
    state["embed.tokens.weight"] = torch.cat([tokens, tokens[list(rows.aliases)]])
    return {k: v.contiguous() for k, v in state.items()}


def export_tensors(state: dict[str, torch.Tensor], plan: list[Entry], rows: Rows) -> dict[str, torch.Tensor]:
    state = dict(state)
    positions = state["embed.positions.weight"]
    if "embed.types.weight" in state and not rows.type_rows:  # a causal run to GPT-2: every token reads row 0
        positions = positions + state.pop("embed.types.weight")[0]
    elif "embed.types.weight" in state:
        state["embed.types.weight"] = state["embed.types.weight"][: rows.type_rows]
    padding = torch.zeros(rows.offset, positions.shape[1], dtype=positions.dtype, device=positions.device)
    state["embed.positions.weight"] = torch.cat([padding, positions])
    state["embed.tokens.weight"] = state["embed.tokens.weight"][: rows.vocab]
    return split(state, plan)


def check_tensors(weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *, where: str,
                  known: set[str] | None = None, optional: tuple[str, ...] = ()) -> None:
    """A :class:`SesameError` naming every tensor of ``weights`` that ``expected`` (the configuration's, by name)
    lacks (``known``: also allowed, e.g. tied copies; default ``expected``'s names), every expected one that is
    missing (but ``optional``) and every one in another shape; ``where``: what the weights are, for the message."""
    known = set(expected) if known is None else known
    found = {"missing": [n for n in expected if n not in weights and n not in optional],
             "mis-shaped": [f"{n} {tuple(weights[n].shape)} (config.json implies {tuple(t.shape)})"
                            for n, t in expected.items() if n in weights and weights[n].shape != t.shape],
             "unexpected": [n for n in weights if n not in known]}
    if any(found.values()):
        raise SesameError(f"{where}: the tensors do not match config.json: "
                          + "; ".join(f"{what}: {', '.join(names)}" for what, names in found.items() if names)
                          + "; check that config.json describes these weights")


def dense_entries(module: str, hf_module: str) -> list[Entry]:
    """A dense layer outside the backbone (pooler, classifier head), kept as it is."""
    return [Entry(f"{module}.{p}", (f"{hf_module}.{p}",)) for p in ("weight", "bias")]


def lm_entries(arch: Architecture, bias: str | None = None) -> list[Entry]:
    """The language-model head's tensors (sesame's MLM head; none for the CLM's tied output alone);
    ``bias`` names the checkpoint's output bias when it is stored under the decoder's name."""
    head = arch.lm
    entries = [e for module, hf in head.modules.items() for e in dense_entries(module, hf)]
    return entries + ([Entry("bias", (bias or head.bias,))] if head.bias else [])


def pair_entries(arch: Architecture, prefix: str = "") -> list[Entry]:
    """The [CLS] pooler (inside the base model, under ``prefix``) and the sentence-pair classifier."""
    return dense_entries("pooler.0", prefix + arch.pooler) + dense_entries(arch.pairs.module, arch.pairs.hf_module)


def discriminator_entries(arch: Architecture) -> list[Entry]:
    """ELECTRA's replaced-token head, sesame's ``electra`` objective's ``discriminator_head``."""
    return [e for module, hf in arch.discriminator.items() for e in dense_entries(module, hf)]


def head_shapes(model: dict, vocab: int) -> dict[str, torch.Tensor]:
    """Meta tensors shaped as sesame's pre-training heads (objectives/mlm.py, pairs.py, electra.py) for ``model``
    with the checkpoint's ``vocab``: what a checkpoint's head must match (``decoder.*``: the tied output
    layer, the token embeddings and the bias; ``decoder``: an untied masked LM's own output layer)."""
    h, e = model["hidden"], model["embedding_size"] or model["hidden"]
    shapes = {"transform.0.weight": (e, h), "transform.0.bias": (e,), "transform.2.weight": (e,),
              "transform.2.bias": (e,), "bias": (vocab,), "pooler.0.weight": (h, h), "pooler.0.bias": (h,),
              "decoder.weight": (vocab, e), "decoder.bias": (vocab,), "decoder": (vocab, e)}
    shapes.update({f"{task}.{p}": s for task in ("nsp", "sop") for p, s in (("weight", (2, h)), ("bias", (2,)))})
    shapes.update({"discriminator_head.0.weight": (h, h), "discriminator_head.0.bias": (h,),
                   "discriminator_head.2.weight": (1, h), "discriminator_head.2.bias": (1,)})
    return {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}


CLASSIFY_TASKS = ("classify", "pair", "regress")  # the tasks whose runs export as *ForSequenceClassification


def is_sequence_classifier(hf: dict) -> bool:
    """Whether a config.json is a ``*ForSequenceClassification``'s."""
    return any(name.endswith("ForSequenceClassification") for name in hf.get("architectures") or [])


def _num_labels(hf: dict) -> int:
    """transformers writes ``id2label``; a hand-written config.json may give ``num_labels`` (default 2)."""
    return len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)


def classifier_task(hf: dict) -> tuple[str | None, str]:
    """The task a sequence classifier's config.json makes it: ``classify``, or ``regress`` (``problem_type``
    regression, or one label); ``(None, the reason)`` for a multi-label classifier."""
    if hf.get("problem_type") == "multi_label_classification":
        return None, "a multi-label classifier; sesame's classify task picks one label per text"
    regression = hf.get("problem_type") == "regression" or _num_labels(hf) == 1
    return "regress" if regression else "classify", ""


def classifier_labels(hf: dict, where: str) -> list[str]:
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


def classifier_max_length(src: Path, model: dict) -> int:
    """The tokens an imported classifier reads: tokenizer_config.json's ``model_max_length`` when it is
    below the model's positions (sesame's export writes the run's ``max_length`` there), else all of them."""
    path = src / "tokenizer_config.json"
    given = read_json(path).get("model_max_length") if path.is_file() else None
    return given if isinstance(given, int) and 8 <= given < model["max_positions"] else model["max_positions"]


def classifier_config(task: str, labels: list[str]) -> dict:
    """The config.json keys of a ``*ForSequenceClassification`` for a fine-tuned ``task`` with ``labels``."""
    head = {"num_labels": len(labels) or 1,
            "problem_type": "regression" if task == "regress" else "single_label_classification"}
    if labels:
        head.update(id2label={str(i): name for i, name in enumerate(labels)},
                    label2id={name: i for i, name in enumerate(labels)})
    return head


def check_new(out: Path) -> None:
    """``--out`` is a new or empty directory (:func:`sesame.outputs.check_dir`)."""
    check_dir(out, "--out", fix="choose a new directory")


def claim_new(out: Path) -> None:
    """``--out``, a new or empty directory, made and held for this command (:func:`sesame.outputs.claim_dir`)."""
    claim_dir(out, "--out", fix="choose a new directory")


def meta_backbone(model: dict) -> Transformer:
    """The backbone a config describes, without memory: for names and shapes only."""
    with torch.device("meta"):
        return Transformer(TransformerConfig(**model))


def identity_projection(arch: Architecture, hidden: int) -> dict[str, torch.Tensor]:
    """ALBERT's embedding → hidden projection as the identity: what a stack with E == H computes
    without one (sesame builds none then; ``AlbertModel`` always has one)."""
    return {arch.modules["project"] + ".weight": torch.eye(hidden), arch.modules["project"] + ".bias": torch.zeros(hidden)}


def checkpoint_config(src: Path, flag: str = "--from-hf") -> dict:
    """The config.json of the transformers model directory ``src`` (named by ``flag``), which a conversion reads once
    and passes down."""
    path = src / "config.json"
    if not path.is_file():
        raise SesameError(f"{flag} {src}: no config.json; give a transformers model directory (save_pretrained)")
    return read_json(path)


def read_weights(src: Path, flag: str = "--from-hf", *, pickles: bool = True
                 ) -> tuple[dict[str, torch.Tensor], Path]:
    """The checkpoint's tensors (floating point ones as float32), and the file they came from: model.safetensors,
    a sharded model.safetensors.index.json, or (``pickles``) pytorch_model.bin read with ``weights_only``."""
    index = src / "model.safetensors.index.json"
    expected = "model.safetensors, model.safetensors.index.json" + (" or pytorch_model.bin" if pickles else
                                                                     " (save_pretrained writes them)")
    path = src
    try:
        if (src / "model.safetensors").is_file():
            path = src / "model.safetensors"
            weights = load_file(str(path))
        elif index.is_file():
            path, weights = index, {}
            for shard in sorted(set(read_json(index)["weight_map"].values())):
                weights.update(load_file(str(src / shard)))
        elif pickles and (src / "pytorch_model.bin").is_file():
            path = src / "pytorch_model.bin"
            weights = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise SesameError(f"{flag} {src}: no weights; expected {expected}")
    except pickle.UnpicklingError:  # weights_only met an object that is no tensor: torch's message runs to lines
        safetensors = path.parent / "model.safetensors"
        raise SesameError(f"{path}: unreadable as a weights file: it pickles objects besides tensors, which sesame "
                          "never unpickles (that could run code); if you trust its source, convert it to safetensors: "
                          f"python -c \"import torch, safetensors.torch as st; w = torch.load('{path}', "
                          "weights_only=False); st.save_file({k: v.contiguous().clone() for k, v in w.items() if "
                          f"torch.is_tensor(v)}}, '{safetensors}')\"") from None
    except (SafetensorError, OSError, RuntimeError, KeyError, EOFError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SesameError(f"{path}: unreadable as a weights file ({reason}); only plain tensors load "
                          "(safetensors, or pytorch_model.bin without pickled code)") from None
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise SesameError(f"{path}: not a state dict of tensors")
    return {name: t.float() if t.is_floating_point() else t for name, t in weights.items()}, path
