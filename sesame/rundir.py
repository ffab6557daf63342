"""Run directories: what kind of run a folder holds, and how to rebuild its model.

``config.json`` names the kind (``pretrained`` or ``finetuned``), the family and the backbone
configuration; ``tokenizer.json`` and ``model.safetensors`` sit beside it.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from torch import nn

from . import __version__
from .errors import SesameError
from .models import build_model
from .tokenizer import TextTokenizer
from .train.checkpoint import load_weights, read_json, write_json


def read_config(run: str | Path, flag: str, kinds: tuple[str, ...]) -> dict:
    """The run's config.json, checked to be one of ``kinds``."""
    run = Path(run)
    if not run.is_dir():
        raise SesameError(f"{flag} {run}: no such run directory")
    if not (run / "config.json").is_file():
        raise SesameError(f"{flag} {run}: not a sesame run directory (no config.json)")
    config = read_json(run / "config.json")
    if config.get("kind") not in kinds:
        raise SesameError(f"{flag} {run}: holds a {config.get('kind')!r} run, but a {' or '.join(kinds)} run is needed")
    return config


def write_config(run: Path, config: dict) -> None:
    write_json(run / "config.json", {"sesame_version": __version__, **config})


@contextmanager
def new_run(out: str | Path, kind: str, resume: bool) -> Iterator[Path]:
    """Claim ``out`` for a run of ``kind``: refuse to overwrite another run; with ``resume`` require the same kind.

    If setting up a brand-new directory fails, it is removed again, so a failed command leaves nothing behind.
    """
    out = Path(out)
    existed = out.exists() and any(out.iterdir())
    if resume:
        read_config(out, "--out", (kind,))
    elif existed:
        raise SesameError(f"--out {out}: exists and is not empty; pass --resume to continue that run or choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    try:
        yield out
    except BaseException:
        if not existed and not resume and not (out / "config.json").exists():
            shutil.rmtree(out, ignore_errors=True)
        raise


def build_backbone(config: dict) -> nn.Module:
    """The backbone a run's config.json describes (:func:`sesame.models.build_model`), without weights."""
    return build_model(config["model"])


def load_backbone(run: str | Path, flag: str = "--model") -> nn.Module:
    """The backbone of a pretrained or fine-tuned run, with its weights (heads left behind), in eval mode."""
    run = Path(run)
    backbone = build_backbone(read_config(run, flag, ("pretrained", "finetuned")))
    weights = load_weights(run / "model.safetensors")
    backbone.load_state_dict({k[len("backbone."):]: v for k, v in weights.items() if k.startswith("backbone.")})
    return backbone.eval()


def load_tokenizer(path: str | Path, flag: str = "--tokenizer") -> TextTokenizer:
    """A tokenizer from a tokenizer.json file, or from the run or shard directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise SesameError(f"{flag} {path}: no tokenizer.json there")
    return TextTokenizer.load(path)
