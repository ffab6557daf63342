"""benchmarks/nsp_topics.py: the NSP property test's corpus, one run per start and seed recorded as it finishes, and a
table that says which runs passed 0.8 and when (the plumbing, not the figures)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "nsp_topics.py"


def test_each_start_and_seed_is_run_once_and_tabled(tmp_path, one_thread, capsys) -> None:
    bench = load_script(SCRIPT, "nsp_topics")
    argv = ["--out", str(tmp_path), "--seeds", "3", "--steps", "4", "--eval-every", "2"]
    results = bench.main(argv)
    assert set(results) == {"random-seed3", "ppmi-seed3"}
    for r in results.values():
        assert 0 <= r["nsp_accuracy"] <= 1 and r["mlm_loss"] > 0
        assert r["passed_at"] in (None, 2, 4)
    assert json.loads((tmp_path / "results.json").read_text()).keys() == results.keys()
    config = json.loads((tmp_path / "ppmi-seed3" / "config.json").read_text())
    assert config["embedding_init"] == "ppmi" and config["train"]["seed"] == 3
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| 3 | ") and row.count("|") == 4
    bench.main(argv)  # a second call finds both runs recorded and runs nothing
    assert "random-seed3 {" not in capsys.readouterr().out


def test_the_corpus_is_eight_topics_of_six_words_one_per_document() -> None:
    bench = load_script(SCRIPT, "nsp_topics")
    docs = bench.topic_documents(16, np.random.default_rng(0)).strip().split("\n\n")
    assert len(docs) == 16
    for d, doc in enumerate(docs):
        sentences = doc.splitlines()
        assert len(sentences) == 12 and all(s.endswith(" .") and len(s.split()) == 9 for s in sentences)
        assert {w for s in sentences for w in s.split()[:-1]} <= set(bench.TOPICS[d % 8])
