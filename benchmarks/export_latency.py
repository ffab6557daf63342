"""Inference latency of a fine-tuned classifier: sesame eager, its ONNX export (fp32 and dynamic int8) and a
transformers ``text-classification`` pipeline on the same weights, batch 1 and batch 32, on airline dev.

The run is exported three ways in one process (``sesame.interop``): ``to_hf`` (the pipeline's model directory,
so both sides read identical weights), ``to_onnx`` and ``to_onnx(quantize="int8")``. Every side is timed end to
end from raw text to a label (tokenisation included: the pipeline tokenises too), on the first ``--limit`` dev
texts, in batches of each ``--batches`` size, after ``--warmup`` untimed batches; the median and 90th percentile
of a batch's wall time are reported, with the batch-1 median as a share of the pipeline's (the issue's target:
≤ 0.5). Each side's labels are also compared with sesame eager's (``agreement``: int8's share of equal argmaxes).
Torch and onnxruntime get ``--threads`` threads each.

    python benchmarks/export_latency.py --model runs/airline-mini --data ../shared/data/airline/dev.csv
    python benchmarks/export_latency.py --model RUN --limit 64 --batches 1 32     # a quick check

The sides run one after another: run it on a quiet machine. The run must export to transformers
(``sesame convert --to-hf``: a BERT-like family, ``cls`` pooling).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import sesame
from sesame.interop import to_hf
from sesame.interop.onnx_export import MODEL_FILE, session, to_onnx

SIDES = ("sesame-eager", "sesame-onnx", "sesame-onnx-int8", "transformers-pipeline")


def read_texts(path: Path, column: str, limit: int) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return [row[column] for row in csv.DictReader(f)][:limit]


def timed(predict: Callable[[list[str]], list[str]], texts: list[str], batch: int, warmup: int
          ) -> tuple[list[float], list[str]]:
    """Seconds per batch of ``batch`` texts over ``texts`` (after ``warmup`` untimed batches), and the labels."""
    chunks = [texts[i: i + batch] for i in range(0, len(texts), batch)]
    for chunk in chunks[:warmup]:
        predict(chunk)
    seconds, labels = [], []
    for chunk in chunks:
        start = time.perf_counter()
        labels += predict(chunk)
        seconds.append(time.perf_counter() - start)
    return seconds, labels


def sides(run: Path, folder: Path, threads: int) -> dict[str, Callable[[list[str]], list[str]]]:
    """Each side's ``texts → labels``; the exports are written below ``folder``."""
    from transformers import pipeline

    to_hf(run, folder / "hf")
    eager = sesame.load(run)
    exports = {}
    for name, quantize in (("sesame-onnx", None), ("sesame-onnx-int8", "int8")):
        to_onnx(run, folder / name, quantize=quantize)
        predictor = sesame.load(folder / name)
        predictor.model.session = session(folder / name / MODEL_FILE, threads=threads)
        exports[name] = predictor
    classifier = pipeline("text-classification", model=str(folder / "hf"), device=-1)
    max_length = eager.max_length

    def labels_of(predictor):
        return lambda texts: [p["label"] for p in predictor.predict(texts)]

    return {"sesame-eager": labels_of(eager), "sesame-onnx": labels_of(exports["sesame-onnx"]),
            "sesame-onnx-int8": labels_of(exports["sesame-onnx-int8"]),
            "transformers-pipeline": lambda texts: [p["label"] for p in classifier(
                texts, batch_size=len(texts), truncation=True, max_length=max_length)]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a fine-tuned classifier run (airline)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/airline/dev.csv"))
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--limit", type=int, default=512, help="dev texts timed (default 512)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--which", nargs="+", choices=SIDES, default=list(SIDES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    texts = read_texts(args.data, args.text_column, args.limit)
    with tempfile.TemporaryDirectory(prefix="export-latency-") as tmp:
        predictors = sides(args.model, Path(tmp), args.threads)
        rows = []
        for batch in args.batches:
            reference = None
            for name in ("sesame-eager", *[s for s in args.which if s != "sesame-eager"]):
                seconds, labels = timed(predictors[name], texts, batch, args.warmup)
                reference = reference or labels
                row = {"name": name, "batch": batch, "examples": len(texts),
                       "median_ms": round(1000 * statistics.median(seconds), 3),
                       "p90_ms": round(1000 * sorted(seconds)[int(0.9 * (len(seconds) - 1))], 3),
                       "agreement": round(sum(a == b for a, b in zip(labels, reference)) / len(labels), 4)}
                if name in args.which:
                    rows.append(row)
            pipe = next((r for r in rows if r["batch"] == batch and r["name"] == "transformers-pipeline"), None)
            for row in rows:
                if pipe and row["batch"] == batch:
                    row["vs_pipeline"] = round(row["median_ms"] / pipe["median_ms"], 3)
    for row in rows:
        print(json.dumps(row))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
