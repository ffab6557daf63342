"""benchmarks/export_latency.py at tiny sizes: every side runs on the tiny classifier and reports a row per batch
size (no timing is checked: the lead runs the measurement)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script, onnxruntime_or_skip

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "export_latency.py"


def test_every_side_runs_and_agrees_with_eager_in_fp32(tiny_runs: Path, capsys, one_thread) -> None:
    pytest.importorskip("transformers")
    onnxruntime_or_skip()
    benchmark = load_script(SCRIPT, "export_latency")
    benchmark.main(["--model", str(tiny_runs / "clf"), "--data", str(tiny_runs / "dev.csv"), "--limit", "6",
                    "--batches", "1", "4", "--warmup", "1", "--threads", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["name"], r["batch"]) for r in rows] == [(s, b) for b in (1, 4) for s in benchmark.SIDES]
    for row in rows:
        assert row["examples"] == 6 and row["median_ms"] > 0 and "vs_pipeline" in row
        if row["name"] in ("sesame-onnx", "transformers-pipeline"):  # fp32 on the same weights: the same labels
            assert row["agreement"] == 1.0, row
