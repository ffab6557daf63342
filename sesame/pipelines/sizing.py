"""``sesame pretrain --size auto``: each candidate size timed for a few training steps on the run's own corpus,
tokenizer, objective and device, then :mod:`sesame.budget`'s rule. Only a new run measures; a resumed one reads
config.json's ``sizing``."""
from __future__ import annotations

import time
from dataclasses import replace

from torch import nn

from ..budget import Candidate, Sizing, sizing
from ..data.shards import Shards
from ..data.windows import training_windows, window_batches
from ..families import SIZES
from ..models import build_model
from ..objectives import build_objective
from ..runtime import Placement
from ..specs import PretrainSpec
from ..tokenizer import TextTokenizer
from ..train import TrainConfig, mean_loss
from ..train.optim import adamw
from .starts import NewModel

TIMED_STEPS = 3  # after one untimed step (allocations, first calls)


def auto_size(spec: PretrainSpec, tok: TextTokenizer, shards: Shards, cfg: TrainConfig, placement: Placement
              ) -> Sizing:
    """What ``--size auto`` picks for the spec's ``--max-minutes`` (:func:`sesame.budget.sizing`), timing the
    family's sizes on ``shards`` as :func:`tokens_per_second` does."""
    window = spec.window_length()
    windows, _, _ = training_windows(shards, None, length=window, seq_len=spec.seq_len)  # once, for every size

    def measure(size: str) -> Candidate:
        backbone = build_model(NewModel().backbone(replace(spec, size=size), tok))
        parameters = sum(p.numel() for name, p in backbone.named_parameters() if not name.startswith("embed"))
        timed = tokens_per_second(spec, backbone, tok, shards, cfg, placement, windows=(window, windows))
        return Candidate(size, parameters, timed)

    return sizing(SIZES, measure, minutes=cfg.max_minutes, batch_size=cfg.batch_size, window=window,
                  accumulate=cfg.accumulate, keep_batch=bool({"batch_size", "accumulate"} & set(spec.training)))


def tokens_per_second(spec: PretrainSpec, backbone: nn.Module, tok: TextTokenizer, shards: Shards,
                      cfg: TrainConfig, placement: Placement, *, windows: tuple[int, list]) -> float:
    """Input tokens per second (wall clock, as the budget counts) of :data:`TIMED_STEPS` optimizer steps of
    ``backbone`` under the spec's objective on ``windows`` (their length and the training windows of ``shards``):
    the trainer's batches, forward, backward and AdamW step."""
    obj = placement.model(build_objective(spec.objective_name, backbone, tok, spec.objective_settings()))
    batches = window_batches(obj, shards, [windows], cfg, spec.static_masks)
    optimizer = adamw(obj, cfg.lr, cfg.weight_decay)
    obj.train()

    def step(index: int) -> int:
        tokens = 0
        for batch in batches(index, 0.0):
            batch = placement.move(placement.staged(batch))  # as the trainer places it
            with placement.autocast():
                loss = mean_loss(obj, batch)
            loss.backward()
            tokens += batch["ids"].numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())  # waits for an accelerator's queue
        return tokens

    step(0)
    began = time.perf_counter()
    tokens = sum(step(index) for index in range(1, TIMED_STEPS + 1))
    return tokens / max(1e-9, time.perf_counter() - began)
