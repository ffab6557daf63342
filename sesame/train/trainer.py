"""The training loop shared by pre-training and fine-tuning.

One optimizer step consumes one *global batch*, given as this process's micro-batches; the loss
is the sum over every target in the global batch divided by their number, so gradient
accumulation and ``torchrun`` (DistributedDataParallel, one process per core or GPU) give the same
update as one process with the whole batch. Every random draw in step ``s`` comes from seeds
derived from ``(seed, s)``, which makes resuming from a checkpoint exact: no random state is saved, only the
step (and, in fp16, the gradient scaler's state).

The model lives on the :class:`sesame.runtime.Placement`'s device; each micro-batch is built on the CPU, on a
background thread while the step before trains (:mod:`.prefetch`), and moved there when its step consumes it,
forward passes run under the placement's autocast, and with fp16 the loss is scaled so small gradients survive and
a step whose gradients overflow is skipped (the scale halves). The host reads the loss back from the device only
where it is logged or checked (every :data:`LOG_EVERY` steps, and before dev is read or a checkpoint written), so
on an accelerator the host queues the next steps while this one runs.
"""
from __future__ import annotations

import json
import math
import signal
import time
from contextlib import nullcontext
from dataclasses import KW_ONLY, asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from ..errors import SesameError
from ..options import option
from ..runtime import Placement
from .checkpoint import (atomic_write_text, checkpoint_dir, load_optimizer, load_weights, read_json, remove_leftovers,
                         save_checkpoint, save_weights)
from .metrics_log import MetricsLog
from .optim import adamw, linear_warmup_decay, slanted_triangular
from .prefetch import Batch, Batches, Prefetcher

STAND_IN = "stand_in"  # a micro-batch key: its loss counts for nothing (see micro_batches)
LOG_EVERY = 10  # steps between records of the training loss (and the first step's)


class Interrupted(Exception):
    """Raised after Ctrl-C once the finished steps are saved."""


SCHEDULES = ("linear", "stlr")


@dataclass
class TrainConfig:
    """The training loop's settings; each field is also a flag of every training command (``--batch-size``)."""
    lr: float = option(5e-4, help="peak learning rate")
    weight_decay: float = option(0.01, help="AdamW weight decay (not on biases and norms)")
    warmup: float = option(0.06, help="fraction of the run spent warming up")
    batch_size: int = option(32, help="sequences per optimizer step, over all micro-batches and processes")
    accumulate: int = option(1, help="micro-batches per step")
    clip: float = option(1.0, help="max global gradient norm (0 = off)")
    max_steps: int | None = option(1000, help="step budget (default 1000; none when only --max-minutes is given)")
    max_minutes: float | None = option(None, help="wall-time budget for the whole command")
    eval_every: int = option(200, help="validate every N steps (fine-tuning: after every epoch when not given)")
    eval_points: int = option(0, help="with --max-minutes, also validate as each 1/N of the time is spent, whatever "
                                      "the steps (fine-tuning: 2)")
    save_every: int = option(200, help="checkpoint every N steps (fine-tuning: after every epoch when not given)")
    seed: int = option(0, help="random seed")
    schedule: str = option("linear", choices=SCHEDULES,
                           help="learning-rate schedule: linear (warmup, then down to 0; BERT) or stlr (slanted "
                                "triangular, ULMFiT: --warmup is its cut_frac)")
    stlr_ratio: float = option(32.0, help="stlr: peak / lowest learning rate (32 in ULMFiT)")
    cycles: int = option(1, help="run the schedule N times over equal parts of the run (e.g. one per epoch of "
                                 "gradual unfreezing)")

    def validate(self) -> None:
        checks = [
            (self.max_steps is None and self.max_minutes is None, "--max-steps or --max-minutes", "give a budget"),
            (self.max_steps is not None and self.max_steps <= 0, "--max-steps", "must be positive"),
            (self.max_minutes is not None and self.max_minutes <= 0, "--max-minutes", "must be positive"),
            (self.lr <= 0, "--lr", "must be positive"),
            (self.batch_size <= 0, "--batch-size", "must be positive"),
            (self.accumulate <= 0 or self.batch_size % self.accumulate, "--accumulate",
             "must be positive and divide --batch-size"),
            (not 0 <= self.warmup < 1, "--warmup", "is a fraction of the run in [0, 1)"),
            (self.eval_every <= 0 or self.save_every <= 0, "--eval-every/--save-every", "must be positive"),
            (self.eval_points < 0, "--eval-points", "must be 0 (none) or more"),
            (self.schedule not in SCHEDULES, "--schedule", f"choose one of {', '.join(SCHEDULES)}"),
            (self.cycles < 1, "--cycles", "must be at least 1"),
            (self.schedule == "stlr" and not (self.warmup > 0 and self.stlr_ratio >= 1), "--schedule stlr",
             "needs --warmup (its cut_frac) above 0 and --stlr-ratio of at least 1"),
        ]
        for bad, flag, what in checks:
            if bad:
                raise SesameError(f"{flag}: {what}")

    def rate(self, progress: float) -> float:
        """The learning-rate multiplier at ``progress`` ∈ [0, 1] of the run; with ``cycles`` = k the schedule
        restarts k times, each over 1/k of the run (the ULMFiT authors' code fits one slanted triangle per
        gradual-unfreezing step)."""
        if self.cycles > 1:
            progress = min(1.0, progress * self.cycles - min(self.cycles - 1, int(progress * self.cycles)))
        if self.schedule == "stlr":
            return slanted_triangular(progress, self.warmup, self.stlr_ratio)
        return linear_warmup_decay(progress, self.warmup)


