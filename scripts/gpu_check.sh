#!/usr/bin/env bash
# The GPU checks of docs/devices.md, for a machine with a CUDA GPU (never run in CI, which has none):
#   1. the tests marked `gpu` (tests/test_devices_gpu.py: CPU <-> CUDA runs, fp16 and bf16 resume, ...);
#   2. a short pretrain -> finetune -> predict on --device cuda, in fp32 and in the GPU's fastest precision,
#      printing tokens/s (from each run's metrics.jsonl) and the peak GPU memory of each stage;
#   3. benchmarks/train_step.py --device cuda: sesame's BERT-mini MLM and GPT-mini causal training steps against
#      transformers' on the same GPU, config and precision (fp32, and bf16 where the GPU has it): tokens/s and
#      peak step memory (torch.cuda.max_memory_allocated) of each side, and their ratio.
# Usage, from the repository root:  bash scripts/gpu_check.sh [OUT_DIR]
# Data: $SESAME_DATA (default ../shared/data) with wikitext2/ and airline/. OUT_DIR must be new or empty.
set -euo pipefail

out=${1:-runs/gpu-check}
data=${SESAME_DATA:-../shared/data}
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then
    echo "gpu_check: $out is not empty; give a new folder" >&2
    exit 2
fi
python - <<'EOF' || { echo "gpu_check: no CUDA GPU here: torch.cuda.is_available() is false" >&2; exit 2; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
mkdir -p "$out"

echo "== tests marked gpu"
python -m pytest -q -m gpu tests/

fast=$(python -c "import torch; print('bf16' if torch.cuda.is_bf16_supported() else 'fp16')")
for precision in fp32 "$fast"; do
    echo "== pretrain -> finetune -> predict on cuda, $precision"
    OUT="$out/$precision" DATA="$data" PRECISION="$precision" python - <<'EOF'
import json, os, time
from pathlib import Path

import torch

import sesame
from sesame.runtime import Runtime

out, data, precision = Path(os.environ["OUT"]), Path(os.environ["DATA"]), os.environ["PRECISION"]
device = {"device": "cuda", "precision": precision}


def stage(name, call):
    torch.cuda.reset_peak_memory_stats()
    started = time.time()
    result = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2 ** 20
    print(f"{name}: {time.time() - started:.1f} s, peak GPU memory {peak:.0f} MiB", flush=True)
    return result


def tokens_per_s(run):
    rates = [r["tokens_per_s"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r.get("split") == "train" and r["step"] > 10]  # after the first steps' warm-up
    return sorted(rates)[len(rates) // 2] if rates else None


stage("pretrain", lambda: sesame.pretrain([str(data / "wikitext2/train.txt")], str(out / "pre"), family="bert",
                                          size="mini", max_steps=300, batch_size=64, seq_len=128, eval_every=100,
                                          save_every=100, progress=False, **device))
print(f"pretrain tokens/s (median): {tokens_per_s(out / 'pre')}")
metrics = stage("finetune", lambda: sesame.finetune(
    str(out / "pre"), str(data / "airline/train.csv"), str(data / "airline/dev.csv"), str(out / "airline"),
    text_column="text", label_column="airline_sentiment", max_length=64, epochs=1, progress=False, **device))
print(f"finetune tokens/s (median): {tokens_per_s(out / 'airline')}, dev accuracy {metrics['accuracy']:.4f}")
predictor = sesame.load(out / "airline", runtime=Runtime(**device))
texts = [row["text"] for row in predictor.read(str(data / "airline/dev.csv"))]
predicted = stage("predict", lambda: predictor.predict(texts))
print(f"predict: {len(predicted)} texts; first: {predicted[0]['label']}")
cpu = sesame.load(out / "airline", runtime=Runtime(device="cpu")).predict(texts[:64])
same = sum(a["label"] == b["label"] for a, b in zip(predicted, cpu))
print(f"the same run on the CPU agrees on {same} of 64 labels")
EOF
done

echo "== against transformers on the same GPU (tokens/s and peak step memory of each side)"
precisions=fp32
if [ "$fast" = bf16 ]; then precisions="fp32 bf16"; fi  # the benchmark's step has no fp16 gradient scaler
# shellcheck disable=SC2086
python benchmarks/train_step.py --device cuda --precision $precisions --which mlm clm --rounds 4 --steps 5
