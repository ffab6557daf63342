"""Checkpoint files: safetensors for tensors, JSON for everything else, written atomically.

Nothing here unpickles: a checkpoint can be loaded from an untrusted source without running code.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import SesameError


TEMPORARY = ".tmp"  # the suffix of files and folders written beside their final name, then renamed
OLD = ".checkpoint.old"  # the previous checkpoint, for a moment during a save


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary(path: Path) -> str:
    """A new temporary file beside ``path``, for :func:`_commit` to move into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY, dir=path.parent)
    os.close(fd)
    return tmp


def temporary_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory inside ``parent`` (to be renamed into place), with ordinary permissions."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=TEMPORARY, dir=parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def _fsync(path: str | Path) -> None:
    """Flush a file, or a directory's entries (where the system can open one), to the disk."""
    if Path(path).is_dir() and not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: str | Path, path: Path) -> None:
    """Move a finished temporary file or folder onto ``path``, so that a crash leaves either the old one or the new
    one, whole: its data flushed before the rename and the directory's entry after. A file gets the permissions the
    umask gives (mkstemp's are owner-only, and safetensors replaces the file it is given)."""
    if Path(tmp).is_file():
        os.chmod(tmp, 0o666 & ~_umask())
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = _temporary(path)
    Path(tmp).write_text(text, encoding="utf-8")
    _commit(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = _temporary(path)
    Path(tmp).write_bytes(data)
    _commit(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def read_json(path: Path) -> Any:
    """A JSON file sesame wrote (a run's config.json, trainer state); missing, not UTF-8 or not JSON is one line."""
    try:
        return json.loads(path.read_bytes())  # bytes: JSON's own UTF-8 (with or without a BOM), whatever the locale
    except FileNotFoundError:
        raise SesameError(f"{path}: missing; is {path.parent} a sesame run directory?") from None
    except UnicodeDecodeError:
        raise SesameError(f"{path}: not UTF-8 text, so not a file sesame wrote; restore it or recreate the run") from None
    except json.JSONDecodeError as err:
        raise SesameError(f"{path}: not valid JSON ({err})") from None


def save_weights(path: Path, state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    tmp = _temporary(path)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp, metadata=metadata)
    _commit(tmp, path)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a missing, cut short or damaged one is a :class:`SesameError` saying so."""
    if not path.is_file():
        raise SesameError(f"{path}: missing weights; is {path.parent} a finished sesame run?")
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise SesameError(f"{path}: not a whole safetensors file ({err}); it was cut short or damaged, so copy it "
                          "again or run the command that wrote it again") from None


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer's state dict into flat tensors (for safetensors) and JSON-able rest."""
    state = optimizer.state_dict()
    tensors = {f"{pid}.{name}": value for pid, slots in state["state"].items() for name, value in slots.items()}
    return tensors, {"param_groups": state["param_groups"]}


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], rest: dict) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": rest["param_groups"]})


def save_checkpoint(run: Path, model_state: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                    trainer_state: dict) -> None:
    """Write ``run/checkpoint/`` as a whole: build it beside, then swap it in with renames."""
    tmp = temporary_dir(run, ".checkpoint.")
    save_weights(tmp / "model.safetensors", model_state)
    tensors, rest = optimizer_tensors(optimizer)
    save_weights(tmp / "optimizer.safetensors", tensors)
    write_json(tmp / "optimizer.json", rest)
    write_json(tmp / "trainer_state.json", trainer_state)
    final, old = run / "checkpoint", run / OLD
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    _commit(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir(run: Path) -> Path | None:
    """The newest complete checkpoint (the old one survives a crash between the two renames)."""
    for candidate in (run / "checkpoint", run / OLD):
        if (candidate / "trainer_state.json").is_file():
            return candidate
    return None


def remove_leftovers(run: Path) -> None:
    """Remove what saves killed midway left in ``run``: temporary files and checkpoint folders, and the previous
    checkpoint once the newest is whole."""
    newest = checkpoint_dir(run)
    for path in run.glob(".*"):
        if path.name.endswith(TEMPORARY) or path.name.startswith(".checkpoint.") and path != newest:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
