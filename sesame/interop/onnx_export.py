"""``sesame export``: a fine-tuned run → a folder an ONNX runtime serves without sesame (docs/export.md).

The folder holds
* ``model.onnx``: the task model's ``outputs`` (ONNX, opset :data:`OPSET`) with dynamic batch and length axes,
  inputs named as transformers names them (``input_ids``, ``attention_mask``, ``token_type_ids`` where the model
  reads segments: an encoder's pairs, and every input of XLNet, whose ``<cls>`` is segment 2; a symmetric pair's
  other order as ``swapped_*``), its output the task's
  (:attr:`sesame.tasks.Task.exported_output`: ``logits`` or ``score``);
* ``tokenizer.json``: the run's tokenizer with its post-processor (special tokens, GPT's input tokens, ULMFiT's
  document start) and the run's truncation (``max_length``, longest side of a pair first) and right padding
  with the pad token, so ``tokenizers`` alone gives the model's inputs;
* ``export.json`` (:data:`EXPORT_FILE`): the task, labels, input and output names, max length, the run's family
  and size, and what ``sesame predict`` and ``sesame serve`` need to read it back (``sesame``: the task options,
  whether the model is causal).

``--quantize int8`` is onnxruntime's post-training dynamic quantisation (``quantize_dynamic``): the weights of the
matrix products (and embedding tables) stored as int8 with a scale per tensor, the activations quantised to 8 bits
per tensor at run time from their range (``DynamicQuantizeLinear``): the "dynamic quantization" (DQ) that Zafrir
et al. 2019 (Q8BERT, §4, Table 1) compare with their quantisation-aware training, which loses less accuracy on some
GLUE tasks; sesame has no quantisation-aware training. ONNX Runtime's quantiser was chosen over PyTorch's
``quantize_dynamic`` because its result is the exported file itself, run by the runtime a client uses.

The graph is traced by PyTorch's TorchScript-based exporter (``dynamo=False``) on a batch that holds padding,
so the padding mask is in the graph (:func:`sesame.models.padding.exporting`). Deviation from PyTorch's
default (the ``torch.export``-based exporter): that one spent minutes per tiny model here, against seconds.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from ..errors import SesameError
from ..models import ModelConfig
from ..outputs import check_dir, claim_dir
from ..pipelines.evaluate import Predictor
from ..sources import opened
from ..tasks import Task, TaskModel
from ..tokenizer import TextTokenizer
from ..version import __version__
from .onnx_format import EXPORT_FILE, INPUT_NAMES, MODEL_FILE, require_onnx, run_session, session

FORMATS = ("onnx",)
QUANTIZATIONS = ("int8",)
OPSET = 17
PARITY = 1e-4  # the largest difference from the eager model on the example batch that export accepts (fp32)


def refusal(model: ModelConfig) -> str | None:
    """Why a backbone of the run's model config ``model`` cannot be exported (None: it can)."""
    arch = model.arch
    if arch == "recurrent" and model.features:
        return "its task model reads a frozen feature extractor (ELMo, CoVe), which is not exported"
    if arch == "recurrent" and not model.causal:
        return ("a bidirectional recurrent model packs its padded rows (pack_padded_sequence), which an ONNX graph "
                "does not express")
    if arch not in ("transformer", "xlnet", "recurrent"):
        return f"its {arch} backbone is not exported (transformer, xlnet and forward recurrent backbones are)"
    return None


