"""benchmarks/tasks_vs_transformers.py in its smoke mode: every task on both sides with a tiny BERT, on real data."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("seqeval")

from .conftest import load_script, minilm, shared_data  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tasks_vs_transformers.py"


def load_benchmark():
    return load_script(SCRIPT, "tasks_vs_transformers")


def tiny_bert(folder: Path) -> Path:
    """A randomly initialised two-layer BERT with all-MiniLM-L6-v2's tokenizer, as a transformers directory."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    config = BertConfig.from_pretrained(minilm())
    config.update({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64})
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm()).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_every_task_runs_on_both_sides_and_makes_the_table(tmp_path: Path, capsys, one_thread) -> None:
    data = shared_data()
    benchmark = load_benchmark()
    benchmark.main(["--out", str(tmp_path / "out"), "--model", str(tiny_bert(tmp_path / "tiny")), "--data", str(data),
                    "--train-limit", "24", "--dev-limit", "12", "--epochs", "1", "--max-length", "96",
                    "--stride", "32", "--threads", "1"])
    results = json.loads((tmp_path / "out/results.json").read_text())
    for name, spec in benchmark.TASKS.items():
        for side in ("transformers", "sesame"):
            run = results[f"{name}/{side}/0"]
            assert len(run["per_epoch"]) == 1 and run["best_epoch"] == 1
            assert all(math.isfinite(run[m]) for m in spec["metrics"]), (name, side, run)
    table = capsys.readouterr().out.split("| task |", 1)[1]
    assert all(f"| {name} |" in table for name in benchmark.TASKS)


def test_the_multiple_choice_set_hides_the_true_ending_among_three_others(tmp_path: Path) -> None:
    text = "\n".join(" ".join(f"w{i}x{j}" for j in range(14)) + " . " for i in range(30))
    (tmp_path / "wiki.txt").write_text(" = Heading = \n" + text)
    rows = load_benchmark().multiple_choice_set(tmp_path / "wiki.txt", limit=10)
    assert len(rows) == 10
    for row in rows:
        sentence = row["context"].split()[0].split("x")[0]
        assert len(row["choices"]) == 4 and len(set(row["choices"])) == 4
        assert row["choices"][row["label"]].startswith(f"{sentence}x7 ")  # the context's own second half
        assert sum(c.startswith(f"{sentence}x") for c in row["choices"]) == 1


def test_the_table_keeps_every_recorded_task_when_a_call_runs_only_some(tmp_path: Path, capsys) -> None:
    """--write-docs replaces the whole block, so a call for one task (more seeds of CoLA) must still table the
    tasks an earlier call recorded in OUT; recorded runs are reused, not trained again."""
    data = shared_data()
    run = {"accuracy": 0.5, "mcc": 0.1, "best_epoch": 1, "per_epoch": [], "seconds": 60.0}
    recorded = {f"{name}/{side}/0": run for name in ("cola", "rte") for side in ("transformers", "sesame")}
    (tmp_path / "out").mkdir()
    (tmp_path / "out/results.json").write_text(json.dumps(recorded))
    load_benchmark().main(["--out", str(tmp_path / "out"), "--model", "unused: every run is recorded",
                           "--data", str(data), "--tasks", "cola", "--seeds", "0", "--threads", "1"])
    table = capsys.readouterr().out.split("| task |", 1)[1]
    assert "| cola |" in table and "| rte |" in table
