"""transformers' XLNet (``XLNetLMHeadModel``, ``XLNetForSequenceClassification``, or the bare ``XLNetModel``) ⇄
sesame's xlnet runs (:class:`~sesame.models.xlnet.XLNet`), for ``sesame convert`` (docs/interop.md, "XLNet").

* tensors: the table of :mod:`sesame.models.xlnet`'s docstring (:func:`_table`). transformers keeps each projection of
  relative attention as one (hidden, heads, head size) tensor that einsum reads: q, k, v and r multiply the input's
  hidden dimension (sesame's Linear weight, transposed and reshaped), o produces the output's (sesame's weight
  reshaped); ``mask_emb`` is (1, 1, hidden);
* heads: ``XLNetLMHeadModel``'s ``lm_loss``, an output layer tied to the word embedding, plus a bias: the ``plm``
  objective's ``bias`` (a stored copy of the tied weight must equal the embedding); ``XLNetForSequenceClassification``'s
  sequence summary (the last token, a dense layer, tanh) and ``logits_proj``: a fine-tuned classify, pair or regress
  run's ``pooler.0`` and ``head`` (:class:`~sesame.tasks.classify.XLNetSequenceModel`);
* configuration: config.json keys ⇄ :class:`~sesame.models.xlnet.XLNetConfig` fields (:data:`KEYS`); what sesame does
  not compute (:data:`REQUIRED`) is refused with one line naming the key. ``mem_len`` null (transformers then keeps
  every earlier state) imports as sesame's default, which ``sesame evaluate --mem-len`` overrides;
* tokenizer: tokenizer.json through :mod:`.hf_tokenizer`; XLNet's ``<cls>`` and ``<sep>`` are sesame's cls and sep
  roles, swapping names with its ``<s>`` and ``</s>``, and come back on export. The export's tokenizer pads on the
  left, as ``XLNetTokenizer`` does, so the summary's last position is ``<cls>``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import SesameError
from ..families import Family
from ..models.xlnet import XLNet, XLNetConfig
from ..run import FinetunedPart, PretrainedPart, RunConfig, load_tokenizer, write_config
from ..rundir import new_run
from ..tasks import make_task
from ..train.checkpoint import load_weights, read_json, save_weights, write_json
from .encoder_decoder import ACTIVATIONS
from .architectures import EXPORTED_ACTIVATIONS
from .hf_seq2seq import EVAL_SEQ_LEN
from .hf_tokenizer import export_tokenizer, import_tokenizer
from .mapping import (CLASSIFY_TASKS, check_tensors, claim_new, classifier_config, classifier_labels,
                      classifier_max_length, classifier_task, is_sequence_classifier, read_weights)

MODEL_TYPE = "xlnet"
PREFIX = "transformer."  # XLNetPreTrainedModel's base_model_prefix

# XLNetConfig field → config.json key
KEYS = {"vocab_size": "vocab_size", "hidden": "d_model", "layers": "n_layer", "heads": "n_head",
        "intermediate": "d_inner", "dropout": "dropout", "layer_norm_eps": "layer_norm_eps",
        "activation": "ff_activation", "mem_len": "mem_len", "clamp_len": "clamp_len"}
DEFAULTS = {"vocab_size": 32000, "d_model": 1024, "n_layer": 24, "n_head": 16, "d_inner": 4096, "dropout": 0.1,
            "layer_norm_eps": 1e-12, "ff_activation": "gelu", "mem_len": 512, "attn_type": "bi", "bi_data": False,
            "clamp_len": -1, "same_length": False, "summary_type": "last", "summary_use_proj": True,
            "summary_activation": "tanh"}  # transformers' XLNetConfig's, for keys a config.json leaves out
REQUIRED = {"attn_type": ("bi", "XLNet's two-way attention; 'uni' is Transformer-XL's one-way"),
            "bi_data": (False, "transformers then reads the second half of every batch right to left, when "
                               "fine-tuning too; sesame's is the plm objective's bi_data"),
            "same_length": (False, "every query sees all of the memory")}
SUMMARY = {"summary_type": ("last", "the classifier reads the final <cls>"),
           "summary_use_proj": (True, "a dense layer before the classifier"),
           "summary_activation": ("tanh", "tanh after it")}  # XLNetForSequenceClassification's head, sesame's
CLASSIFIER = {"pooler.0": "sequence_summary.summary", "head": "logits_proj"}  # sesame module → transformers'
LM_BIAS, LM_WEIGHT = "lm_loss.bias", "lm_loss.weight"
# XLNetTokenizer's special tokens (its <s> and </s> are bos and eos; <cls> and <sep> the roles sesame uses)
SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "sep_token": "<sep>",
                  "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>"}
INPUTS = ["input_ids", "token_type_ids", "attention_mask"]


def model_config(hf: dict, where: str) -> dict:
    """The :class:`XLNetConfig` fields (``to_dict()``'s) of an XLNet config.json ``hf``; ``where`` names it in the one
    line that lists each key sesame does not compute."""
    given = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None and k != "mem_len"}}
    wrong = [f"{k} {given[k]!r} (sesame supports {v!r}: {why})" for k, (v, why) in REQUIRED.items() if given[k] != v]
    heads = given["n_head"]
    if given.get("d_head", given["d_model"] // heads) * heads != given["d_model"]:
        wrong.append(f"d_head {given['d_head']!r} (sesame supports d_model / n_head, {given['d_model'] // heads})")
    if given["ff_activation"] not in ACTIVATIONS:
        wrong.append(f"ff_activation {given['ff_activation']!r} (sesame supports {', '.join(ACTIVATIONS)})")
    if wrong:
        raise SesameError(f"{where}: " + "; ".join(wrong))
    model = {field: given[key] for field, key in KEYS.items() if key != "mem_len"}
    model["activation"] = ACTIVATIONS[model["activation"]]
    if _bounded(hf):
        model["mem_len"] = hf.get("mem_len", DEFAULTS["mem_len"])
    try:
        return XLNetConfig(**model).to_dict()
    except ValueError as err:
        raise SesameError(f"{where}: {err}") from None


def _bounded(hf: dict) -> bool:
    """Whether the config.json ``hf`` bounds the memory: ``mem_len`` null or 0 keeps every earlier state in
    transformers, which sesame does not (its run keeps its default)."""
    mem_len = hf.get("mem_len", DEFAULTS["mem_len"])
    return isinstance(mem_len, int) and mem_len > 0


def hf_config(model: dict, *, source: dict, tokens: dict[str, int]) -> dict:
    """An XLNet config.json for the :class:`XLNetConfig` fields ``model`` over ``source`` (the config.json it was
    imported from, else ``{}``) and the tokenizer's role ids ``tokens`` (bos and eos: cls and sep, unless the source
    names its own)."""
    hf = {k: v for k, v in source.items() if k not in ("architectures", "transformers_version", "_name_or_path",
                                                        "id2label", "label2id", "num_labels", "problem_type")}
    hf.update({key: model[field] for field, key in KEYS.items()})
    hf.update({k: v for k, (v, _) in REQUIRED.items()}, model_type=MODEL_TYPE,
              d_head=model["hidden"] // model["heads"],
              ff_activation=EXPORTED_ACTIVATIONS.get(model["activation"], model["activation"]),
              pad_token_id=tokens["pad"])
    for key, role in (("bos_token_id", "cls"), ("eos_token_id", "sep")):  # an imported XLNet's own <s> and </s>
        hf.setdefault(key, tokens[role])
    return hf


def _table(layers: int) -> list[tuple[str, str, str]]:
    """(sesame tensor, transformers tensor under the base model, how it is stored): ``same``; ``in``: a (hidden,
    heads, head size) projection of the input, sesame's weight transposed; ``out``: o, sesame's weight as it is;
    ``mask``: (1, 1, hidden)."""
    rows = [("embed.tokens.weight", "word_embedding.weight", "same"), ("embed.mask", "mask_emb", "mask")]
    for i in range(layers):
        a, layer = f"attention.{i}.", f"layer.{i}."
        rows += [(f"{a}{x}.weight", f"{layer}rel_attn.{x}", "in") for x in "qkvr"]
        rows += [(f"{a}o.weight", f"{layer}rel_attn.o", "out")]
        rows += [(a + x, f"{layer}rel_attn.{x}", "same") for x in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")]
        for ours, theirs in (("attention.{}.norm", "rel_attn.layer_norm"), ("feed_forward.{}.inp", "ff.layer_1"),
                             ("feed_forward.{}.out", "ff.layer_2"), ("feed_forward.{}.norm", "ff.layer_norm")):
            rows += [(f"{ours.format(i)}.{p}", f"{layer}{theirs}.{p}", "same") for p in ("weight", "bias")]
    return rows


def export_weights(state: dict[str, torch.Tensor], model: dict) -> dict[str, torch.Tensor]:
    """The base model's tensors, named as in ``XLNetModel``, of sesame's backbone state dict ``state``."""
    h, heads = model["hidden"], model["heads"]
    shaped = {"same": lambda t: t, "in": lambda t: t.t().reshape(h, heads, -1),
              "out": lambda t: t.reshape(h, heads, -1), "mask": lambda t: t.reshape(1, 1, h)}
    return {theirs: shaped[how](state[ours]).contiguous() for ours, theirs, how in _table(model["layers"])}


def import_weights(weights: dict[str, torch.Tensor], model: dict, where: str) -> dict[str, torch.Tensor]:
    """sesame's backbone state dict from the base model's tensors ``weights`` (names as in ``XLNetModel``), which must
    be exactly the configuration's, each in its shape (``where`` names the file in the error)."""
    h = model["hidden"]
    with torch.device("meta"):
        expected = export_weights(XLNet(XLNetConfig(**model)).state_dict(), model)
    check_tensors(weights, expected, where=f"{where} (xlnet)")
    shaped = {"same": lambda t: t, "in": lambda t: t.reshape(h, h).t(), "out": lambda t: t.reshape(h, h),
              "mask": lambda t: t.reshape(h)}
    return {ours: shaped[how](weights[theirs]).contiguous() for ours, theirs, how in _table(model["layers"])}


