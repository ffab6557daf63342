"""benchmarks/finetune_minilm.py on a few real tweets: the script imports, runs sesame's side and prints its result."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script, minilm, shared_data

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "finetune_minilm.py"


def test_sesame_side_runs_with_settings_given_as_key_values(capsys, one_thread) -> None:
    pytest.importorskip("transformers")  # the script shares train_step.py's helpers, which import it
    data, _ = shared_data(), minilm()
    benchmark = load_script(SCRIPT, "finetune_minilm")
    benchmark.main(["--data", str(data / "airline"), "--limit", "16", "--epochs", "1", "--threads", "1",
                    "--which", "sesame-fp32", "--sesame", "batching=shuffled"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["name"] for r in rows] == ["sesame-fp32"]
    assert 0.0 <= rows[0]["accuracy"] <= 1.0 and rows[0]["best_epoch"] == 1
