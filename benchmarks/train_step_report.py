"""What ``benchmarks/train_step.py`` reports of one comparison (:func:`compare`): tokens/s, ratios, MFU and peak
memory per variant, as JSON lines and a human-readable summary.

Output: one JSON line per variant, ``bench`` naming the step and variant (``mlm-fp32``, ``mlm-bf16``,
``clm-bf16-compile``, ``t5-fp32``, ``bart-bf16``, ``xlnet-fp32``), ``ratio`` = sesame's tokens/s over
transformers' (the encoder-decoders' tokens are the encoder's batch x 128 positions, XLNet's every segment's batch x
128); then, when fp32 is among the
precisions, one line per other variant with sesame's own speed-up over its fp32 step (``bench``
``mlm-bf16-vs-fp32``, ``ratio``, ``peak_ratio`` = that precision's matmul peak over fp32's, measured in
the same run, ``share_of_peak_ratio`` = ratio / peak_ratio, ``transformers_ratio`` the same speed-up
for transformers, ``native_bf16`` whether this CPU has AVX512-BF16 or AMX). A CPU without native
bfloat16 computes bf16 matrix products by conversion, slower than fp32: its ``peak_ratio`` is below 1
and the bf16 lines report that slowdown as measured. There the bf16 "peak" (square products up to 2048) is the
conversion path's speed, not a ceiling: a tiny model's smaller products can beat it, and its bf16 MFU pass 1
(one row read 1.06 at ``--size tiny`` on a 2-core AMD EPYC without AVX-512, 2026-11-29; a rerun's highest, BART's,
0.79). Whether bf16 trains as well as fp32 is ``benchmarks/precision_loss.py``'s question. On CUDA each JSON line
adds each side's peak step memory (``{side}_peak_step_memory_mib``: ``torch.cuda.max_memory_allocated`` during
its timed steps above what was allocated when they began, i.e. activations, gradients and temporaries; the
weights and AdamW state, equal on both sides, are left out; null on a CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from train_step_core import BenchConfig, Contender  # noqa: E402
from train_step_timing import cpu_clock, measure, native_bf16, others_share  # noqa: E402


def compare(step: str, cfg: BenchConfig, contenders: list[Contender], peaks: dict[str, float],
            args: argparse.Namespace) -> list[dict]:
    """Time every contender (all variants alternating in one loop), print the human-readable summary (unless
    ``--json-only``), a JSON line per variant (sesame against transformers) and one per variant but fp32
    (sesame's speed-up over its own fp32 step)."""
    start = cpu_clock()
    times, memory = measure(contenders, args.rounds, args.steps, args.warmup)
    others = others_share(start)  # share of the machine's CPUs that other processes used meanwhile
    seconds = {key: statistics.median(ts) for key, ts in times.items()}
    pairs = [(contenders[i], contenders[i + 1]) for i in range(0, len(contenders), 2)]  # (sesame, transformers)
    results = []
    for ours, theirs in pairs:
        variant, peak = ours.variant, peaks[ours.variant.precision]
        results.append({
            "bench": f"{step}-{variant.name}",
            "config": {**asdict(cfg), "params": sum(p.numel() for p in ours.model.parameters()),
                       "precision": variant.precision, "compile": variant.compile, "optimizer": "AdamW",
                       "threads": args.threads, "rounds": args.rounds, "warmup_rounds": args.warmup,
                       "steps_per_round": args.steps, "device": str(variant.device)},
            "sesame_tokens_per_s": cfg.tokens / seconds[ours.key],
            "transformers_tokens_per_s": cfg.tokens / seconds[theirs.key],
            "ratio": seconds[theirs.key] / seconds[ours.key],
            "sesame_mfu": ours.flops / seconds[ours.key] / peak,
            "transformers_mfu": theirs.flops / seconds[theirs.key] / peak,
            "sesame_gflop_per_step": ours.flops / 1e9,
            "transformers_gflop_per_step": theirs.flops / 1e9,
            "peak_gflop_per_s": peak / 1e9,
            "sesame_compiled": ours.compiled,
            "transformers_compiled": theirs.compiled,
            "sesame_peak_step_memory_mib": memory[ours.key],
            "transformers_peak_step_memory_mib": memory[theirs.key],
            "sesame_graph_breaks": ours.graph_breaks,
            "transformers_graph_breaks": theirs.graph_breaks,
            "sesame_s_per_step_by_round": times[ours.key],
            "transformers_s_per_step_by_round": times[theirs.key],
            "other_processes_cpu_share": others,
        })
    results += speedups(step, pairs, seconds, peaks, others)
    if not args.json_only:
        print_summary(step, cfg, contenders, results, seconds, peaks, others, memory)
    for r in results:
        print(json.dumps(r), flush=True)
    return results


def speedups(step: str, pairs: list[tuple[Contender, Contender]], seconds: dict[str, float],
             peaks: dict[str, float], others: float | None) -> list[dict]:
    """Each variant's speed-up over the fp32 step, against the matmul peak ratio of its precision (none
    without an fp32 variant)."""
    base = next((pair for pair in pairs if pair[0].variant.name == "fp32"), None)
    lines = []
    for ours, theirs in pairs if base else []:
        if ours is base[0]:
            continue
        ratio = seconds[base[0].key] / seconds[ours.key]
        peak_ratio = peaks[ours.variant.precision] / peaks["fp32"]
        lines.append({
            "bench": f"{step}-{ours.variant.name}-vs-fp32",
            "ratio": ratio,
            "peak_ratio": peak_ratio,
            "share_of_peak_ratio": ratio / peak_ratio,
            "transformers_ratio": seconds[base[1].key] / seconds[theirs.key],
            "native_bf16": native_bf16(ours.variant.device),
            "other_processes_cpu_share": others,
        })
    return lines


def print_summary(step: str, cfg: BenchConfig, contenders: list[Contender], results: list[dict],
                  seconds: dict[str, float], peaks: dict[str, float], others: float | None,
                  memory: dict[str, float | None]) -> None:
    segments = f" x {cfg.segments} segments" if cfg.segments > 1 else ""
    print(f"{step}: {cfg.model}, batch {cfg.batch} x {cfg.seq_len}{segments}, vocabulary {cfg.vocab_size}, "
          f"{results[0]['config']['params'] / 1e6:.1f}M parameters")
    for c in contenders:
        s, peak = seconds[c.key], peaks[c.variant.precision]
        compiled = "" if not c.variant.compile else "  compile failed: eager" if not c.compiled else \
            f"  {sum(c.graph_breaks.values())} graph breaks"
        held = "" if memory[c.key] is None else f"  peak step memory {memory[c.key]:.0f} MiB"
        print(f"  {c.key:<26} {cfg.tokens / s:>7.0f} tokens/s  {s * 1e3:>7.0f} ms/step"
              f"  MFU {c.flops / s / peak:6.1%}  ({c.flops / 1e9:.1f} GFLOP/step){held}{compiled}")
    for r in results:
        against = f"over sesame fp32 (peak ratio {r['peak_ratio']:.2f})" if "peak_ratio" in r else "sesame/transformers"
        print(f"  {r['bench']}: {against} {r['ratio']:.2f}x")
    if others is not None and others > 0.1:
        print(f"  contended: other processes used {others:.0%} of the {os.cpu_count()} CPUs meanwhile")
