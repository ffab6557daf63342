"""Where sesame's training step spends its time in fp32 and in bf16: matrix products against everything else.

Issue 18 asks that the bf16 step's speed-up over sesame's own fp32 step reach 80% of the machine's bf16/fp32
``torch.mm`` peak ratio. Amdahl's law bounds that speed-up by what the products are of the step: if they take a
share f of the fp32 step and become ``peak_ratio`` times faster, while the rest keeps its time, the step gains at
most 1 / ((1 - f) + f / peak_ratio). This script measures f, with ``torch.profiler`` over ``--steps`` steps of each
of ``pure_bf16.py``'s fp32 and bf16-autocast contenders (the same models, batch and AdamW as ``train_step.py``),
summing each operator's own time: products are ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm`` and the fused
attention kernels (forward and backward); the rest is elementwise work, norms, casts, dropout, the optimizer and
the framework. One JSON line per step: the time of each part in each precision (ms per step), the share of
products in fp32, the Amdahl bound and its share of the peak ratio, and the measured speed-up (under the
profiler, which adds a little time to every operator call, so it reads lower than ``train_step.py``'s).

    python benchmarks/step_profile.py              # both steps, mini size: about 2 minutes
    python benchmarks/step_profile.py --size tiny  # a smoke test
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from pure_bf16 import contenders  # noqa: E402
from train_step_core import bench_config  # noqa: E402
from train_step_timing import matmul_peak  # noqa: E402

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION = "scaled_dot_product"  # the fused attention kernels' names contain it (forward and backward)
VARIANTS = {"fp32": "fp32", "bf16": "bf16-autocast"}


def is_product(name: str) -> bool:
    return name in PRODUCTS or ATTENTION in name


def split_time(step, steps: int) -> dict[str, float]:
    """Milliseconds per step in products and in everything else, from each operator's own (self) time."""
    step()  # warm-up: allocations, autocast's weight casts
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    parts = {"products": 0.0, "other": 0.0}
    for event in prof.key_averages():
        parts["products" if is_product(event.key) else "other"] += event.self_cpu_time_total / 1000 / steps
    return parts


def run(step: str, size: str, steps: int, seed: int, peak_ratio: float) -> dict:
    cfg = bench_config(step, size)
    contender = contenders(step, cfg, seed)
    times = {precision: split_time(contender[name].step, steps) for precision, name in VARIANTS.items()}
    fp32, bf16 = times["fp32"], times["bf16"]
    total32, total16 = sum(fp32.values()), sum(bf16.values())
    share = fp32["products"] / total32
    bound = 1 / ((1 - share) + share / peak_ratio)
    return {"bench": f"{step}-profile", "model": cfg.model, "steps": steps,
            "ms_per_step": {p: {k: significant(v) for k, v in t.items()} for p, t in times.items()},
            "fp32_product_share": significant(share), "peak_ratio": significant(peak_ratio),
            "amdahl_bound": significant(bound), "bound_share_of_peak_ratio": significant(bound / peak_ratio),
            "speedup_profiled": significant(total32 / total16),
            "products_speedup": significant(fp32["products"] / bf16["products"]),
            "other_speedup": significant(fp32["other"] / bf16["other"])}


def significant(value: float, digits: int = 3) -> float:
    """``value`` to ``digits`` significant digits: a CPU without native bf16 multiplies bf16 hundreds of times slower
    than fp32, and a ratio rounded to 2 decimals read 0.0 there."""
    return float(f"{value:.{digits}g}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--which", nargs="+", default=["mlm", "clm"], choices=["mlm", "clm"])
    parser.add_argument("--size", default="mini", choices=["mini", "tiny"])
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per precision (after one warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.exit(2, f"error: --steps {args.steps}: at least 1\n")
    torch.set_num_threads(args.threads)
    peak_ratio = matmul_peak(dtype=torch.bfloat16) / matmul_peak()
    for step in args.which:
        print(json.dumps(run(step, args.size, args.steps, args.seed, peak_ratio)), flush=True)


if __name__ == "__main__":
    main()
