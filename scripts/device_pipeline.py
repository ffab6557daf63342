"""A short pretrain -> finetune -> predict on one device and precision, the path a user takes, printing each
stage's time, its median tokens/s (from the run's metrics.jsonl) and, on CUDA, its peak GPU memory; then the
fine-tuned run loaded on the CPU must give the same labels on the first 64 dev texts.

scripts/gpu_check.sh runs it on a CUDA GPU in fp32 and in the GPU's fastest precision; on a CPU it is a smoke
test of the same code path:

    python scripts/device_pipeline.py --data ../shared/data --out runs/pipe --device cpu --steps 20
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

import sesame
from sesame.runtime import Runtime


def stage(name: str, call: Callable[[], Any], device: str) -> Any:
    """``call()``, printing its time and, on CUDA, its peak GPU memory."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = call()
    if cuda:
        torch.cuda.synchronize()
    memory = f", peak GPU memory {torch.cuda.max_memory_allocated() / 2 ** 20:.0f} MiB" if cuda else ""
    print(f"{name}: {time.perf_counter() - started:.1f} s{memory}", flush=True)
    return result


def median_tokens_per_s(run: Path, *, skip: int = 10) -> float | None:
    """The median training tokens/s logged after the first ``skip`` steps (their warm-up and compilation)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = sorted(r["tokens_per_s"] for r in rows if r.get("split") == "train" and r["step"] > skip
                   and "tokens_per_s" in r)
    return rates[len(rates) // 2] if rates else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder with wikitext2/ and airline/")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the two runs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--steps", type=int, default=300, help="pre-training steps (BERT-mini, batch 64 x 128)")
    args = parser.parse_args()
    runtime = {"device": args.device, "precision": args.precision}
    pre, fine = args.out / "pre", args.out / "airline"

    every = max(args.steps // 3, 1)
    stage("pretrain", lambda: sesame.pretrain(
        [str(args.data / "wikitext2/train.txt")], str(pre), family="bert", size="mini", max_steps=args.steps,
        batch_size=64, seq_len=128, eval_every=every, save_every=every, progress=False, **runtime), args.device)
    print(f"pretrain tokens/s (median): {median_tokens_per_s(pre)}")
    metrics = stage("finetune", lambda: sesame.finetune(
        str(pre), str(args.data / "airline/train.csv"), str(args.data / "airline/dev.csv"), str(fine),
        text_column="text", label_column="airline_sentiment", max_length=64, epochs=1, progress=False,
        **runtime), args.device)
    print(f"finetune tokens/s (median): {median_tokens_per_s(fine)}, dev accuracy {metrics['accuracy']:.4f}")
    predictor = sesame.load(fine, runtime=Runtime(**runtime))
    texts = [row["text"] for row in predictor.read(str(args.data / "airline/dev.csv"))]
    predicted = stage("predict", lambda: predictor.predict(texts), args.device)
    print(f"predict: {len(predicted)} texts")
    on_cpu = sesame.load(fine, runtime=Runtime(device="cpu")).predict(texts[:64])
    same = sum(a["label"] == b["label"] for a, b in zip(predicted, on_cpu))
    print(f"the same run on the CPU agrees on {same} of 64 labels")


if __name__ == "__main__":
    main()
