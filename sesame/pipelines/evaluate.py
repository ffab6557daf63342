"""Using a run: ``sesame evaluate`` and ``sesame predict``, and ``sesame.load`` in Python.

A fine-tuned run (or a transformers sequence classifier) is loaded as a :class:`Predictor`; a
pretrained run is scored by its own objective on text (loss, perplexity, bits per byte).
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..data.shards import Shards
from ..data.windows import Corpus, warn_if_few
from ..errors import SesameError
from ..interop.onnx_format import MODEL_FILE, OnnxModel, is_export, read_export, require_onnx
from ..models import position_limit
from ..metrics import language_model_report
from ..objectives import OBJECTIVES, Objective, build_objective
from ..objectives.seq2seq import require_sentinels
from ..run import RunConfig, build_backbone, describe, load_tokenizer, read_config
from ..runtime import Runtime, device_of
from ..sources import opened
from ..specs import check_length
from ..tasks import infer, make_task
from ..train.checkpoint import load_weights, read_json
from ..train.trainer import all_sum, world
from .pretrain import lm_metrics, window_length

STREAMS = 8  # rows a long text is read in side by side, with memory (Transformer-XL's evaluation batch)


class Predictor:
    """A fine-tuned run (or a transformers sequence classifier, see :func:`sesame.interop.resolve`)
    loaded for prediction and evaluation. ``options`` override the task options the run was trained
    with (other column names, say); ``runtime`` says where and how it runs (default: :class:`Runtime`'s); ``flag``
    names the model in errors. ``about`` says what the model is (:func:`sesame.run.describe`: kind, family, size,
    causal, export), as ``sesame serve``'s /info shows it."""

    def __init__(self, run: str | Path, options: dict | None = None, runtime: Runtime | None = None, *,
                 flag: str = "--model"):
        self.run = Path(run)
        self.placement = (runtime or Runtime()).place()
        with opened(run, flag, classifier=True) as (_, path):
            self.config = read_config(path, flag, ("finetuned",))
            given = {k: v for k, v in (options or {}).items() if v is not None}
            tuned = self.config.finetuned
            self.task = make_task(tuned.task, {**tuned.task_options, **given})
            self.task.check_model(self.config.model)  # what options given here ask of it (text2text's lengths)
            self.labels: list[str] = read_json(path / "labels.json") if self.task.has_labels else []
            self.tokenizer = load_tokenizer(path, flag)
            self.model = self.task.build(build_backbone(self.config), len(self.labels), self.config.pooling, 0.0)
            self.model.load_state_dict(load_weights(path / "model.safetensors"))
        self.max_length, self.causal = self.config.max_length, self.config.causal
        self.about = describe(self.config)
        self.mixture = self.config.finetuned.mixture  # a mixture's tasks read their files with options of their own
        self.placement.model(self.model).eval()
        if self.placement.compile:  # infer calls model.outputs
            self.model.outputs = self.placement.compiled(self.model.outputs, "model's outputs")

    def features(self, examples: list[dict], *, max_length: int | None = None) -> list[dict]:
        """The task's model inputs for ``examples`` (:meth:`sesame.tasks.Task.features`), cut at ``max_length``
        tokens (default: :attr:`max_length`, the model's fine-tuning ``--max-length``; a task with ``windows``
        reads longer inputs in several windows)."""
        return self.task.features(examples, self.tokenizer, max_length or self.max_length, self.labels, self.causal)

    def outputs(self, features: list[dict]) -> torch.Tensor:
        """The model's outputs for ``features`` (:func:`sesame.tasks.infer`: one row per feature, on the CPU)."""
        with self.placement.autocast():
            return infer(self.model, self.task, features, self.tokenizer.specials.pad)

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor) -> list[dict]:
        """One prediction per example from its features' ``outputs`` (:meth:`sesame.tasks.Task.predictions`)."""
        return self.task.predictions(examples, features, outputs, self.labels)

    def predict(self, inputs: Sequence[str | dict]) -> list[dict]:
        """One prediction per input: a text, or an example dict as the task reads them (``{"text": ...,
        "pair": ...}`` for pairs). Classifiers give ``{"label": ..., "probabilities": {label: p}}``."""
        examples = [self.task.example(x) if isinstance(x, str) else x for x in inputs]
        if not examples:
            return []
        features = self.features(examples)
        return self.predictions(examples, features, self.outputs(features))

    def read(self, path: str, labeled: bool = False) -> list[dict]:
        if self.mixture:  # its tasks' reading options are in config.json's mixture, not its task options
            names = ", ".join(self.mixture)
            raise SesameError(f"--model {self.run}: fine-tuned on a mixture of tasks ({names}), whose files evaluate "
                              "and predict do not read yet; its dev metrics per task are in metrics.jsonl, and predict "
                              "reads bare texts (each with its task's prefix)")
        return self.task.read(path, labeled)

    def evaluate(self, data: str) -> dict:
        """The task's full report on a labeled file."""
        examples = self.read(data, labeled=True)
        self.task.check(examples, self.labels, data)
        features = self.features(examples)
        return self.task.score(examples, features, self.outputs(features), self.labels)


