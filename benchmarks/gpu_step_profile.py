"""Where sesame's and transformers' training steps spend their time on a GPU: wall time per step against the GPU's
busy time (their difference is launch and framework overhead on the CPU), kernels launched per step, and the
operators with the most GPU time, for ``benchmarks/train_step.py``'s contenders (same models, batch, AdamW).

A step whose wall time far exceeds its GPU time is bound by launches, not arithmetic: then fewer, larger kernels
help and a faster precision does not (docs/results/speed.md, "On an NVIDIA H100"). torch.profiler adds time to every
operator call, so the wall times here read higher than train_step.py's.

    python benchmarks/gpu_step_profile.py                          # mini MLM and causal steps, fp32 and bf16
    python benchmarks/gpu_step_profile.py --which clm --size base --precision bf16
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from train_step_contenders import clm_contenders, mlm_contenders  # noqa: E402
from train_step_core import SIZES, Variant, bench_config  # noqa: E402

CONTENDERS = {"mlm": mlm_contenders, "clm": clm_contenders}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--which", nargs="+", default=["clm", "mlm"], choices=sorted(CONTENDERS))
    parser.add_argument("--size", default="mini", choices=SIZES)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after three warm-up steps)")
    parser.add_argument("--rows", type=int, default=8, help="operators listed per contender")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.exit(2, "gpu_step_profile: no CUDA GPU here: torch.cuda.is_available() is false\n")
    device = torch.device("cuda")
    for which in args.which:
        for precision in args.precision:
            for c in CONTENDERS[which](bench_config(which, args.size), 0, Variant(precision, device=device)):
                for _ in range(3):
                    c.step()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        c.step()
                    torch.cuda.synchronize()
                    wall = (time.perf_counter() - start) / args.steps
                events = prof.key_averages()
                busy = sum(e.self_device_time_total for e in events) / args.steps / 1000
                kernels = sum(e.count for e in events if e.device_type.name == "CUDA") / args.steps
                print(f"## {which} {args.size} {precision} {c.name}: wall {wall * 1000:.1f} ms/step, GPU busy "
                      f"{busy:.1f} ms/step, {kernels:.0f} kernels/step", flush=True)
                print(events.table(sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=60),
                      flush=True)
                del c


if __name__ == "__main__":
    main()
