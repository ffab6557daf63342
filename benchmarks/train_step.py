"""Training-step throughput of sesame against Hugging Face transformers on the same config, batch and precision.

Five comparisons (``--which``: mlm and clm by default; all: every one), each one full training step (forward,
backward, AdamW step) on one batch, sesame's model and transformers' of the same configuration:

* ``mlm``: BERT-mini's masked LM against ``BertForMaskedLM``;
* ``clm``: a GPT-2-style causal LM of the same size against ``GPT2LMHeadModel``;
* ``t5``: T5's span corruption against ``T5ForConditionalGeneration``;
* ``bart``: BART's denoising against ``BartForConditionalGeneration``;
* ``xlnet``: XLNet's permutation LM, two segments with memory, against ``XLNetLMHeadModel`` (``train_step_xlnet.py``).

The script is in parts: what is measured, the steps and their contenders (``train_step_contenders.py``, XLNet's in
``train_step_xlnet.py``); what a comparison is made of, its shapes, variants (precision, torch.compile, device), the
training step both sides take and the FLOP count MFU reads (``train_step_core.py``); how it is timed, the matmul
peak, the rounds, peak memory and the busy-machine check (``train_step_timing.py``); and what is reported
(``train_step_report.py``: the JSON lines and the summary). This file is the command line.

Devices. ``--device cpu`` (the default) or ``cuda``/``cuda:N``: both sides' models, batches and the matmul peak on that
device (it must run every ``--precision``, as sesame's flags require); on CUDA the JSON lines add each side's peak
step memory, and ``native_bf16`` is the GPU's bfloat16 support.

Durations on the two cores of a quiet machine: fp32 from docs/results/speed.md; bf16 and compile estimated, not
yet timed there (bf16 from the fp32 step times, their MFU and a bf16/fp32 matmul peak ratio of about 0.2, as
measured on this CPU without native bfloat16: about 1.7 s and 6 s per MLM step for sesame and transformers,
6 s and 8 s per causal step; compile adds a few minutes of compiling, while priming, per model):

    python benchmarks/train_step.py                       # fp32 and bf16, mlm and clm: about 5-8 minutes
    python benchmarks/train_step.py --compile bf16        # and bf16 + compile: about 10-20 minutes
    python benchmarks/train_step.py --precision fp32      # the fp32 comparison alone: about 2-5 minutes
    python benchmarks/train_step.py --which clm --rounds 4 --steps 2 --json-only
    python benchmarks/train_step.py --which t5 bart       # the encoder-decoders, fp32 and bf16 (not yet timed)
    python benchmarks/train_step.py --which xlnet         # the permutation LM, fp32 and bf16 (not yet timed)
    python benchmarks/train_step.py --which all           # all five steps
    python benchmarks/train_step.py --size tiny --rounds 2 --threads 1    # smoke test: seconds of CPU time
    python benchmarks/train_step.py --device cuda --precision fp32 bf16   # on a GPU (scripts/gpu_check.sh)
    python benchmarks/train_step.py --device cuda --size base --which all  # base size: mini leaves a GPU idle

The encoder-decoder and XLNet steps have not been timed here. By the FLOP count (``train_step_core.py``; a pencil
estimate, not a measurement) a t5 step is about 0.4x the causal step's work (its decoder reads some 30 targets a row:
~170 GFLOP against ~400), a bart step about 1.25x (~500 GFLOP, two thirds of it the 50265-token projection of 128
targets a row) and an xlnet step about 0.75x for sesame (~300 GFLOP: two segments of 128 tokens, the second after 126
of memory) and 0.9x for transformers (~360), so with the causal step's times ``--which t5 bart`` and ``--which
xlnet`` should take minutes, like the default's mlm and clm.
"""
from __future__ import annotations

import argparse
import re
import sys
from functools import partial
from pathlib import Path

import torch
import transformers

from sesame.errors import SesameError
from sesame.runtime import DTYPES, check_precision, resolve_device

sys.path.insert(0, str(Path(__file__).parent))
from train_step_contenders import clm_contenders, mlm_contenders, seq2seq_contenders  # noqa: E402
from train_step_core import PRECISIONS, Variant, bench_config  # noqa: E402
from train_step_report import compare  # noqa: E402
from train_step_timing import matmul_peak, native_bf16  # noqa: E402
from train_step_xlnet import xlnet_contenders  # noqa: E402

CONTENDERS = {"mlm": mlm_contenders, "clm": clm_contenders, "t5": partial(seq2seq_contenders, "t5"),
              "bart": partial(seq2seq_contenders, "bart"), "xlnet": xlnet_contenders}
DEFAULT_STEPS = ("mlm", "clm")  # the steps of the commands docs/results/speed.md records, which the default still runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per comparison, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="leading rounds left out of the medians")
    parser.add_argument("--steps", type=int, default=1, help="training steps per implementation per round")
    parser.add_argument("--which", nargs="+", choices=[*CONTENDERS, "all"], default=list(DEFAULT_STEPS),
                        help=f"the steps to compare (default {' '.join(DEFAULT_STEPS)}, as docs/results/speed.md's commands "
                             "ran; all: every one)")
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                        help="autocast precisions to run, on both sides (fp32 also gives the X-vs-fp32 lines)")
    parser.add_argument("--compile", nargs="+", choices=PRECISIONS, default=[], metavar="PRECISION",
                        help="precisions (of --precision) to run once more under torch.compile, on both sides")
    parser.add_argument("--size", choices=["mini", "tiny", "base"], default="mini",
                        help="mini: the benchmark; tiny: a smoke test in seconds (its numbers mean nothing); base: "
                             "hidden 768 and 12 layers, for a GPU (minutes per round on a CPU)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch intra-op threads (2 as specified; 1 is steadier on a busy machine)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (the default), cuda or cuda:N: where both sides run (as sesame's --device)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-only", action="store_true", help="print only the JSON lines")
    args = parser.parse_args(argv)
    if args.rounds <= args.warmup:
        parser.error("--rounds must exceed --warmup")
    if not set(args.compile) <= set(args.precision):
        parser.error(f"--compile {' '.join(args.compile)}: compile only precisions of --precision "
                     f"({' '.join(args.precision)})")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device}: choose cpu, cuda or cuda:N")
    try:  # the device must exist and run every precision asked for, as sesame's --device and --precision
        device = resolve_device(args.device)
        for precision in args.precision:
            check_precision(device, precision)
    except SesameError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    precisions = list(dict.fromkeys(["fp32", *args.precision]))  # fp32's peak is the peak ratio's reference
    peaks = {p: matmul_peak(dtype=DTYPES.get(p, torch.float32), device=device)
             for p in precisions}
    if not args.json_only:
        print(", ".join(f"{p} matmul peak {peaks[p] / 1e9:.0f} GFLOP/s" for p in precisions)
              + f" on {device} with {args.threads} torch thread(s); native bf16: {native_bf16(device)}")
    variants = [Variant(p, device=device) for p in dict.fromkeys(args.precision)]
    variants += [Variant(p, compile=True, device=device) for p in dict.fromkeys(args.compile)]
    for step in CONTENDERS if "all" in args.which else dict.fromkeys(args.which):
        cfg = bench_config(step, args.size)
        contenders = [c for v in variants for c in CONTENDERS[step](cfg, args.seed, v)]
        compare(step, cfg, contenders, peaks, args)


if __name__ == "__main__":
    main()
