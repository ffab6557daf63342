"""A folder ``sesame export`` wrote (:mod:`sesame.interop.onnx_export`), read back: its files, its record
(export.json) and its graph run by onnxruntime, for ``sesame predict``, ``evaluate`` and ``serve``
(:class:`sesame.pipelines.evaluate.ExportedPredictor`)."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import SesameError

EXPORT_FILE = "export.json"
MODEL_FILE = "model.onnx"
INSTALL = "pip install 'sesame-nlp[onnx]'"
# sesame's batch keys → the ONNX inputs' names (transformers' names for the first three)
INPUT_NAMES = {"ids": "input_ids", "padding": "attention_mask", "types": "token_type_ids",
               "swapped_ids": "swapped_input_ids", "swapped_padding": "swapped_attention_mask",
               "swapped_types": "swapped_token_type_ids"}


def require_onnx(flag: str) -> None:
    """Fail, naming ``flag``, unless onnx, onnxruntime and onnxscript (the exporter's) can be imported."""
    try:
        for name in ("onnx", "onnxruntime", "onnxscript"):
            importlib.import_module(name)
    except ImportError as err:
        raise SesameError(f"{flag}: ONNX needs the packages of sesame's onnx extra ({err.name} is missing); "
                          f"install them with `{INSTALL}`") from None


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is a folder ``sesame export`` wrote."""
    return (Path(path) / EXPORT_FILE).is_file() and (Path(path) / MODEL_FILE).is_file()


def read_export(path: str | Path, flag: str) -> dict:
    """An export's export.json, checked to hold what ``sesame predict`` reads."""
    file = Path(path) / EXPORT_FILE
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SesameError(f"{flag} {file}: not readable as JSON ({err}); export the run again") from None
    missing = [k for k in ("format", "quantize", "task", "labels", "inputs", "output", "max_length", "family", "sesame")
               if k not in meta]
    if missing or meta["format"] != "onnx":
        raise SesameError(f"{flag} {file}: not an ONNX export of sesame (missing {', '.join(missing) or 'format'}); "
                          "export the run again with `sesame export`")
    return meta


def session(path: Path, *, threads: int = 0):
    """An onnxruntime inference session of the ONNX file ``path`` on the CPU; ``threads``: its intra-op threads
    (0: onnxruntime's default, one per core)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: no warnings about unused initialisers on stderr
    options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(sess, inputs: dict[str, str], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``sess`` on a sesame batch: its tensors under the ONNX names ``inputs`` ({batch key: name})."""
    feed = {name: batch[key].numpy().astype(np.int64) for key, name in inputs.items()}
    return torch.from_numpy(sess.run(None, feed)[0])


class OnnxModel(nn.Module):
    """An exported graph where :func:`sesame.tasks.infer` expects a task model: ``outputs(batch)`` runs it in
    onnxruntime on the batch's tensors named ``inputs`` (the export's ONNX input names)."""

    def __init__(self, path: Path, inputs: list[str]):
        super().__init__()
        keys = {name: key for key, name in INPUT_NAMES.items()}
        unknown = [name for name in inputs if name not in keys]
        if unknown:
            raise SesameError(f"--model {path.parent}: inputs {unknown} are not sesame's; export the run again")
        self.inputs = {keys[name]: name for name in inputs}
        from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf

        try:
            self.session = session(path)
        except (Fail, InvalidGraph, InvalidProtobuf) as err:  # a file cut short, garbled, or not ONNX
            reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise SesameError(f"--model {path.parent}: onnxruntime cannot load {path.name} ({reason}); export the run "
                              "again (sesame export)") from None

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return run_session(self.session, self.inputs, batch)