@dataclass(frozen=True)
class RunSettings:
    """Where and how a :class:`Trainer` runs, as a pipeline hands it over: the run directory it writes, the loop's
    settings, the placement (the CPU in fp32 when not given), whether it shows a progress bar, and when the command
    started (the time budget counts the whole command; when not given, now)."""
    run: Path
    config: TrainConfig
    _: KW_ONLY
    placement: Placement = field(default_factory=Placement.cpu)
    progress: bool = True
    started: float = field(default_factory=time.time)


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when not launched by torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def micro_batches(examples: Sequence[int], accumulate: int, build: Callable[[list[int]], Batch]) -> list[Batch]:
    """This process's micro-batches of a global batch's ``examples`` (``build`` makes the batch of a few): every
    world-size-th example from this process's rank (the shares differ by at most one), in at most ``accumulate``
    micro-batches. A process the batch leaves without an example (a fine-tuning epoch's last batch may be smaller
    than the world) builds the first one as a :data:`STAND_IN`: weighted 0, it only keeps the process in the
    gradient all-reduce."""
    rank, size = world()
    mine = list(examples)[rank::size]
    if not mine:
        return [{**build(list(examples[:1])), STAND_IN: True}]
    per_micro = math.ceil(len(mine) / accumulate)
    return [build(mine[start: start + per_micro]) for start in range(0, len(mine), per_micro)]


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over the torchrun processes (the values themselves in a single process)."""
    if world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def loss_parts(output: torch.Tensor | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A model's summed loss, or its several named summed losses, as a dict."""
    return output if isinstance(output, dict) else {"loss": output}


def loss_counts(batch: Batch) -> dict[str, int]:
    """How many terms each loss of ``batch`` sums: ``batch["counts"]`` when the model returns several
    losses, else the number of ``targets``."""
    return batch.get("counts") or {"loss": batch["targets"].numel()}