class ExportedPredictor(Predictor):
    """A folder ``sesame export`` wrote, run by onnxruntime on the CPU: the same task, tokenizer and predictions
    as the run it came from (:mod:`sesame.interop.onnx_format`). ``runtime`` may only name the CPU and fp32: the
    graph runs as it was exported (fp32, or int8 weights)."""

    def __init__(self, path: str | Path, options: dict | None = None, runtime: Runtime | None = None):
        runtime = runtime or Runtime()
        for flag, value, default in (("--precision", runtime.precision, None), ("--compile", runtime.compile, False),
                                     ("--tf32", runtime.tf32, False)):
            if value != default:
                raise SesameError(f"{flag}: --model {path} is an ONNX export, which runs as it was exported; drop "
                                  f"{flag}")
        if runtime.device not in ("auto", "cpu"):
            raise SesameError(f"--device {runtime.device}: an ONNX export runs on the CPU here (onnxruntime's CPU "
                              "provider); drop --device")
        require_onnx(f"--model {path}")
        self.run = Path(path)
        self.placement = Runtime(device="cpu").place()
        self.export = read_export(path, "--model")
        given = {k: v for k, v in (options or {}).items() if v is not None}
        self.task = make_task(self.export["task"], {**self.export["sesame"]["task_options"], **given})
        self.labels = self.export["labels"]
        self.tokenizer = load_tokenizer(path, "--model")
        self.tokenizer.backend.no_padding()  # sesame pads its batches itself (the task's collate)
        self.max_length, self.causal = self.export["max_length"], self.export["sesame"]["causal"]
        self.about = {"kind": "finetuned", "family": self.export["family"],
                      "size": self.export.get("size"),  # exports written before sesame recorded it have none
                      "causal": self.causal, "export": {"format": "onnx", "quantize": self.export["quantize"]}}
        self.mixture = None  # export refuses text2text, so a mixture's run
        self.model = OnnxModel(self.run / MODEL_FILE, self.export["inputs"])


def load(run: str | Path, *, runtime: Runtime | None = None, **options) -> Predictor:
    """Load a fine-tuned run (or a transformers sequence classifier directory, or an ONNX export) for prediction:
    ``sesame.load(run).predict(["text", ...])``; keyword arguments override its task options
    (``text_column="tweet"``); ``runtime``: its device and precision (:class:`sesame.runtime.Runtime`)."""
    return (ExportedPredictor if is_export(run) else Predictor)(run, options, runtime)


def predict(model: str, texts: Sequence[str | dict]) -> list[dict]:
    return load(model).predict(texts)


def evaluate(model: str, data: Sequence[str] | str, *, text_column: str | None = None, label_column: str | None = None,
             text_field: str = "text", seq_len: int | None = None, mem_len: int | None = None,
             runtime: Runtime | None = None) -> dict:
    """Fine-tuned run: its task's metrics on a labeled file (classifiers: accuracy, macro-F1, MCC,
    per-class P/R/F1); ``text_column``/``label_column`` override the run's. Language model: loss,
    perplexity (and bits per byte for causal models) on text files, folders or a shard directory.
    ``model`` may also be a transformers directory: a sequence classifier, or a model with its pre-training
    head (``*ForMaskedLM``, ``GPT2LMHeadModel``, ...; :func:`sesame.interop.resolve`). ``runtime``: where and how
    the model runs (:class:`sesame.runtime.Runtime`). An ONNX export (``sesame export``) is evaluated as a
    fine-tuned run is. An XLNet language model reads the text left to right with memory across segments
    (:func:`_text_metrics`), keeping ``mem_len`` states of earlier segments (default: the run's; 0: none)."""
    if is_export(model):
        if mem_len is not None:
            raise SesameError(f"--mem-len {mem_len}: --model {model} is an ONNX export of a classifier, which reads no "
                              "memory of earlier segments; --mem-len is for an XLNet language model: drop it")
        if not isinstance(data, str):
            data = _one_file(data)
        return load(model, text_column=text_column, label_column=label_column, runtime=runtime).evaluate(data)
    with opened(model, "--model") as (_, run):
        config = read_config(run, "--model")
        if mem_len is not None:
            config = replace(config, model=replace(config.model, mem_len=_memory(mem_len, config, model)))
        if config.kind == "finetuned":
            if not isinstance(data, str):
                data = _one_file(data)
            return load(run, text_column=text_column, label_column=label_column, runtime=runtime).evaluate(data)
        return _language_model(run, config, model, [data] if isinstance(data, str) else list(data), text_field,
                               seq_len, runtime or Runtime())


