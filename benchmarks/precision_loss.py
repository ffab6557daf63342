"""Valid loss after a fixed number of training steps in fp32 and in bf16, from the same start on the same batches.

The BERT-mini masked LM and the GPT-2-mini causal LM of ``benchmarks/train_step.py`` (the same models and the
same training step: the forward pass under ``sesame.runtime.Placement.autocast``, the loss in float32, AdamW),
started from the same initial weights and trained ``--steps`` steps on the same batches, once in each precision.
The learning rate is ``sesame pretrain``'s default (5e-4), constant; dropout 0.1.

The batches are text-like: windows of a Markov chain over the vocabulary in which every token has four possible
successors, taken with probabilities 0.55, 0.25, 0.15 and 0.05 (random tokens would leave nothing to learn
but their uniform distribution, so any precision would reach the same loss). The loss therefore has far to fall,
from about ln V towards the chain's 1.1 nats per token, and a precision that slows learning shows.

The valid loss is the mean loss per target over ``--valid-batches`` held-out batches of the same chain, in eval
mode (no dropout), each model under its own precision, as sesame's trainer validates. The yardstick of noise is a
second fp32 run that differs only in its dropout seed: bf16 is within noise when its loss differs from fp32's by
no more than that run's does. One JSON line per step, for example::

    {"bench": "mlm-loss-check", "config": {...}, "initial_valid_loss": 10.33,
     "valid_loss": {"fp32": 7.91, "bf16": 7.92, "fp32-reseeded": 7.93},
     "noise": 0.02, "difference": 0.01, "within_noise": true}

Durations on two quiet cores, estimated from train_step.py's fp32 step times (sesame: 0.6 s MLM, 1.8 s causal)
and three runs per step, bf16 taking 1-3x fp32's time (slower where the CPU lacks native bfloat16):

    python benchmarks/precision_loss.py                           # both steps, 100 steps: about 15-25 minutes
    python benchmarks/precision_loss.py --which mlm --steps 50    # about 2-4 minutes
    python benchmarks/precision_loss.py --size tiny --steps 20    # smoke test: seconds of CPU time
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from train_step_contenders import first_plain_id, sesame_model  # noqa: E402
from train_step_core import BenchConfig, Variant, bench_config, generators, make_step  # noqa: E402

from sesame.train import TrainConfig  # noqa: E402
from sesame.train.trainer import loss_counts  # noqa: E402

SUCCESSOR_P = torch.tensor([0.55, 0.25, 0.15, 0.05])  # a token's four successors, most likely first


def markov_windows(successors: torch.Tensor, low: int, n: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` windows of ``length`` ids of the chain: ids from ``low``, ``successors[t - low]`` the successors of t."""
    windows = torch.empty(n, length, dtype=torch.long)
    windows[:, 0] = torch.randint(low, low + len(successors), (n,), generator=generator)
    choices = torch.multinomial(SUCCESSOR_P, n * length, replacement=True, generator=generator).view(n, length)
    for t in range(1, length):
        windows[:, t] = successors[windows[:, t - 1] - low, choices[:, t]]
    return windows


def make_batches(model: nn.Module, cfg: BenchConfig, successors: torch.Tensor, low: int, count: int,
                 seed: int) -> list[dict]:
    """``count`` batches of chain windows, made (masked, for the MLM) by the objective's own ``make_batch``."""
    data = torch.Generator().manual_seed(seed)
    length = model.window_length(cfg.seq_len)
    return [model.make_batch(markov_windows(successors, low, cfg.batch, length, data),
                             generators(cfg.batch, seed + i * cfg.batch)) for i in range(count)]


def train(model: nn.Module, precision: str, dropout_seed: int, batches: list[dict], lr: float) -> None:
    """One training step per batch in ``precision`` (a fresh AdamW), dropout drawn from ``dropout_seed``."""
    queue = iter(batches)

    def loss() -> torch.Tensor:
        batch = next(queue)
        return model(batch).float() / loss_counts(batch)["loss"]

    step = make_step(model, loss, Variant(precision).placement(), lr=lr)
    torch.manual_seed(dropout_seed)
    for _ in batches:
        step()


@torch.no_grad()
def valid_loss(model: nn.Module, precision: str, batches: list[dict]) -> float:
    """The mean loss per target over ``batches``, in eval mode, under ``precision``'s autocast."""
    model.eval()
    with Variant(precision).placement().autocast():
        total = sum(float(model(batch).float()) for batch in batches)
    model.train()
    return total / sum(loss_counts(batch)["loss"] for batch in batches)  # MLM: masked positions, not padding


def loss_check(step: str, cfg: BenchConfig, args: argparse.Namespace) -> dict:
    """Train fp32, bf16 and fp32 with another dropout seed from one start; the JSON line of their valid losses."""
    torch.manual_seed(args.seed)
    model = sesame_model(step, cfg)
    start = {name: value.clone() for name, value in model.state_dict().items()}
    low = first_plain_id(step)
    successors = torch.randint(low, cfg.vocab_size, (cfg.vocab_size - low, len(SUCCESSOR_P)),
                               generator=torch.Generator().manual_seed(args.seed))
    train_batches = make_batches(model, cfg, successors, low, args.steps, args.seed)
    valid_batches = make_batches(model, cfg, successors, low, args.valid_batches, args.seed + 1_000_000)
    lr = TrainConfig().lr
    initial = valid_loss(model, "fp32", valid_batches)
    losses = {}
    for name, precision, dropout_seed in (("fp32", "fp32", args.seed), ("bf16", "bf16", args.seed),
                                          ("fp32-reseeded", "fp32", args.seed + 1)):
        model.load_state_dict(start)
        train(model, precision, dropout_seed, train_batches, lr)
        losses[name] = valid_loss(model, precision, valid_batches)
    noise, difference = abs(losses["fp32-reseeded"] - losses["fp32"]), losses["bf16"] - losses["fp32"]
    result = {
        "bench": f"{step}-loss-check",
        "config": {**asdict(cfg), "steps": args.steps, "valid_batches": args.valid_batches, "lr": lr,
                   "threads": args.threads, "seed": args.seed},
        "initial_valid_loss": initial,
        "valid_loss": losses,
        "noise": noise,
        "difference": difference,
        "within_noise": abs(difference) <= noise,
    }
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps of each run")
    parser.add_argument("--valid-batches", type=int, default=8, help="held-out batches the valid loss averages")
    parser.add_argument("--which", choices=["mlm", "clm", "all"], default="all")
    parser.add_argument("--size", choices=["mini", "tiny"], default="mini",
                        help="mini: the benchmark's models; tiny: a smoke test in seconds")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.valid_batches < 1:
        parser.error("--steps and --valid-batches must be at least 1")
    torch.set_num_threads(args.threads)
    for step in ("mlm", "clm") if args.which == "all" else (args.which,):
        loss_check(step, bench_config(step, args.size), args)


if __name__ == "__main__":
    main()
