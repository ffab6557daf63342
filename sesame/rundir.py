"""Claiming a run directory for a new run (also under torchrun), and whether a run continues from its checkpoint.
What a run directory holds and how it is read: :mod:`sesame.run`."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from .errors import SesameError
from .outputs import check_dir, hold, make_dir, release
from .run import SETTING_UP, read_config
from .train import TrainConfig
from .train.checkpoint import checkpoint_dir
from .train.trainer import world



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