def _heads(weights: dict[str, torch.Tensor], hf: dict, where: str) -> tuple[str | None, dict[str, torch.Tensor]]:
    """What the checkpoint's head becomes: ``("plm", {"bias": ...})`` for ``XLNetLMHeadModel``'s tied ``lm_loss``,
    ``("classifier", {pooler.0..., head...})`` for a sequence classifier's, ``(None, {})`` for none."""
    if is_sequence_classifier(hf):
        given = {**DEFAULTS, **hf}
        wrong = [f"{k} {given.get(k)!r} (sesame supports {v!r}: {why})" for k, (v, why) in SUMMARY.items()
                 if given.get(k) != v]
        wrong += ["summary_proj_to_labels true (sesame's dense layer keeps the width)"] if given.get(
            "summary_proj_to_labels") else []
        if wrong:
            raise SesameError(f"{where}: XLNetForSequenceClassification's head " + "; ".join(wrong))
        names = {f"{ours}.{p}": f"{theirs}.{p}" for ours, theirs in CLASSIFIER.items() for p in ("weight", "bias")}
        missing = [n for n in names.values() if n not in weights]
        if missing:
            raise SesameError(f"{where}: config.json names a sequence classifier, but {', '.join(missing)} are missing")
        return "classifier", {ours: weights[theirs] for ours, theirs in names.items()}
    if LM_BIAS not in weights:
        return None, {}
    tied = weights.get(LM_WEIGHT)
    if tied is not None and not torch.equal(tied, weights[PREFIX + "word_embedding.weight"]):
        raise SesameError(f"{where}: {LM_WEIGHT} differs from the word embedding, and the plm objective's output "
                          "layer is the word embedding; only tied checkpoints convert")
    return "plm", {"bias": weights[LM_BIAS]}