class Exported(nn.Module):
    """The task model's ``outputs`` over positional tensors named by ``keys`` (sesame's batch keys), as the ONNX
    graph takes them: attention masks as integers (1 at real tokens), as ``tokenizers`` gives them."""

    def __init__(self, model: TaskModel, keys: list[str]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        batch = {k: t.bool() if k.endswith("padding") else t for k, t in zip(self.keys, tensors)}
        return self.model.outputs(batch)


def example_batch(task: Task, tok: TextTokenizer, max_length: int, causal: bool) -> dict[str, torch.Tensor]:
    """A batch of two inputs of different lengths (so it holds padding), without targets."""
    texts = ["the quick brown fox jumps over the lazy dog near the river bank", "a dog"]
    examples = [{"text": t, **({"pair": t[::-1]} if getattr(task, "pair_column", None) else {})} for t in texts]
    features = task.features(examples, tok, max_length, [], causal)
    return task.collate(features, tok.specials.pad)


def export_tokenizer(tok: TextTokenizer, max_length: int | None) -> str:
    """The tokenizer as a client needs it: the run's post-processor, truncated to ``max_length`` as sesame
    truncates (longest side of a pair first), padded on the right with the pad token in a batch."""
    backend = Tokenizer.from_str(tok.backend.to_str())
    if max_length:
        backend.enable_truncation(max_length)
    else:
        backend.no_truncation()
    backend.enable_padding(pad_id=tok.specials.pad, pad_token=backend.id_to_token(tok.specials.pad))
    return backend.to_str(pretty=True)


def to_onnx(model: str | Path, out: str | Path, *, quantize: str | None = None) -> dict:
    """Export the fine-tuned run (or transformers sequence classifier) ``model`` to the folder ``out``
    (module docstring); ``quantize``: None (fp32) or ``"int8"``. Returns a summary: the files, the inputs and
    the largest difference between the exported and the eager model's outputs on an example batch."""
    if quantize not in (None, *QUANTIZATIONS):
        raise SesameError(f"--quantize {quantize}: choose one of {', '.join(QUANTIZATIONS)}")
    out = Path(out)
    check_dir(out, "--out", fix="choose a new or empty folder")
    with opened(model, "--model", classifier=True) as (_, run):
        predictor = Predictor(run)
    config, task = predictor.config, predictor.task
    if task.exported_output is None:
        raise SesameError(f"--model {model}: a {task.name} run; `sesame export` writes classify, pair and regress "
                          "runs (one output row per input)")
    why = refusal(config.model)
    if why:
        raise SesameError(f"--model {model}: a {config.family} run: {why}; export a Transformer family's run "
                          "(bert, roberta, albert, electra, gpt, gpt2, xlnet, ...) or a forward LSTM/GRU's")
    require_onnx("sesame export")
    batch = example_batch(task, predictor.tokenizer, config.max_length, config.causal)
    keys = [k for k in INPUT_NAMES if k in batch]
    inputs = {k: INPUT_NAMES[k] for k in keys}
    wrapper = Exported(predictor.model.cpu().eval(), keys).eval()
    with torch.no_grad():
        eager = wrapper(*(batch[k] for k in keys))
    with tempfile.TemporaryDirectory(prefix="sesame-onnx-") as tmp:  # written here, moved to out when all is well
        fp32, files = Path(tmp) / "fp32.onnx", Path(tmp) / "files"
        files.mkdir()
        axes = {name: {0: "batch", 1: "swapped_length" if key.startswith("swapped") else "length"}
                for key, name in inputs.items()}
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's warnings about Python values (shapes) it records
            torch.onnx.export(wrapper, tuple(batch[k].to(torch.int64) for k in keys), str(fp32), dynamo=False,
                              input_names=list(inputs.values()), output_names=[task.exported_output],
                              dynamic_axes={**axes, task.exported_output: {0: "batch"}}, opset_version=OPSET)
        difference = float((run_session(session(fp32), inputs, batch) - eager).abs().max())
        if difference > PARITY:
            raise SesameError(f"--model {model}: the exported graph's outputs differ from the model's by "
                              f"{difference:.2g} (> {PARITY:g}); please report it with the run's config.json")
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            logging.disable(logging.WARNING)  # its advice to pre-process first: whose shape inference fails here
            try:
                quantize_dynamic(fp32, files / MODEL_FILE, weight_type=QuantType.QInt8)
            finally:
                logging.disable(logging.NOTSET)
        else:
            fp32.rename(files / MODEL_FILE)
        (files / "tokenizer.json").write_text(export_tokenizer(predictor.tokenizer, config.max_length),
                                              encoding="utf-8")
        meta = {"format": "onnx", "model": MODEL_FILE, "quantize": quantize, "task": task.name,
                "labels": predictor.labels, "inputs": list(inputs.values()), "output": task.exported_output,
                "max_length": config.max_length, "pad_id": predictor.tokenizer.specials.pad,
                "family": config.family, "size": config.size, "opset": OPSET,
                "sesame": {"version": __version__, "task_options": task.options(), "causal": config.causal}}
        (files / EXPORT_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        claim_dir(out, "--out")  # held, and still new or empty
        for file in files.iterdir():
            shutil.move(file, out / file.name)
    return {"out": str(out), "inputs": meta["inputs"], "output": meta["output"], "quantize": quantize,
            "max_abs_difference_fp32": difference}
