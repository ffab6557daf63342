"""T5 and BART model directories ⇄ sesame, for ``sesame convert`` (docs/interop.md, "T5 and BART").

:func:`import_encoder_decoder` reads a transformers directory (config.json, model.safetensors or its shards, and the
tokenizer: tokenizer.json; for BART also vocab.json + merges.txt) into a :class:`Seq2SeqCheckpoint`: the
:class:`~sesame.models.encoder_decoder.EncoderDecoderConfig` fields, the model's state dict, sesame's tokenizer and
the record that gives the checkpoint back. :func:`export_encoder_decoder` writes one as a directory that
``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load. Neither reads or writes pickles. :func:`seq2seq_run` and
:func:`seq2seq_export` are the ``convert --from-hf`` / ``--to-hf`` routes: a pretrained run of the family whose row
names the ``model_type`` (:func:`.hf_import.transformers_family`: t5, t5v1_1 or bart), with that row's objective,
options and pooling, holding the model under ``backbone.``, and back.
A ``T5ForSequenceClassification``
or ``BartForSequenceClassification`` is a fine-tuned classify or regress run instead (:class:`SequenceHead`), whose
head reads the decoder's state at the last end token (``pooling`` last), and such a run exports to one.

The tokenizers go through :mod:`.hf_tokenizer`: T5's tokenizer.json (Unigram, ``</s>`` appended to each text, the
``<extra_id_N>`` sentinels as added tokens) keeps its ids; it has no cls or mask token, so sesame's ``<s>`` and
``<mask>`` take the first two of the rows T5's vocabulary is padded with (32,100 tokens, 32,128 rows), left as they
are, and are removed again on export. BART's byte-level BPE is RoBERTa's and has all five of sesame's roles.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from ..errors import SesameError
from ..families import FAMILIES, Family, run_family
from ..models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from ..run import PretrainedPart, RunConfig, load_tokenizer, write_config
from ..rundir import new_run
from ..tasks import make_task
from ..tokenizer import TextTokenizer
from ..train.checkpoint import load_weights, read_json, save_weights, write_json
from .architectures import ARCHITECTURES
from .encoder_decoder import (TYPES, check_style, classifier_weights, export_weights, hf_config, import_weights,
                              leading_rows, model_config, split_classifier, stores_own_head)
from .hf_tokenizer import export_tokenizer, import_tokenizer
from .mapping import (CLASSIFY_TASKS, check_new, checkpoint_config, claim_new, classifier_config, classifier_labels,
                      classifier_max_length, classifier_task, is_sequence_classifier, read_weights)

EVAL_SEQ_LEN = 128  # a converted language model's evaluation window: sesame pretrain's default --seq-len
ROLE_NAMES = {"pad": "pad token", "cls": "bos token", "sep": "eos token"}
LABEL_KEYS = ("id2label", "label2id", "num_labels", "problem_type")  # a classifier's, in config.json
# model_type → (how vocabulary files build its tokenizer, the tokenizer class's special tokens)
TOKENIZERS = {"t5": ("json", {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"}),
              "bart": ("roberta", ARCHITECTURES["roberta"].special_tokens)}


@dataclass
class SequenceHead:
    """A sequence classifier's head and task: ``task`` classify or regress, its ``labels`` (none for regress), the
    tokens an input may have (``max_length``: tokenizer_config.json's ``model_max_length``), and ``weights``, sesame's
    ``pooler.0`` and ``head`` tensors (:class:`~sesame.tasks.classify.EncoderDecoderSequenceModel`)."""

    task: str
    labels: list[str]
    max_length: int
    weights: dict[str, torch.Tensor]


@dataclass
class Seq2SeqCheckpoint:
    """A T5 or BART model as sesame holds it: ``model`` the EncoderDecoderConfig fields, ``weights`` its state
    dict, ``tokenizer``; ``hf`` the record export gives it back with (model type, source directory and config.json,
    what the tokenizer import changed, BART's unread position rows); ``head`` a sequence classifier's."""

    model_type: str
    model: dict
    weights: dict[str, torch.Tensor]
    tokenizer: TextTokenizer
    hf: dict
    head: SequenceHead | None = None


def _meta_model(model: dict) -> EncoderDecoder:
    """The model ``model`` describes, without memory: for names and shapes only."""
    with torch.device("meta"):
        return EncoderDecoder(EncoderDecoderConfig(**model))


def import_encoder_decoder(src: str | Path, flag: str = "--from-hf", *, hf: dict | None = None) -> Seq2SeqCheckpoint:
    """The T5 or BART model directory ``src`` (a ``*ForConditionalGeneration``, or its base model) as sesame's
    encoder-decoder, ``hf`` its config.json where the caller read it already; anything sesame would not compute
    exactly is refused with one line naming it."""
    src = Path(src)
    config_path = src / "config.json"
    hf = checkpoint_config(src, flag) if hf is None else hf
    model_type = hf.get("model_type") if isinstance(hf, dict) else None
    if model_type not in TYPES:
        raise SesameError(f"{config_path}: model_type {model_type!r} is not an encoder-decoder sesame converts "
                          f"({', '.join(TYPES)})")
    model = model_config(hf, model_type, str(config_path))
    builder, defaults = TOKENIZERS[model_type]
    tok, record, appended = import_tokenizer(src, builder=builder, defaults=defaults, model_vocab=model["vocab_size"])
    given = {**TYPES[model_type].defaults, **{k: v for k, v in hf.items() if v is not None}}
    roles = {"pad_token_id": "pad", **TYPES[model_type].tokens}
    wrong = [f"{key} {given[key]!r} is not the tokenizer's {ROLE_NAMES[role]} ({getattr(tok.specials, role)})"
             for key, role in roles.items() if given[key] != getattr(tok.specials, role)]
    if appended:
        wrong.append(f"the tokenizer lacks sesame's {', '.join(record['aliases'])} and vocab_size "
                     f"{model['vocab_size']} leaves no unused rows for them")
    elif tok.vocab_size > model["vocab_size"]:
        wrong.append(f"vocab_size {model['vocab_size']} is fewer than the tokenizer's {tok.vocab_size} tokens")
    if wrong:
        raise SesameError(f"{config_path}: " + "; ".join(wrong) + "; config.json and the tokenizer must agree")
    weights, path = read_weights(src, flag, pickles=False)
    head = None
    if is_sequence_classifier(hf):
        task, why_not = classifier_task(hf)
        if task is None:
            raise SesameError(f"{config_path}: {why_not}")
        weights, head_weights = split_classifier(model_type, weights, str(path))
        head = SequenceHead(task, classifier_labels(hf, str(config_path)) if task == "classify" else [],
                            classifier_max_length(src, model), head_weights)
    prefix = TYPES[model_type].prefix
    if prefix and not any(n.startswith(prefix) for n in weights):  # a base model (BartModel): no task prefix
        weights = {prefix + n: t for n, t in weights.items()}
    if stores_own_head(model_type, weights):  # T5 v1.1 saved by transformers 5, whose config.json says tied
        model["tied"] = False
    try:
        state = import_weights(model_type, weights, _meta_model(model))
    except SesameError as err:
        raise SesameError(f"{path}: {err}") from None
    origin = {"model_type": model_type, "source": str(src.resolve()), "config": hf, "tokenizer": record,
              "leading_rows": leading_rows(model_type, weights)}
    return Seq2SeqCheckpoint(model_type, model, state, tok, origin, head)


def export_encoder_decoder(checkpoint: Seq2SeqCheckpoint, out: str | Path) -> dict:
    """Write ``checkpoint`` as the new transformers model directory ``out``: config.json, model.safetensors,
    tokenizer.json and tokenizer_config.json (``PreTrainedTokenizerFast``). Returns a summary."""
    out, c = Path(out), checkpoint
    check_new(out)
    tensors = export_weights(c.model_type, c.weights, _meta_model(c.model), c.hf.get("leading_rows"))
    config = hf_config(c.model, c.model_type, source=c.hf.get("config", {}), tokens=asdict(c.tokenizer.specials))
    max_length = c.model["max_positions"]
    if c.head is not None:
        tensors = classifier_weights(c.model_type, tensors, c.head.weights)
        config = {k: v for k, v in config.items() if k not in LABEL_KEYS}
        config.update(classifier_config(c.head.task, c.head.labels), architectures=[TYPES[c.model_type].classifier])
        max_length = c.head.max_length
    tokenizer_json, specials = export_tokenizer(c.tokenizer, c.hf.get("tokenizer"), drop_aliases=True)
    ids = Tokenizer.from_str(tokenizer_json).get_vocab()
    specials = {k: v for k, v in specials.items() if v in ids}
    claim_new(out)
    save_weights(out / "model.safetensors", tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer.json").write_text(tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": max_length,
        "model_input_names": ["input_ids", "attention_mask"]}, indent=2) + "\n")
    return {"model_type": c.model_type, "architecture": config["architectures"][0], "vocab_size": config["vocab_size"],
            "notes": []}


def seq2seq_task(hf: dict) -> tuple[str | None, str]:
    """The task a T5 or BART config.json makes a checkpoint (:func:`~.mapping.classifier_task` for a sequence
    classifier), else ``(None, the reason)``."""
    if not is_sequence_classifier(hf):
        return None, f"a {hf.get('model_type')} encoder-decoder, without a sequence-classification head"
    return classifier_task(hf)


def seq2seq_run(src: Path, out: Path, *, family: Family, hf: dict) -> dict:
    """``convert --from-hf`` of a T5 or BART directory: a pretrained run of its ``family`` (the row
    :func:`.hf_import.transformers_family` resolved), with the row's objective (span corruption, denoising), its
    options and pooling, so the run evaluates, continues
    pre-training and fine-tunes as one sesame made; its weights are the model's under ``backbone.``. A sequence
    classifier's is a fine-tuned run of its task, with its head (:func:`_classifier_run`). ``hf``: its config.json."""
    c = import_encoder_decoder(src, hf=hf)
    pretrained = PretrainedPart(objective=family.objective, objective_options=dict(family.objective_options),
                                seq_len=min(EVAL_SEQ_LEN, c.model["max_positions"]))  # what `sesame evaluate` reads
    config = RunConfig(kind="pretrained", family=family.name, model=EncoderDecoderConfig(**c.model), hf=c.hf,
                       pooling=family.pooling, pretrained=pretrained)
    head = c.head.weights if c.head else {}
    if c.head:
        config = _classifier_run(config, c.head)
    with new_run(out, config.kind, resume=False) as run:
        c.tokenizer.save(run / "tokenizer.json")
        save_weights(run / "model.safetensors", {**{"backbone." + k: v for k, v in c.weights.items()}, **head})
        if c.head and c.head.labels:
            write_json(run / "labels.json", c.head.labels)
        write_config(run, config)
    added = c.hf["tokenizer"]["spare"]
    return {"model_type": c.model_type, "family": config.family, "kind": config.kind, "task": config.finetuned.task,
            "objective": config.pretrained.objective, "labels": c.head.labels if c.head else [],
            "layers": c.model["layers"], "hidden": c.model["hidden"],
            "vocab_size": c.model["vocab_size"], "pooler": False, "dropped_heads": [],
            "renamed_tokens": c.hf["tokenizer"]["renamed"], "appended_tokens": added,
            "notes": [f"sesame's {' and '.join(added)} read unused rows of the vocabulary"] if added else []}


def _classifier_run(config: RunConfig, head: SequenceHead) -> RunConfig:
    """The fine-tuned run a sequence classifier's pretrained ``config`` and ``head`` make: its task, with BART's
    head on the decoder's last end token (``pooling`` last)."""
    job = make_task(head.task)
    return replace(config, kind="finetuned", pooling="last", max_length=head.max_length,
                   finetuned=replace(config.finetuned, task=head.task, task_options=job.options(), select=job.select),
                   pretrained=replace(config.pretrained, objective=None, objective_options={}, seq_len=None))


def _sequence_head(config: RunConfig, run: Path, weights: dict[str, torch.Tensor], where: str) -> SequenceHead:
    """A fine-tuned classify, pair or regress run's head as ``*ForSequenceClassification`` holds it (``pooling``
    last, one order of a pair), its tensors taken out of ``weights``."""
    options = config.finetuned.task_options or {}
    if config.pooling != "last" or options.get("symmetric"):
        pooled = f"pooling {config.pooling!r}" + (" of both orders of a pair" if options.get("symmetric") else "")
        raise SesameError(f"{where}: {pooled}; transformers' classifier reads the decoder's state at the last end "
                          "token of one sequence (pooling last)")
    head = {k: weights.pop(k) for k in [k for k in weights if not k.startswith("backbone.")]}
    task = config.finetuned.task
    labels = read_json(run / "labels.json") if task != "regress" else []
    return SequenceHead("regress" if task == "regress" else "classify", labels, config.max_length, head)


def seq2seq_export(config: RunConfig, run: Path, out: Path) -> dict:
    """``convert --to-hf`` of an encoder-decoder run: its model as ``T5ForConditionalGeneration`` or
    ``BartForConditionalGeneration`` (the imported checkpoint's type, else its family's); a fine-tuned classify,
    pair or regress run as ``T5ForSequenceClassification`` or ``BartForSequenceClassification``."""
    where = f"--to-hf {run}"
    model_type = config.hf["model_type"] if config.hf else run_family(config, where).hf_model_type
    if model_type not in TYPES:
        exportable = [f.name for f in FAMILIES.values() if f.hf_model_type in TYPES]
        raise SesameError(f"{where}: family {config.family!r} has no transformers encoder-decoder here; exportable: "
                          f"{', '.join(exportable)}")
    weights = load_weights(run / "model.safetensors")
    tuned = config.kind == "finetuned" and config.finetuned.task in CLASSIFY_TASKS
    head = _sequence_head(config, run, weights, where) if tuned else None
    others = sorted(k for k in weights if not k.startswith("backbone."))
    if others:
        raise SesameError(f"{where}: weights outside the encoder-decoder ({', '.join(others[:3])}, ...), which "
                          f"{TYPES[model_type].base_class} cannot hold")
    model = config.model.to_dict()
    try:
        check_style(model, model_type)
    except SesameError as err:
        raise SesameError(f"{where}: {err}") from None
    state = {k.removeprefix("backbone."): v for k, v in weights.items()}
    return export_encoder_decoder(Seq2SeqCheckpoint(model_type, model, state, load_tokenizer(run, "--to-hf"),
                                                    config.hf or {}, head), out)
