"""``to_hf``: a run → a directory transformers loads (config.json, model.safetensors, tokenizer files); an
ELECTRA run's generator goes to its ``generator/`` subdirectory; an encoder-decoder run goes through
:func:`.hf_seq2seq.seq2seq_export`, an xlnet run through :func:`.xlnet.xlnet_export`. See docs/interop.md."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from ..errors import SesameError
from ..models import Transformer
from ..objectives import build_objective
from ..run import RunConfig, load_tokenizer, read_config
from ..tokenizer import TextTokenizer
from ..train.checkpoint import load_weights, read_json, save_weights
from .architectures import ARCHITECTURES, EXPORTED_ACTIVATIONS, FAMILY_MODEL_TYPES, Architecture
from .hf_seq2seq import seq2seq_export
from .hf_tokenizer import export_tokenizer
from .xlnet import xlnet_export
from .mapping import (CLASSIFY_TASKS, Entry, GENERATOR_NAMES, Rows, check_new, claim_new, classifier_config,
                     dense_entries, discriminator_entries, export_tensors, identity_projection, lm_entries,
                     meta_backbone, name_plan, pair_entries)

ROUTES = {"encoder_decoder": seq2seq_export, "xlnet": xlnet_export}  # architectures with an exporter of their own
POOLER_STD = 0.02  # transformers' initializer_range
PART_HEADS = {"mlm_nsp": "next-sentence (NSP)", "mlm_sop": "sentence-order (SOP)", "span": "span-boundary (SBO)"}


def _check_exportable(model: dict, arch: Architecture, where: str) -> None:
    """Fail unless the run's backbone is exactly an ``arch`` model."""
    problems = [f"{f} is {model[f]!r}, {arch.model_type} needs {v!r}" for f, v in arch.fixed.items()
                if f != "type_vocab_size" and model[f] != v]
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
    task, options = config.finetuned.task, config.finetuned.task_options
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
    head = classifier_config(task, labels)
    return [e for module, hf in arch.classifier.items() for e in dense_entries(module, hf)], head