def xlnet_task(hf: dict) -> tuple[str | None, str]:
    """The task an XLNet config.json makes a checkpoint (a sequence classifier's), else ``(None, the reason)``."""
    if not is_sequence_classifier(hf):
        return None, "an XLNet model without a sequence-classification head"
    return classifier_task(hf)


def xlnet_run(src: Path, out: Path, *, family: Family, hf: dict) -> dict:
    """``convert --from-hf`` of an XLNet directory: a pretrained run of ``family`` (the row that names ``xlnet``,
    :func:`.hf_import.transformers_family`; objective ``plm`` with an ``lm_loss`` head, else none), or a fine-tuned
    classify or regress run for a sequence classifier (pooling ``last``); ``hf``: its config.json. Returns the
    summary."""
    config_path = src / "config.json"
    model = model_config(hf, str(config_path))
    tok, record, appended = import_tokenizer(src, builder="json", defaults=SPECIAL_TOKENS,
                                             model_vocab=model["vocab_size"])
    if appended or tok.vocab_size > model["vocab_size"]:
        raise SesameError(f"{config_path}: vocab_size {model['vocab_size']} does not hold the tokenizer's "
                          f"{tok.vocab_size} tokens and sesame's roles; config.json and the tokenizer must agree")
    model["pad_id"] = tok.specials.pad
    weights, path = read_weights(src)
    if not any(n.startswith(PREFIX) for n in weights):  # a bare XLNetModel
        weights = {PREFIX + n: t for n, t in weights.items()}
    head, head_state = _heads(weights, hf, str(path))
    taken = {LM_WEIGHT, LM_BIAS} | {f"{m}.{p}" for m in CLASSIFIER.values() for p in ("weight", "bias")}
    dropped = sorted({n.split(".")[0] for n in weights if not n.startswith(PREFIX) and n not in taken})
    base = {n.removeprefix(PREFIX): t for n, t in weights.items() if n.startswith(PREFIX)}
    state = {"backbone." + k: v for k, v in import_weights(base, model, str(path)).items()} | head_state
    origin = {"model_type": MODEL_TYPE, "source": str(src.resolve()), "config": hf, "tokenizer": record}
    labels, task, fields = [], None, {}
    if head == "classifier":
        task, why = xlnet_task(hf)
        if task is None:
            raise SesameError(f"{config_path}: {why}")
        labels = classifier_labels(hf, str(config_path)) if task == "classify" else []
        job = make_task(task)
        fields = {"kind": "finetuned", "max_length": classifier_max_length(src, model),
                  "finetuned": FinetunedPart(task=task, task_options=job.options(), select=job.select)}
    elif head == "plm":  # the segment `sesame evaluate` reads by default (--seq-len overrides it)
        fields = {"pretrained": PretrainedPart(objective=family.objective,
                                               objective_options=dict(family.objective_options), seq_len=EVAL_SEQ_LEN)}
    config = RunConfig(**{"kind": "pretrained", "family": family.name, "model": XLNetConfig(**model), "hf": origin,
                          "pooling": family.pooling, **fields})
    with new_run(out, config.kind, resume=False) as run:
        tok.save(run / "tokenizer.json")
        save_weights(run / "model.safetensors", state)
        if labels:
            write_json(run / "labels.json", labels)
        write_config(run, config)
    notes = [] if _bounded(hf) else [
        f"mem_len {hf.get('mem_len')!r} keeps every earlier state in transformers; the run keeps "
        f"{model['mem_len']} (sesame evaluate --mem-len changes it)"]
    return {"model_type": MODEL_TYPE, "family": family.name, "kind": config.kind, "task": task,
            "objective": config.pretrained.objective, "labels": labels, "layers": model["layers"],
            "hidden": model["hidden"], "vocab_size": model["vocab_size"], "pooler": head == "classifier",
            "dropped_heads": dropped, "renamed_tokens": record["renamed"], "appended_tokens": record["spare"],
            "notes": notes}


