"""Pure bfloat16 training with float32 master weights against sesame's bf16 autocast and fp32, on this CPU.

Issue 18 asks whether pure-bf16 weights with fp32 master weights beat autocast here. The BERT-mini masked LM and
the GPT-2-mini causal LM of ``benchmarks/train_step.py`` (sesame's models only, its shapes, batch and AdamW: lr
1e-4, weight decay 0.01 on matrices, fused), one full training step on the same batch in three variants, all
started from the same weights:

* ``fp32``: weights, activations and AdamW in float32 (``Placement(precision="fp32")``).
* ``bf16-autocast``: what ``--precision bf16`` does (``sesame.runtime.Placement.autocast``): the forward pass under
  ``torch.autocast("cpu", torch.bfloat16)``, weights, gradients and AdamW in float32.
* ``bf16-pure``: a bfloat16 copy of the model (weights, activations and gradients in bfloat16, no autocast); the
  optimizer keeps float32 master weights: each step copies the gradients into the masters' ``.grad`` in float32,
  AdamW steps the masters in float32 and the masters are copied back, rounded, into the bfloat16 weights
  (:class:`PureBf16`; the copies are part of the timed step).

The vocabulary projection fused with its cross-entropy (``sesame.objectives.projection``) multiplies in bfloat16
only under bf16 autocast (softmax, loss and gradient sums in float32); ``fp32`` and ``bf16-pure`` (no autocast:
it upcasts the bfloat16 inputs) compute it wholly in float32. So ``bf16-pure`` differs from ``bf16-autocast`` in
the blocks (embeddings, attention, feed-forward, LayerNorm, dropout) and also in a float32 projection.

The contenders alternate in one process as in train_step.py: each round runs ``--steps`` steps of each (the
order flips every round), the first ``--warmup`` rounds are discarded, and throughput is the median over the
others, in input tokens (batch x sequence length) per second. One JSON line per step and variant (``bench``:
``mlm-fp32``, ``mlm-bf16-autocast``, ``mlm-bf16-pure``, then ``clm-...``) with ``tokens_per_s``, ``mfu`` (model
FLOPs over the matmul peak of the variant's type, counted as train_step.py counts them), ``vs_fp32`` and
``vs_bf16_autocast`` (that variant's speed-up over each), ``peak_ratio`` (the bf16/fp32 ``torch.mm`` peak
ratio measured in the same run) and ``native_bf16`` (whether the CPU has AVX512-BF16 or AMX); pure bf16 beats
autocast where its ``vs_bf16_autocast`` is above 1. Whether a precision trains as well as fp32 is
``benchmarks/precision_loss.py``'s question (it has no pure-bf16 variant).

Duration, estimated, not timed at the mini size: a tiny run (``--size tiny --rounds 2``) takes 8 s of one core,
nearly all of it importing transformers (train_step.py imports it); the mini steps take, on the two cores of a
quiet machine without native bfloat16, about 0.6 s (MLM) and 1.8 s (causal) in fp32 and 1.7 s and 6 s in bf16
autocast (train_step.py's docstring), pure bf16 taken as autocast's. So 7 rounds of the three variants: about
30 s for the MLM step and 1.6 minutes for the causal one, 2-3 minutes in all; less on a CPU with native bfloat16.

    python benchmarks/pure_bf16.py                    # both steps, 7 rounds: about 2-3 minutes
    python benchmarks/pure_bf16.py --which mlm --rounds 9 --json-only
    python benchmarks/pure_bf16.py --size tiny --rounds 1 --warmup 0 --threads 1    # smoke test: seconds
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from train_step_contenders import first_plain_id, sesame_model  # noqa: E402
from train_step_core import (LR, WEIGHT_DECAY, BenchConfig, Contender, Variant, bench_config,  # noqa: E402
                             generators, make_step)
from train_step_timing import cpu_clock, matmul_peak, measure, others_share  # noqa: E402

from sesame.runtime import native_bf16_cpu  # noqa: E402
from sesame.train.optim import adamw  # noqa: E402
from sesame.train.trainer import loss_counts  # noqa: E402

VARIANTS = ("fp32", "bf16-autocast", "bf16-pure")


class PureBf16:
    """Training steps of a bfloat16 copy of ``master`` with ``master``'s float32 weights as the optimizer's:
    ``loss(model)`` is computed by the bfloat16 model, its gradients are copied into the masters' ``.grad`` in
    float32, AdamW steps the masters, and the masters are copied back, rounded, into the bfloat16 weights."""

    def __init__(self, master: nn.Module, loss: Callable[[nn.Module], torch.Tensor], lr: float = LR) -> None:
        self.master = master
        self.model = copy.deepcopy(master).to(torch.bfloat16)  # tied weights stay tied: one parameter each
        self.pairs = list(zip(self.model.parameters(), master.parameters()))
        self.optimizer = adamw(master, lr=lr, weight_decay=WEIGHT_DECAY)
        self.loss = loss

    def step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.loss(self.model).float().backward()
        for low, high in self.pairs:
            high.grad = None if low.grad is None else low.grad.float()
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_([low for low, _ in self.pairs], [high for _, high in self.pairs])


def model_flops(step: str, cfg: BenchConfig, n_targets: int) -> float:
    """One training step's model FLOPs, as train_step.py counts sesame's: the blocks, then the head at the MLM's
    selected positions or the causal LM's every position."""
    h, v = cfg.hidden, cfg.vocab_size
    if step == "mlm":
        return cfg.block_flops() + 6 * (h * h + h * v) * n_targets
    return cfg.block_flops() + 6 * h * v * cfg.tokens


