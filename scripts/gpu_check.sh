#!/usr/bin/env bash
# The GPU checks of docs/devices.md, for a machine with a CUDA GPU (never run in CI, which has none):
#   1. the tests marked `gpu` (tests/test_devices_gpu.py: CPU <-> CUDA runs, fp16 and bf16 resume, ...);
#   2. scripts/device_pipeline.py: a short pretrain -> finetune -> predict on --device cuda, in fp32 and in the
#      GPU's fastest precision, printing tokens/s (from each run's metrics.jsonl) and the peak GPU memory of each stage;
#   3. benchmarks/train_step.py --device cuda: sesame's BERT-mini MLM, GPT-mini causal, T5 and BART training steps against
#      transformers' on the same GPU, config and precision (fp32, and bf16 where the GPU has it): tokens/s and
#      peak step memory (torch.cuda.max_memory_allocated) of each side, and their ratio; then MLM and causal
#      under torch.compile, in the fastest of those precisions;
#   4. benchmarks/gpu_step_profile.py: wall against GPU-busy time and kernels per step, on each side;
#   5. benchmarks/pipeline_throughput.py --device cuda: the whole `sesame pretrain` (bert, gpt, t5, electra) and
#      `sesame finetune` against their bare steps and transformers' DataLoader + collator loop (bert, gpt), at base
#      size and at mini with a batch that fills the GPU: tokens/s, the share of the loop spent building batches and
#      MFU of each side (its JSON lines and table, also in OUT_DIR/pipeline_SIZE.txt), each under a time limit.
# Usage, from the repository root:  bash scripts/gpu_check.sh [OUT_DIR]
# Data: $SESAME_DATA (default ../shared/data) with wikitext2/ and airline/. OUT_DIR must be new or empty.
set -uo pipefail  # each stage runs even when one before it failed (a lent GPU is scarce); see the end

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

failed=()
check() {  # check NAME COMMAND...: run one stage, remembering it if it fails
    local name=$1; shift
    echo "== $name"
    "$@" || failed+=("$name")
}

check "tests marked gpu" python -m pytest -q -m gpu tests/

fast=$(python -c "import torch; print('bf16' if torch.cuda.is_bf16_supported() else 'fp16')")
for precision in fp32 "$fast"; do
    check "pretrain -> finetune -> predict on cuda, $precision" \
        python scripts/device_pipeline.py --data "$data" --out "$out/$precision" --device cuda --precision "$precision"
done

precisions=fp32
if [ "$fast" = bf16 ]; then precisions="fp32 bf16"; fi  # the benchmark's step has no fp16 gradient scaler
# shellcheck disable=SC2086
check "against transformers on the same GPU (tokens/s and peak step memory of each side)" \
    python benchmarks/train_step.py --device cuda --precision $precisions --which all --rounds 4 --steps 5
# shellcheck disable=SC2086
check "the MLM and causal steps under torch.compile, against transformers compiled" \
    python benchmarks/train_step.py --device cuda --precision "${precisions##* }" --compile "${precisions##* }" --which mlm clm \
    --rounds 4 --steps 5
check "where each side's step spends its GPU and CPU time" python benchmarks/gpu_step_profile.py --rows 4
for shape in "base 128" "mini 512"; do
    set -- $shape  # size, batch
    check "the whole command against its bare step and transformers' loop, $1 at batch $2 (tokens/s, batches, MFU)" \
        bash -o pipefail -c "timeout 600 python benchmarks/pipeline_throughput.py --device cuda --size $1 \
        --batch-size $2 --precision ${precisions##* } --workers 4 --steps 30 --json | tee '$out/pipeline_$1.txt'"
done

if [ ${#failed[@]} -gt 0 ]; then
    printf 'gpu_check: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "gpu_check: every stage passed"
