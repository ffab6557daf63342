"""How ``benchmarks/train_step.py`` times its contenders: the matmul peak MFU is measured against, the rounds of
steps and the peak step memory on CUDA (:func:`measure`), compiled contenders primed first (:func:`prime`), and how
busy the rest of the machine was meanwhile (:func:`cpu_clock`, :func:`others_share`), which the other benchmarks
read too.

All contenders of one comparison (two per variant) alternate in one process: each round runs
``--steps`` steps of each (the order flips every round), the first round is a discarded warm-up, and
the reported throughput is the median over the other rounds. A compiled contender first takes 3 untimed steps
(sesame's model compiles on its first two calls: the guard on its loss's reused buffer fails once the buffer
exists), which also count the graph breaks torch.compile met, by reason. On CUDA the clock is read only after
``torch.cuda.synchronize``.

Each result records the share of the machine's CPUs that other processes used while it ran. On a
shared machine they slow both sides, and multi-threaded operators most (each waits for a descheduled
thread), which compresses the ratio; compare ratios from the same run only.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from sesame.runtime import native_bf16_cpu

sys.path.insert(0, str(Path(__file__).parent))
from train_step_core import Contender  # noqa: E402

PRIMING_STEPS = 3  # untimed steps of a compiled contender: sesame's model compiles on its first two calls
# the matmul peak's square products: a CPU's from cache-sized to memory-bound, an accelerator's large enough to keep
# every unit busy (an H200 read 677-743 bf16 TFLOP/s at 4096)
PEAK_SIZES = {"cpu": (512, 1024, 2048), "accelerator": (4096, 8192)}
PEAK_REPEATS, PEAK_SECONDS = 3, 0.3  # timed products of each size, at least so many and for at least so long
# a larger size is not timed when one product would take longer than this at the best rate so far: only an emulated
# dtype is that slow, and there larger products read lower, not higher (bfloat16 on one AVX2 core without AVX512-BF16
# or AMX: 1.1 GFLOP/s at 512, 0.3 at 2048, a minute a product)
PEAK_PRODUCT_SECONDS = 4.0


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CUDA GPU runs it asynchronously), before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(*, dtype: torch.dtype = torch.float32, device: torch.device = torch.device("cpu"),
                seconds: float = PEAK_SECONDS) -> float:
    """Best ``torch.mm`` rate on ``device`` for ``dtype`` matrices, in FLOP/s: the fastest single product of square
    matrices of each size of :data:`PEAK_SIZES` (a device's own, whatever the model's size), each size repeated
    :data:`PEAK_REPEATS` times and for ``seconds`` at least after a warm-up product. A product too small to fill the
    machine misreads it (a 256 x 256 one read 4 GFLOP/s in one run and 101 in another on two loaded cores,
    docs/results/speed.md), and the best of many repeats skips those a descheduled thread slowed. The sweep stops
    before a size whose one product would take over :data:`PEAK_PRODUCT_SECONDS` at the best rate so far."""
    best = 0.0
    for n in PEAK_SIZES["cpu" if device.type == "cpu" else "accelerator"]:
        if best and 2 * n ** 3 / best > PEAK_PRODUCT_SECONDS:
            break
        a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
        out = torch.empty(n, n, dtype=dtype, device=device)
        torch.mm(a, b, out=out)
        fastest, spent, repeats = float("inf"), 0.0, 0
        while repeats < PEAK_REPEATS or spent < seconds:
            synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            synchronize(device)
            took = time.perf_counter() - start
            fastest, spent, repeats = min(fastest, took), spent + took, repeats + 1
        best = max(best, 2 * n ** 3 / fastest)
    return best


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 natively: a CPU with AVX512-BF16 or AMX, a GPU that supports it."""
    return torch.cuda.is_bf16_supported() if device.type == "cuda" else native_bf16_cpu()


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux ``/proc/stat``), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_clock() -> tuple[float, float | None, float]:
    """Now, as :func:`others_share` reads it: (wall seconds, the machine's busy CPU seconds, this process's)."""
    return time.perf_counter(), machine_busy_seconds(), own_cpu_seconds()


def others_share(start: tuple[float, float | None, float]) -> float | None:
    """The share of the machine's CPUs other processes used since ``start`` (:func:`cpu_clock`), None where the
    machine's busy time is unknown."""
    wall, busy, own = start
    if busy is None:
        return None
    others = machine_busy_seconds() - busy - (own_cpu_seconds() - own)
    return max(0.0, others / ((time.perf_counter() - wall) * os.cpu_count()))


def prime(contender: Contender) -> None:
    """Untimed steps of a compiled contender, so that compiling stays out of every round (sesame's model compiles
    twice: the guard on its loss's reused buffer fails on the second call, once the buffer exists); records the
    graph breaks torch.compile met meanwhile (torch._dynamo's counters), reason: count."""
    before = Counter(counters["graph_break"])
    for _ in range(PRIMING_STEPS):
        contender.step()
    breaks = Counter(counters["graph_break"]) - before
    contender.graph_breaks = {reason.strip().splitlines()[0][:160]: n for reason, n in breaks.items()}


def measure(contenders: list[Contender], rounds: int, steps: int, warmup: int
            ) -> tuple[dict[str, list[float]], dict[str, float | None]]:
    """Seconds per step of each contender in every round after the first ``warmup`` rounds (compiled ones
    primed first; a GPU's queue drained before each clock reading), and on CUDA each one's peak step memory in
    MiB over those rounds: ``torch.cuda.max_memory_allocated`` above what was allocated when its steps began
    (activations, gradients and temporaries; every contender's weights and AdamW state, resident throughout, left
    out: both sides train the same number of parameters), None on a CPU."""
    for c in contenders:
        if c.variant.compile:
            prime(c)
    times: dict[str, list[float]] = {c.key: [] for c in contenders}
    peaks: dict[str, float | None] = {c.key: None for c in contenders}
    for r in range(rounds):
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            device = c.variant.device
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                resident = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            for _ in range(steps):
                c.step()
            synchronize(device)
            if r >= warmup:
                times[c.key].append((time.perf_counter() - start) / steps)
                if device.type == "cuda":
                    peak = (torch.cuda.max_memory_allocated(device) - resident) / 2 ** 20
                    peaks[c.key] = max(peaks[c.key] or 0.0, peak)
    return times, peaks