def mean_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The loss the trainer minimises, for ``batch`` alone: Σ weight · summed loss / its count."""
    counts, weights = loss_counts(batch), getattr(model, "part_weights", {})
    return sum(weights.get(name, 1.0) * value / max(1, counts[name]) for name, value in loss_parts(model(batch)).items())


class Trainer:
    """Runs optimizer steps until the budget is spent, evaluating and checkpointing on the way.

    ``batches(step, progress)`` returns this process's micro-batches for a step (``progress``: the
    fraction of the budget spent, for schedules of the data such as BERT's two sequence lengths, which a
    :class:`~.prefetch.Phased` source declares; any other must not depend on it), built one step ahead on a
    background thread; each is a dict with a ``targets`` tensor and ``model(batch)`` returns the summed loss over
    those targets. ``param_groups`` replace the default AdamW groups (each may carry its own ``base_lr``,
    which the schedule scales); ``before_step(step)`` runs before each step (gradual unfreezing).
    A model with several losses names them in ``part_names`` (weights in ``part_weights``),
    returns a dict of summed losses, and each batch counts their terms in ``batch["counts"]``; the
    step minimises Σ weight · (global sum / global count). A model with a ``set_progress(fraction)``
    method is told the progress before each step.
    ``evaluate(model)`` returns dev metrics; with ``select`` set, the weights with the best value of
    that metric (higher is better, or lower for names ending in ``loss``/``perplexity``) are the
    ones written to ``model.safetensors`` of ``settings.run``; otherwise the last weights are. Those are the
    weights of ``keeps`` (default: ``model``), a part of ``model``: a model that wraps another only to compute
    its loss (distillation's, around the student) keeps the inner one's; checkpoints hold the whole ``model``'s
    (the student's and what the loss trains beside it, distillation's layer maps).
    ``settings.placement`` places the model (moved there by the trainer, before the optimizer is made) and sets its
    precision.
    """

    def __init__(self, model: nn.Module, settings: RunSettings, batches: Batches, *,
                 evaluate: Callable[[nn.Module], dict] | None = None, select: str | None = None,
                 param_groups: list[dict] | None = None, before_step: Callable[[int], None] | None = None,
                 keeps: nn.Module | None = None):
        config = settings.config
        config.validate()
        self.placement = settings.placement
        self.model, self.run, self.config = self.placement.model(model), Path(settings.run), config
        self.kept = model if keeps is None else keeps
        self.batches, self.evaluate, self.select, self.before_step = batches, evaluate, select, before_step
        self.started, self.progress = settings.started, settings.progress
        self.rank, self.world = world()
        self.optimizer = adamw(param_groups or model, config.lr, config.weight_decay)
        self.scaler = self.placement.scaler()
        self.step, self.elapsed_before = 0, 0.0
        self.finished = False  # the budget was spent, the last evaluation done and the weights kept
        self.setup_seconds = 0.0  # of the budget, spent before the first step
        self.best: dict = {}  # dev metrics of the selected weights
        self.last_eval: dict = {}
        self.evaluated_at = -1
        self.step_progress = 0.0  # the budget's share spent when the last step began, as all processes agreed
        self.eval_point: int | None = None  # the share of a time budget's eval_points the last step was in
        self._stop_requested = False  # this process saw Ctrl-C
        self._stopping = False  # some process saw Ctrl-C: agreed by all at the top of each step
        self._prefetcher: Prefetcher | None = None  # while fit runs
        self._last_loss = self._unread_loss = torch.zeros((), device=self.placement.device)  # on the device

    # -- state -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.started

    def progress_fraction(self, elapsed: float | None = None, *, step: int | None = None) -> float:
        """How much of the budget is spent (as step ``step`` begins; by default this one): the larger of the step
        and time fractions. The time fraction counts from the first step, so set-up time (tokenizer, shards)
        shortens the run but does not eat the warmup."""
        c = self.config
        by_steps = (self.step if step is None else step) / c.max_steps if c.max_steps else 0.0
        elapsed = self.elapsed() if elapsed is None else elapsed
        by_time = 0.0
        if c.max_minutes:
            by_time = (elapsed - self.setup_seconds) / max(1e-9, 60 * c.max_minutes - self.setup_seconds)
        return min(1.0, max(by_steps, by_time))

    def trainer_state(self) -> dict:
        state = {"step": self.step, "elapsed": self.elapsed(), "setup_seconds": self.setup_seconds, "best": self.best,
                 "last_eval": self.last_eval, "config": asdict(self.config), "finished": self.finished}
        if self.scaler.is_enabled():  # fp16: the loss scale and its growth tracker (plain numbers)
            state["scaler"] = self.scaler.state_dict()
        return state

    def resume(self) -> None:
        ckpt = checkpoint_dir(self.run)
        if ckpt is None:
            raise SesameError(f"--resume: {self.run} has no checkpoint to resume from; drop --resume to start fresh")
        state = read_json(ckpt / "trainer_state.json")
        self.model.load_state_dict(load_weights(ckpt / "model.safetensors"))
        load_optimizer(self.optimizer, load_weights(ckpt / "optimizer.safetensors"), read_json(ckpt / "optimizer.json"))
        if self.scaler.is_enabled() and "scaler" in state:  # else fp16 starts a fresh scale (the run was not fp16)
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.best, self.last_eval = state["step"], state["best"], state["last_eval"]
        self.elapsed_before, self.setup_seconds = state["elapsed"], state["setup_seconds"]
        self.finished = state.get("finished", False)  # runs saved before it was recorded finish again
        self.started = time.time()

    def _nothing_left(self) -> bool:
        """Whether a resumed run had finished and the budget (perhaps a new one) is spent: nothing to do, nor
        to write. Read from the checkpoint alone, so every process agrees."""
        c = self.config
        return self.finished and ((c.max_steps is not None and self.step >= c.max_steps) or (
            c.max_minutes is not None and self.elapsed_before >= 60 * c.max_minutes))

    def _forget_logged_after(self, step: int) -> None:
        """Keep the records of metrics.jsonl up to ``step`` (the checkpoint resumed from; 0 when starting): what
        was logged after it will be logged again. A last line cut short by a kill mid-write is dropped."""
        metrics = self.run / "metrics.jsonl"
        if not metrics.exists():
            return
        text = metrics.read_text()
        kept = []
        for number, line in enumerate(text[: text.rfind("\n") + 1].splitlines(), 1):
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (json.JSONDecodeError, TypeError, KeyError):
                raise SesameError(f"{metrics}, line {number}: not a metrics record; delete the line, or the file "
                                  "to start its log afresh") from None
        atomic_write_text(metrics, "".join(line + "\n" for line in kept))

    def save(self) -> None:
        if self.rank == 0:
            save_checkpoint(self.run, self.model.state_dict(), self.optimizer, self.trainer_state())

    @cached_property
    def metrics_log(self) -> MetricsLog:
        """metrics.jsonl, and TensorBoard's files when it is installed: this trainer's log from its first record."""
        return MetricsLog(self.run)

    def log(self, record: dict) -> None:
        if self.rank == 0:
            self.metrics_log.append(record)

    # -- loop ------------------------------------------------------------------------------
    def _budget_spent(self) -> bool:
        """Whether any process has spent the budget; also agrees on ``_stopping`` (any process saw Ctrl-C).

        Called once at the top of every step on every process: one all-reduce, so all processes
        take the same branch even though their clocks and signals differ.
        """
        c = self.config
        spent = (c.max_steps is not None and self.step >= c.max_steps) or (
            c.max_minutes is not None and self.elapsed() >= 60 * c.max_minutes)
        stop = all_sum([float(spent), float(self._stop_requested)])
        self._stopping = stop[1] > 0
        return stop[0] > 0

    def _better(self, metrics: dict) -> bool:
        if not self.best:
            return True
        value, best = metrics[self.select], self.best[self.select]
        return value < best if self.select.endswith(("loss", "perplexity")) else value > best

    def _entered_eval_point(self) -> bool:
        """Whether the last step entered another 1/``eval_points`` of a time budget (from the second part on; the
        last part's evaluation is the end's), so dev is read a few times however few steps a slow machine makes.
        The first step after starting or resuming notes the part it is in."""
        c = self.config
        if not (c.max_minutes and c.eval_points):
            return False
        point = min(c.eval_points - 1, int(self.step_progress * c.eval_points))
        entered = self.eval_point is not None and point > self.eval_point
        self.eval_point = point
        return entered

    def _evaluate(self) -> None:
        if self.evaluate is None:
            return
        self.model.eval()
        with torch.no_grad(), self.placement.autocast():
            metrics = self.evaluate(self.model)
        self.model.train()
        self.last_eval, self.evaluated_at = metrics, self.step
        self.log({"step": self.step, "split": "dev", **metrics, "elapsed": round(self.elapsed(), 2)})
        if self.select is not None and self._better(metrics):
            self.best = metrics
            if self.rank == 0:
                save_weights(self.run / "model.safetensors", self.kept.state_dict())

    def _train_step(self, wrapped: nn.Module) -> int:
        """One optimizer step; returns this process's input tokens. The step's loss (the mean over the global batch's
        targets) stays on the device until :meth:`_read_loss`."""
        c = self.config
        torch.manual_seed(c.seed * 1_000_003 + self.step * self.world + self.rank)  # dropout, repeatable
        # one clock for all processes, so a time budget sets the same rate and schedule on each
        progress = self.step_progress = self.progress_fraction(all_sum([self.elapsed()])[0] / self.world)
        if hasattr(self.model, "set_progress"):
            self.model.set_progress(progress)
        if self.before_step is not None:
            self.before_step(self.step)
        micro = self._prefetcher.take(self.step, progress)
        if c.max_steps is None or self.step + 1 < c.max_steps:  # the next step's, while this one trains
            self._prefetcher.ahead(self.step + 1, self.progress_fraction(step=self.step + 1))
        names = getattr(self.model, "part_names", ()) or ("loss",)
        counted = [b for b in micro if not b.get(STAND_IN)]
        totals = all_sum([float(sum(loss_counts(b)[name] for b in counted)) for name in names])  # global counts
        scale = {name: getattr(self.model, "part_weights", {}).get(name, 1.0) * self.world / max(1.0, total)
                 for name, total in zip(names, totals)}
        for group in self.optimizer.param_groups:
            group["lr"] = group.get("base_lr", c.lr) * c.rate(progress)
        loss_sum, tokens = torch.zeros((), device=self.placement.device), 0
        for i, batch in enumerate(micro):
            batch = self.placement.move(batch)
            sync = nullcontext() if i == len(micro) - 1 or self.world == 1 else wrapped.no_sync()
            with sync:
                with self.placement.autocast():
                    parts = loss_parts(wrapped(batch))
                loss = sum(value.float() * scale[name] for name, value in parts.items())  # in float32
                if batch.get(STAND_IN):
                    loss = loss * 0.0
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach() / self.world
            tokens += 0 if batch.get(STAND_IN) else batch["ids"].numel()
        self.scaler.unscale_(self.optimizer)  # the true gradients, for clipping (nothing to do unless fp16)
        if c.clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), c.clip)
        self.scaler.step(self.optimizer)  # fp16: skipped when a gradient overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._last_loss, self._unread_loss = loss_sum, self._unread_loss + loss_sum
        return tokens

    def _read_loss(self, tokens: int = 0) -> tuple[float, int]:
        """The last step's loss and the sum of ``tokens`` over the processes: the one point where the host waits
        for the device, after checking that every step's loss since the last read was finite (so no checkpoint or
        record holds weights a non-finite loss made). Every process calls it at the same steps."""
        last, unread, tokens = all_sum([*torch.stack([self._last_loss, self._unread_loss]).tolist(), float(tokens)])
        self._unread_loss = torch.zeros_like(self._unread_loss)
        if not math.isfinite(unread):
            raise SesameError(f"the loss became {unread} by step {self.step}; lower --lr or raise --warmup")
        return last, int(tokens)

    def fit(self, resume: bool = False, *, record: Callable[[], None] | None = None) -> dict:
        """Train to the budget; returns the dev metrics of the kept weights (empty without ``evaluate``).
        ``record`` (rank 0's; a pipeline's record of the budget in config.json) is called once the checkpoint is
        read; a run resumed after it finished, with no budget left, returns its metrics and writes nothing."""
        self.run.mkdir(parents=True, exist_ok=True)
        if resume:
            self.resume()
            if self._nothing_left():
                return self.best if self.select else self.last_eval
            self.finished = False  # until the new budget is spent
        if self.rank == 0:
            if record is not None:
                record()
            remove_leftovers(self.run)
            self._forget_logged_after(self.step)
        wrapped: nn.Module = self.model
        if self.world > 1:  # averages gradients over processes; forward(batch) passes the dict through
            index = self.placement.device.index  # a GPU per process, else the CPU
            wrapped = nn.parallel.DistributedDataParallel(self.model, device_ids=None if index is None else [index])
        wrapped = self.placement.compiled(wrapped, "training step's forward pass")
        self.model.train()
        # every process catches Ctrl-C (torchrun forwards it to each worker); they agree to stop in _budget_spent
        previous = signal.signal(signal.SIGINT, self._request_stop)
        c = self.config
        if not resume:
            self.setup_seconds = all_sum([self.elapsed()])[0] / self.world
        by_time = c.max_minutes is not None  # then the bar shows the share of the budget spent
        bar = tqdm(total=100 if by_time else c.max_steps, initial=0 if by_time else self.step, desc="train",
                   unit="%" if by_time else "step", disable=not self.progress or self.rank > 0, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n:.0f}/{total} [{elapsed}<{remaining}{postfix}]" if by_time else None)
        window_start, window_tokens = time.time(), 0
        self._prefetcher = Prefetcher(self.batches, self.placement.staged)
        try:
            while not self._budget_spent():
                if self._stopping:
                    self._read_loss()
                    self.save()
                    raise Interrupted(f"interrupted at step {self.step}; the run is saved, continue with --resume")
                window_tokens += self._train_step(wrapped)
                bar.update(round(100 * self.progress_fraction(), 1) - bar.n if by_time else 1)
                if self.step % LOG_EVERY == 0 or self.step == 1:
                    loss, tokens = self._read_loss(window_tokens)
                    rate = tokens / max(1e-9, time.time() - window_start)
                    bar.set_postfix(step=self.step, loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
                    self.log({"step": self.step, "split": "train", "loss": round(loss, 5),
                              "lr": self.optimizer.param_groups[0]["lr"], "tokens_per_s": round(rate),
                              "elapsed": round(self.elapsed(), 2)})
                    window_start, window_tokens = time.time(), 0
                evaluate = self._entered_eval_point() or self.step % c.eval_every == 0
                save = self.step % c.save_every == 0
                if evaluate or save:
                    self._read_loss()
                if evaluate:
                    self._evaluate()
                if save:
                    self.save()
            self._read_loss()
            if self.evaluated_at != self.step:
                self._evaluate()
            if self.select is None and self.rank == 0:
                save_weights(self.run / "model.safetensors", self.kept.state_dict())
            self.finished = True
            self.save()
        finally:
            self._prefetcher.close()
            bar.close()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return self.best if self.select else self.last_eval

    def _request_stop(self, signum, frame) -> None:
        if self._stop_requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self._stop_requested = True
