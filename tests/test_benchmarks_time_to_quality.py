"""benchmarks/time_to_quality.py --smoke: its plumbing, not its numbers. Every stage runs on tiny cuts of the real
data sets and is recorded; the page holds a row per task, labels and budget, with MiniLM's skip and its reason where
the weights are absent; a second command redoes nothing, and one whose stage was lost redoes that stage alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import sesame

from .conftest import load_script, shared_data

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_quality.py"


def test_smoke_runs_every_stage_records_it_and_resumes(tmp_path, monkeypatch, one_thread) -> None:
    data = shared_data()
    benchmark = load_script(SCRIPT, "time_to_quality")
    monkeypatch.setattr(benchmark, "minilm_missing", lambda: "minilm: the MiniLM weights are not installed")
    argv = ["--smoke", "--seeds", "1", "--data", str(data), "--out", str(tmp_path / "ttq")]
    results = benchmark.main(argv)

    budget = benchmark.SMOKE["budgets"][0]
    for task in ("airline", "sst2"):
        assert results[f"{task}/pretrain/{budget:g}"]["size"] == "tiny"
        for labels in ("32", "all"):
            assert 0 <= results[f"{task}/{labels}/tfidf"]["accuracy"] <= 1
            assert results[f"{task}/{labels}/minilm/seed0"]["skipped"] == "minilm: the MiniLM weights are not installed"
            for twin in ("pretrained", "scratch"):
                assert 0 <= results[f"{task}/{labels}/{budget:g}/{twin}/seed0"]["accuracy"] <= 1
    assert sum(1 for line in (tmp_path / "ttq/sst2-train-32.tsv").read_text().splitlines()) == 33  # header + 32
    page = (tmp_path / "ttq/time_to_quality.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith(("| airline |", "| sst2 |"))]
    assert len(rows) == 4 and all("| skipped |" in row for row in rows)
    assert "MiniLM skipped: minilm: the MiniLM weights are not installed" in page
    assert (tmp_path / "ttq/time_to_quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ran = []
    monkeypatch.setattr(sesame, "pretrain", lambda *args, **kwargs: pytest.fail("pre-trained again"))
    monkeypatch.setattr(sesame, "finetune", lambda base, *args, **kwargs: ran.append(base) or {"accuracy": 0.5})
    assert benchmark.main(argv) == results and ran == []  # every stage was recorded
    record = tmp_path / "ttq/results.json"
    lost = f"sst2/all/{budget:g}/scratch/seed0"
    record.write_text(json.dumps({k: v for k, v in results.items() if k != lost}))
    assert benchmark.main(argv)[lost]["accuracy"] == 0.5
    assert ran == [f"scratch:{tmp_path / 'ttq' / f'pretrained-sst2-{budget:g}min'}"]
