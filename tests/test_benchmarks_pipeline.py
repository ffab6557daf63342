"""benchmarks/pipeline_throughput.py --smoke: the plumbing of every side (a tiny model, a few steps), not the numbers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from .conftest import load_script  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_smoke_times_the_command_its_bare_step_and_the_peer(capsys, one_thread):
    load_script(BENCHMARKS / "pipeline_throughput.py", "pipeline_throughput").main(
        ["--smoke", "--threads", "1", "--json", "--which", "bert", "finetune"])
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["bench"] for r in rows] == ["pipeline-bert", "pipeline-finetune"]
    bert, finetune = rows
    assert "peer" in bert and "peer" not in finetune  # transformers' run_mlm-style loop for pre-training only
    for row in rows:
        assert row["device"] == "cpu" and row["precision"] in ("fp32", "bf16") and row["steps"] == 2
        for side in ("command", "bare", "peer"):
            if side not in row:
                continue
            r = row[side]
            assert r["steps"] == 2 and r["tokens"] > 0 and r["wall"] > 0 and r["tokens_per_s"] > 0, side
            assert 0 <= r["batches_wall_share"] <= 1 and r["batch_wall"] <= r["wall"], side
            assert r["flops_per_token"] > 0 and 0 < r["mfu"] <= 1, side  # the peak beats what a model reaches
        assert row["command"]["batch_wall"] > 0  # the trainer's batches were timed: sesame builds them there
        assert row["command_vs_bare"] == pytest.approx(row["command"]["tokens_per_s"] / row["bare"]["tokens_per_s"],
                                                       rel=1e-2)
    assert bert["command"]["tokens"] == 2 * 8 * 32  # two steps of the batch, every position an input token
    assert bert["peer"]["tokens"] == 2 * 8 * 32 and bert["peer"]["batch_wall"] > 0  # its collator, on the clock
    assert "command/peer" in out and "finetune" in out.splitlines()[-1]  # the table follows the JSON lines
