"""Run directories: what kind of run a folder holds, claiming one for a new run, and rebuilding its model.

``config.json`` (:class:`sesame.specs.RunConfig`) names the kind (``pretrained`` or ``finetuned``), the
family and the backbone configuration; ``tokenizer.json`` and ``model.safetensors`` sit beside it.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from .errors import SesameError
from .models import build_model
from .outputs import check_dir, hold, make_dir, release
from .specs import KINDS, RunConfig
from .tokenizer import TextTokenizer
from .train import TrainConfig
from .train.checkpoint import TEMPORARY, checkpoint_dir, load_weights, read_json, write_json
from .train.trainer import world

SETTING_UP = ".setting-up" + TEMPORARY  # in a new run directory until its config.json is written (then a leftover)


def read_config(run: str | Path, flag: str, kinds: tuple[str, ...] = KINDS) -> RunConfig:
    """The run's config.json, checked against the schema (:class:`sesame.specs.RunConfig`) and to be one of
    ``kinds``."""
    run = Path(run)
    if not run.is_dir():
        raise SesameError(f"{flag} {run}: no such run directory")
    if not (run / "config.json").is_file():
        raise SesameError(f"{flag} {run}: not a sesame run directory (no config.json)")
    data = read_json(run / "config.json")
    if isinstance(data, dict) and data.get("kind") not in kinds:  # another kind of directory, before its fields
        raise SesameError(f"{flag} {run}: holds a {data.get('kind')!r} run, but a {' or '.join(kinds)} run is needed")
    return RunConfig.parse(data, f"{flag} {run / 'config.json'}")


def describe(config: RunConfig) -> dict:
    """What a run is, as ``sesame serve``'s /info says it: its kind, family, size, whether it is causal, and
    ``export`` None (a run; an ONNX export's predictor says its format and quantisation there)."""
    return {"kind": config.kind, "family": config.family, "size": config.size, "causal": config.causal,
            "export": None}


def write_config(run: Path, config: RunConfig) -> None:
    write_json(run / "config.json", config.to_json())
    (run / SETTING_UP).unlink(missing_ok=True)


def setup_killed(out: str | Path) -> bool:
    """Whether ``out`` is a run directory whose setup was killed before its config.json was written."""
    return (Path(out) / SETTING_UP).is_file() and not (Path(out) / "config.json").is_file()


def _checked(out: Path, kind: str, resume: bool) -> bool:
    """Whether the run in ``out`` continues: with ``resume`` a run of ``kind`` does, one whose setup was killed
    (:func:`setup_killed`) never does; else ``out`` must be new or empty (:func:`sesame.outputs.check_dir`)."""
    if setup_killed(out):
        return False
    if resume:
        read_config(out, "--out", (kind,))
    else:
        check_dir(out, "--out", fix="choose a new --out, or pass --resume to continue the run there")
    return resume


@contextmanager
def new_run(out: str | Path, kind: str, resume: bool) -> Iterator[Path]:
    """Claim ``out`` for a run of ``kind``: a new or empty folder (:func:`sesame.outputs.check_dir`); with ``resume``
    a run of the same kind. It is held (:func:`sesame.outputs.hold`) until the end, by rank 0 alone under torchrun,
    so a second command is refused.

    If setting up a brand-new directory fails, it is removed again, so a failed command leaves nothing behind;
    one whose setup was killed before config.json (it holds :data:`SETTING_UP`, and no command holds it) holds only
    what that setup wrote, so it is cleared and claimed afresh, with or without ``resume``.
    """
    out = Path(out)
    _checked(out, kind, resume)  # before making anything
    make_dir(out, "--out")
    took = world()[0] == 0 and hold(out, "--out")
    try:
        resume = _checked(out, kind, resume)  # once held: what another command did meanwhile counts too
        if setup_killed(out):
            for entry in out.iterdir():  # the folder itself stays: it is what is held
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if not resume:
            (out / SETTING_UP).touch()
        try:
            yield out
        except BaseException:
            if not resume and not (out / "config.json").exists():
                shutil.rmtree(out, ignore_errors=True)
            raise
    finally:
        if took:
            release(out)


def _barrier(failed: bool = False) -> None:
    """Wait for every process; ``failed`` on any of them (rank 0's setup, say) makes the others raise too."""
    if world()[1] > 1:
        flag = torch.tensor([float(failed)])
        dist.all_reduce(flag)
        if flag.item() and not failed:
            raise SesameError("another process (rank 0) failed to set up the run; its error is printed above")


@contextmanager
def claimed_run(out: str, kind: str, resume: bool, setup: Callable[[Path], None]) -> Iterator[Path]:
    """Rank 0 claims ``out`` and runs ``setup(run)`` (tokenizer, data, config.json) unless it has a config.json
    (resuming); the other processes wait at a barrier, then open the same run. A setup failure on rank 0 is
    passed on to the waiting processes instead of leaving them hanging."""
    rank = world()[0]
    if rank > 0:
        _barrier()
        if not (Path(out) / "config.json").is_file():
            raise SesameError(f"--out {out}: rank {rank} does not see the run rank 0 set up there; on several "
                              "machines --out and the inputs must lie on a filesystem they share, at the same path")
    ready = rank > 0
    try:
        with new_run(out, kind, resume or rank > 0) as run:
            if rank == 0 and not (run / "config.json").is_file():
                setup(run)
            if not ready:
                ready = True
                _barrier()
            yield run
    except BaseException:
        if not ready:
            _barrier(failed=True)
        raise


def from_checkpoint(out: str | Path, resume: bool) -> bool:
    """Whether a run continues from its checkpoint: with ``resume``, when it has one. A run killed before its
    first checkpoint (or before its config.json) starts again from step 0, its weights as a new run's."""
    return resume and checkpoint_dir(Path(out)) is not None


def check_batch(cfg: TrainConfig) -> None:
    """Each process gets a share of every global batch (:func:`sesame.train.trainer.micro_batches`; shares may
    differ by one, so any world size trains like one process), hence at least one sequence of it."""
    processes = world()[1]
    if cfg.batch_size < processes:
        raise SesameError(f"--batch-size {cfg.batch_size}: fewer sequences per step than the {processes} processes "
                          f"torchrun started; give --batch-size {processes} or more, or start fewer processes")


def build_backbone(config: RunConfig) -> nn.Module:
    """The backbone a run's config.json describes (:func:`sesame.models.build_model`), without weights."""
    return build_model(config.model)


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