def _one_file(data: Sequence[str]) -> str:
    if len(data) != 1:
        raise SesameError("--data: give one labeled file for a fine-tuned model")
    return data[0]


def _language_model(run: Path, config: RunConfig, model: str, paths: list[str], text_field: str,
                    seq_len: int | None, runtime: Runtime) -> dict:
    """A pretrained run's objective on text: loss, perplexity, and bits per byte and character when causal."""
    part = config.pretrained
    if part.objective is None:
        raise SesameError(f"--model {model}: converted from {config.hf['model_type']} without its pre-training "
                          "heads, so it has no language-model loss to evaluate; fine-tune it, then evaluate that")
    scorer = OBJECTIVES[part.objective].scored_by
    if scorer:
        raise SesameError(f"--model {model}: a {config.family} run of the {part.objective} objective; score it with "
                          f"`{scorer}`")
    placement = runtime.place()
    tok = load_tokenizer(run, "--model")
    obj = build_objective(part.objective, build_backbone(config), tok, part.objective_options)
    obj.load_state_dict(load_weights(run / "model.safetensors"))
    placement.model(obj).eval()
    if seq_len is None:
        seq_len = part.seq_len
    else:
        check_length("--seq-len", seq_len)
        positions = position_limit(obj.backbone.config)  # None: any length (T5's relative positions, recurrent)
        if positions is not None and seq_len > positions:
            raise SesameError(f"--seq-len {seq_len}: --model {model} has {positions} positions; use at most that")
        require_sentinels(OBJECTIVES[part.objective], seq_len, "--seq-len", part.objective_options,
                          have=len(tok.sentinels()), source=f"--model {model}'s tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Corpus.of(paths, "--data", text_field)
        shards = corpus.shards(tok, Path(tmp) / "shards", progress=False)
        length = window_length(config, seq_len)
        windows = shards.windows(length)
        if not windows:
            raise SesameError(f"--data: too little text for one window of {seq_len} tokens")
        warn_if_few(windows, length, "--data")
        with placement.autocast():
            if obj.reads_text:
                return _text_metrics(obj, shards, seq_len, length, corpus.size())
            return lm_metrics(obj, shards, windows, length, text=corpus.size())


def _memory(mem_len: int, config: RunConfig, model: str) -> int:
    """``--mem-len``, checked: a language model with Transformer-XL memory (XLNet's) and a count of states."""
    if config.kind != "pretrained" or not hasattr(config.model, "mem_len"):
        what = "a fine-tuned run" if config.kind != "pretrained" else f"a {config.model.arch} model"
        raise SesameError(f"--mem-len {mem_len}: --model {model} is {what}, which reads no memory of earlier "
                          "segments; --mem-len is for an XLNet language model: drop it")
    if mem_len < 0:
        raise SesameError(f"--mem-len {mem_len}: use 0 (no memory) or more (states of earlier segments per layer)")
    return mem_len


def _text_metrics(obj: Objective, shards: Shards, seq_len: int, length: int, size: dict | None) -> dict:
    """Loss, perplexity and bits per byte and character of ``obj`` reading the whole text (``token_losses``: left to
    right, segments of ``seq_len`` with memory): its tokens in at most :data:`STREAMS` rows of equal length, side by
    side, each at least :data:`STREAMS` windows of ``length`` tokens long where the text allows, so memory starts
    afresh only at the start of a row (the last ``rows − 1`` tokens at most are left out). Under torchrun each
    process reads its share of the rows."""
    tokens = np.concatenate([np.asarray(a, dtype=np.int64) for a in shards.arrays])
    rows = max(1, min(STREAMS, len(tokens) // (STREAMS * length)))
    width = len(tokens) // rows
    rank, processes = world()
    text = torch.from_numpy(tokens[: rows * width]).view(rows, width)[rank::processes]
    with torch.no_grad():
        losses = obj.token_losses(text.to(device_of(obj)), seq_len) if len(text) else torch.zeros(0)
    loss_sum, count = all_sum([losses.sum().item(), float(losses.numel())])
    scored = {unit: n * count / shards.n_tokens for unit, n in size.items()} if size else None
    return {**language_model_report(loss_sum, int(count), scored), "mem_len": obj.backbone.config.mem_len}
