"""benchmarks/batch_building.py for one step of each objective on a small prepared corpus of several documents, and
its refusal of t5 on a tokenizer without sentinels."""
from __future__ import annotations

from pathlib import Path

import pytest

from sesame.data.shards import prepare_corpus
from sesame.tokenizer import train_tokenizer

from .conftest import load_script, sentences

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "batch_building.py"


def test_each_objective_reports_its_cpu_time_per_batch(tmp_path, capsys, one_thread) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(sentences(30, seed=d)) for d in range(8)) + "\n")
    tok = train_tokenizer([corpus.read_text()], "wordpiece", vocab_size=200, sentinels=20)  # t5 reads sentinels
    prepare_corpus([corpus], tok, tmp_path / "shards", "text", False)
    load_script(SCRIPT, "benchmark_batch_building").main(
        ["--corpus", str(tmp_path / "shards"), "--batch-size", "4", "--seq-len", "32", "--steps", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["mlm", "mlm_nsp", "mlm_sop", "electra", "distilbert", "spanbert",
                                                   "bart", "xlnet", "t5", "bart_noise"]
    assert all(float(line.split()[1]) > 0 and line.endswith("per batch of 4") for line in lines)


def test_t5_without_sentinels_is_refused_in_one_line(tmp_path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(sentences(10, seed=d)) for d in range(2)) + "\n")
    tok = train_tokenizer([corpus.read_text()], "wordpiece", vocab_size=100)
    prepare_corpus([corpus], tok, tmp_path / "shards", "text", False)
    with pytest.raises(SystemExit) as exit:
        load_script(SCRIPT, "benchmark_batch_building").main(["--corpus", str(tmp_path / "shards"),
                                                              "--objectives", "t5"])
    assert exit.value.code == 2 and "has no sentinels" in capsys.readouterr().err
