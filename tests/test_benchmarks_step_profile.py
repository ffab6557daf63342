"""benchmarks/step_profile.py on tiny models: products and the rest split each step's time, and the Amdahl bound
follows from the measured share."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")  # train_step.py, whose models and helpers the benchmark reuses, imports it

from .conftest import load_script  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def step_profile():
    return load_script(BENCHMARKS / "step_profile.py", "step_profile")


@pytest.mark.parametrize("name, product", [
    ("aten::mm", True), ("aten::addmm", True), ("aten::bmm", True),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", True),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", True),
    ("aten::add_", False), ("aten::native_layer_norm", False), ("aten::gelu", False), ("aten::mul", False),
    ("aten::linear", False),  # its own time is dispatch: the product is its addmm's
])
def test_products_are_the_matrix_kernels(name: str, product: bool) -> None:
    assert step_profile().is_product(name) is product


def test_one_line_per_step_whose_share_and_bound_follow_from_its_times(capsys, monkeypatch) -> None:
    """On a CPU without native bf16 (no AVX512-BF16 or AMX) bf16 products can run hundreds of times slower than fp32:
    the peak ratio is set so here, whatever this machine is, and must still be reported (it once rounded to 0)."""
    bench = step_profile()
    slow_bf16 = {torch.float32: 1e11, torch.bfloat16: 2e8}  # FLOP/s: a peak ratio of 0.002
    monkeypatch.setattr(bench, "matmul_peak", lambda dtype=torch.float32: slow_bf16[dtype])
    bench.main(["--size", "tiny", "--steps", "1", "--threads", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["bench"] for r in rows] == ["mlm-profile", "clm-profile"]
    for row in rows:
        fp32, bf16 = row["ms_per_step"]["fp32"], row["ms_per_step"]["bf16"]
        assert fp32["products"] > 0 and fp32["other"] > 0 and bf16["products"] > 0
        share = fp32["products"] / (fp32["products"] + fp32["other"])
        assert row["fp32_product_share"] == pytest.approx(share, abs=0.01)  # to 3 significant digits, as the times
        f, r = row["fp32_product_share"], row["peak_ratio"]
        assert r == 0.002 and row["amdahl_bound"] == pytest.approx(1 / ((1 - f) + f / r), rel=0.01)
        assert min(1.0, r) - 0.01 <= row["amdahl_bound"] <= max(1.0, r) + 0.01  # between no gain and the peak
