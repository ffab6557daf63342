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
from safetensors.torch import load_file, save_file

from ..errors import SesameError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary(path: Path) -> str:
    """A temporary file beside ``path`` with ordinary permissions (mkstemp's are owner-only)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return tmp


def temporary_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory inside ``parent`` (to be renamed into place), with ordinary permissions."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def atomic_write_text(path: Path, text: str) -> None:
    tmp = _temporary(path)
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SesameError(f"{path}: missing; is {path.parent} a sesame run directory?") from None
    except json.JSONDecodeError as err:
        raise SesameError(f"{path}: not valid JSON ({err})") from None


def save_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    tmp = _temporary(path)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp)
    os.replace(tmp, path)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise SesameError(f"{path}: missing weights; is {path.parent} a finished sesame run?")
    return load_file(str(path))


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
    final, old = run / "checkpoint", run / ".checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir(run: Path) -> Path | None:
    """The newest complete checkpoint (the old one survives a crash between the two renames)."""
    for candidate in (run / "checkpoint", run / ".checkpoint.old"):
        if (candidate / "trainer_state.json").is_file():
            return candidate
    return None