def contenders(step: str, cfg: BenchConfig, seed: int) -> dict[str, Contender]:
    """Each variant's contender (by name in :data:`VARIANTS`), every one a copy of one model on one batch."""
    torch.manual_seed(seed)
    base = sesame_model(step, cfg)
    windows = torch.randint(first_plain_id(step), cfg.vocab_size, (cfg.batch, base.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = base.make_batch(windows, generators(cfg.batch, seed))
    n_targets = loss_counts(batch)["loss"]  # MLM: the masked positions, without the padding
    flops = model_flops(step, cfg, n_targets)

    def loss(model: nn.Module) -> torch.Tensor:
        return model(batch).float() / n_targets

    def autocast(precision: str) -> Contender:
        model, variant = copy.deepcopy(base), Variant(precision)
        return Contender("autocast", variant, model, model, lambda: loss(model),
                         make_step(model, lambda: loss(model), variant.placement()), flops)

    pure = PureBf16(copy.deepcopy(base), loss)
    return {"fp32": autocast("fp32"), "bf16-autocast": autocast("bf16"),
            "bf16-pure": Contender("pure", Variant("bf16"), pure.model, pure.model, lambda: loss(pure.model), pure.step,
                                   flops)}


def run(step: str, cfg: BenchConfig, peaks: dict[str, float], args: argparse.Namespace) -> list[dict]:
    """Time the three variants of ``step`` alternating in one loop; one result per variant."""
    named = contenders(step, cfg, args.seed)
    start = cpu_clock()
    times, _ = measure(list(named.values()), args.rounds, args.steps, args.warmup)  # (no peak memory on a CPU)
    others = others_share(start)  # share of the machine's CPUs that other processes used meanwhile
    seconds = {name: statistics.median(times[c.key]) for name, c in named.items()}
    config = {**asdict(cfg), "params": sum(p.numel() for p in named["fp32"].model.parameters()), "optimizer": "AdamW",
              "threads": args.threads, "rounds": args.rounds, "warmup_rounds": args.warmup,
              "steps_per_round": args.steps}
    return [{
        "bench": f"{step}-{name}",
        "config": {**config, "precision": c.variant.precision},
        "tokens_per_s": cfg.tokens / seconds[name],
        "s_per_step_by_round": times[c.key],
        "mfu": c.flops / seconds[name] / peaks[c.variant.precision],
        "vs_fp32": seconds["fp32"] / seconds[name],
        "vs_bf16_autocast": seconds["bf16-autocast"] / seconds[name],
        "peak_ratio": peaks["bf16"] / peaks["fp32"],
        "native_bf16": native_bf16_cpu(),
        "other_processes_cpu_share": others,
    } for name, c in named.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per step, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="leading rounds left out of the medians")
    parser.add_argument("--steps", type=int, default=1, help="training steps per variant per round")
    parser.add_argument("--which", choices=["mlm", "clm", "all"], default="all")
    parser.add_argument("--size", choices=["mini", "tiny"], default="mini",
                        help="mini: the benchmark; tiny: a smoke test in seconds (its numbers mean nothing)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (1 is steadier on a busy "
                                                               "machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-only", action="store_true", help="print only the JSON lines")
    args = parser.parse_args(argv)
    if args.rounds <= args.warmup:
        parser.error("--rounds must exceed --warmup")
    torch.set_num_threads(args.threads)
    peaks = {p: matmul_peak(dtype=dtype) for p, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    if not args.json_only:
        print(f"matmul peak: fp32 {peaks['fp32'] / 1e9:.0f}, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s with "
              f"{args.threads} torch thread(s); native bf16: {native_bf16_cpu()}")
    for step in ("mlm", "clm") if args.which == "all" else (args.which,):
        for result in run(step, bench_config(step, args.size), peaks, args):
            if not args.json_only:
                print(f"  {result['bench']:<20} {result['tokens_per_s']:>7.0f} tokens/s  MFU {result['mfu']:6.1%}  "
                      f"x{result['vs_fp32']:.2f} of fp32, x{result['vs_bf16_autocast']:.2f} of bf16 autocast")
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