def xlnet_export(config: RunConfig, run: Path, out: Path) -> dict:
    """``convert --to-hf`` of an xlnet run: ``XLNetLMHeadModel`` (objective plm), ``XLNetModel`` (none), or a
    fine-tuned classify, pair or regress run's ``XLNetForSequenceClassification``. Returns the summary."""
    where = f"--to-hf {run}"
    model = config.model.to_dict()
    if not model["mem_len"]:
        raise SesameError(f"{where}: mem_len 0, which transformers reads as keeping every state; set the run's "
                          "mem_len to the memory it should keep")
    weights = load_weights(run / "model.safetensors")
    tensors = export_weights({k.removeprefix("backbone."): v for k, v in weights.items() if k.startswith("backbone.")},
                             model)
    extra, name = {}, "XLNetModel"
    if config.kind == "finetuned":
        task, options = config.finetuned.task, config.finetuned.task_options or {}
        if task not in CLASSIFY_TASKS or config.pooling != "last" or options.get("symmetric"):
            raise SesameError(f"{where}: a {task} run with pooling {config.pooling!r}"
                              f"{' of both orders of a pair' if options.get('symmetric') else ''}; transformers' "
                              "XLNetForSequenceClassification reads the last token of one sequence (classify, pair "
                              "or regress, pooling last)")
        labels = read_json(run / "labels.json") if task != "regress" else []
        extra = {**classifier_config(task, labels), **{k: v for k, (v, _) in SUMMARY.items()}}
        tensors = {PREFIX + n: t for n, t in tensors.items()} | {
            f"{theirs}.{p}": weights[f"{ours}.{p}"] for ours, theirs in CLASSIFIER.items() for p in ("weight", "bias")}
        name = "XLNetForSequenceClassification"
    elif config.pretrained.objective:
        tensors = {PREFIX + n: t for n, t in tensors.items()} | {LM_BIAS: weights["bias"]}
        extra, name = {"tie_word_embeddings": True}, "XLNetLMHeadModel"
    tok = load_tokenizer(run, "--to-hf")
    record = config.hf.get("tokenizer") if config.hf else None
    tokenizer_json, specials = export_tokenizer(tok, record, drop_aliases=True)
    roles = {"pad": tok.specials.pad, "cls": tok.specials.cls, "sep": tok.specials.sep}
    source = (config.hf or {}).get("config", {})
    hf = {**hf_config(model, source=source, tokens=roles), **extra, "architectures": [name]}
    claim_new(out)
    save_weights(out / "model.safetensors", tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    (out / "tokenizer.json").write_text(tokenizer_json)
    lengths = {"model_max_length": config.max_length} if config.kind == "finetuned" else {}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **specials, **lengths, "padding_side": "left",
        "model_input_names": INPUTS}, indent=2) + "\n")
    return {"model_type": MODEL_TYPE, "architecture": name, "vocab_size": model["vocab_size"], "notes": []}