def _export_heads(config: RunConfig, model: dict, arch: Architecture) -> tuple[list[Entry], str, list[str]]:
    """A pretrained run's objective head in transformers: ``(entries, class, notes)`` of the
    ``*ForMaskedLM``, ``*ForPreTraining``, ``GPT2LMHeadModel`` or ``ElectraForPreTraining`` with the same
    function, or no entries and the base model (the reason in the notes) where none has it."""
    objective, head, pairs = config.pretrained.objective, arch.lm, arch.pairs
    if objective is None:
        return [], arch.base_class, []
    exact = model["activation"] == "gelu"  # sesame's ELECTRA discriminator head applies exact GELU
    other = f"the backbone's activation, {EXPORTED_ACTIVATIONS[model['activation']]} here, not exact GELU"
    why = f"{arch.model_type} has no such head in transformers"
    if objective == "electra" and arch.discriminator:
        if exact:  # the generator goes to a directory of its own (to_hf)
            return discriminator_entries(arch), "ElectraForPreTraining", []
        why = f"ElectraForPreTraining's head applies {other}"
    if head and head.objective == ("mlm" if objective in PART_HEADS or objective == "mlm" else objective):
        name = pairs.hf_class if pairs and objective == pairs.objective else head.hf_class
        if head.same_activation(model["activation"] if head.activation else "gelu", model["activation"]):
            if name != head.hf_class:
                return lm_entries(arch) + pair_entries(arch, arch.prefix + "."), name, []
            notes = [f"its {PART_HEADS[objective]} head is left behind: {name} has none"] \
                if objective in PART_HEADS else []
            return lm_entries(arch), name, notes
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
        objective = build_objective("electra", Transformer(config.model), tok,
                                    config.pretrained.objective_options)
    state = {k: v for k, v in weights.items() if k.startswith("backbone.embed.")}
    for name, tensor in weights.items():
        ours = next((o for o in GENERATOR_NAMES if name.startswith(o)), None)
        if ours:
            state[GENERATOR_NAMES[ours] + name.removeprefix(ours)] = tensor
    record = config.hf
    if record:
        record = {**record, "config": (record.get("generator") or {}).get("config", {})}
    mlm = replace(config.pretrained, objective="mlm")
    return replace(config, pretrained=mlm, model=objective.generator.config, hf=record), state


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
    model = config.model.to_dict()
    _check_exportable(model, arch, where)
    backbone = {k.removeprefix("backbone."): v for k, v in weights.items() if k.startswith("backbone.")}
    tokens = backbone["embed.tokens.weight"]
    source = record["config"] if record else {}
    vocab = source.get("vocab_size", tokens.shape[0])
    drop = all(_still_copies(t, record and record["tokenizer"], vocab, tok.backend.get_vocab())
               for t in (tokens, weights.get("bias"), weights.get("decoder")) if t is not None)  # (the MLM head's rows)
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
        extra, name, notes = (lm_entries(arch), arch.lm.hf_class, []) if generator else \
            _export_heads(config, model, arch)
        prefix = "" if name == arch.base_class else arch.prefix + "."
        if name != arch.base_class:  # the output layer: the token embeddings, or an untied masked LM's decoder
            head = {"tie_word_embeddings": "decoder" not in weights}
            if "decoder" in weights:
                extra = [*extra, Entry("decoder", (f"{arch.lm.decoder}.weight",))]
        elif arch.pooler:
            extra = dense_entries("pooler.0", arch.pooler)
            if "pooler.0.weight" not in weights:
                hidden = model["hidden"]
                weights = {**weights, "pooler.0.weight": torch.randn(hidden, hidden, generator=torch.Generator()
                                                                     .manual_seed(0)) * POOLER_STD,
                           "pooler.0.bias": torch.zeros(hidden)}
                notes.append(f"the run has no trained [CLS] pooler; {arch.base_class}'s pooler is freshly initialised "
                             f"(N(0, {POOLER_STD}), seed 0), as transformers would")
    tensors = {prefix + k: v for k, v in export_tensors(backbone, name_plan(arch, meta_backbone(model)), rows).items()}
    if arch.always_projects and model["embedding_size"] is None:
        tensors.update({prefix + k: v for k, v in identity_projection(arch, model["hidden"]).items()})
    tensors.update({e.hf[0]: (weights[e.sesame][: rows.vocab] if e.sesame in ("bias", "decoder") else weights[e.sesame])
                    .contiguous() for e in extra})
    if head.get("tie_word_embeddings") is False:  # transformers reads an untied decoder's bias under its own name
        tensors[f"{arch.lm.decoder}.bias"] = tensors[arch.lm.bias].clone()

    tokenizer_json, specials = export_tokenizer(tok, record and record["tokenizer"], drop)
    ids = Tokenizer.from_str(tokenizer_json).get_vocab()
    specials = {k: v for k, v in specials.items() if v in ids}
    hf = _hf_config(model, arch, source, rows)
    hf.update(head, architectures=[name], pad_token_id=ids.get(specials.get("pad_token")))
    hf.update({f"{r}_token_id": ids[specials[f"{r}_token"]] for r in ("bos", "eos") if f"{r}_token" in specials})

    claim_new(out)
    save_weights(out / "model.safetensors", tensors, metadata={"format": "pt"})
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
    if config.additions:
        raise SesameError(f"--to-hf {run}: its recipe inserted adapters or a scalar mix (config.json's additions), "
                          "which transformers models lack; export the run it was fine-tuned from")
    check_new(out)
    route = ROUTES.get(config.model.arch)
    if route is not None:
        return route(config, run, out)
    tok = load_tokenizer(run, "--to-hf")
    weights = load_weights(run / "model.safetensors")
    summary = _write_hf(config, weights, tok, run, out)
    if config.pretrained.objective == "electra":
        _write_hf(*_generator_run(config, weights, tok), tok, run, out / "generator", generator=True)
        summary["generator"] = str(out / "generator")
    return summary
