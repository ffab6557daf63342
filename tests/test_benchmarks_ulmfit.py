"""benchmarks/ulmfit_vs_fastai.py in its smoke mode: both libraries' ULMFiT classifiers, stage by stage, on real data."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastai", reason="the fastai extra is not installed (pip install -c constraints.txt -e '.[fastai]')")

from .conftest import load_script, shared_data  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ulmfit_vs_fastai.py"


@pytest.mark.slow
def test_both_sides_run_every_stage_from_both_starts_and_a_rerun_reuses_them(tmp_path: Path, capsys, one_thread):
    shared_data()
    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    benchmark.main(["--out", str(tmp_path / "out"), "--smoke"])
    results = json.loads((tmp_path / "out/results.json").read_text())
    assert results["lm/fastai"]["steps"] > 0 and results["lm/sesame"]["perplexity"] > 1
    for start in ("scratch", "pretrained"):
        for side in ("sesame", "fastai"):
            run = results[f"{start}/{side}/0"]
            assert list(run["stages"]) == list(benchmark.STAGES) and len(run["epochs"]) == 5
            assert all(0 <= s["accuracy"] <= 1 and s["seconds"] > 0 for s in run["stages"].values())
            assert run["stages"]["all"]["accuracy"] == run["epochs"][-1]
    table = capsys.readouterr().out.split("| start |", 1)[1]
    assert table.count("| scratch |") == 4 and table.count("| pretrained |") == 4
    before = (tmp_path / "out/results.json").read_text()
    benchmark.main(["--out", str(tmp_path / "out"), "--smoke"])  # every stage recorded: nothing runs again
    assert (tmp_path / "out/results.json").read_text() == before
