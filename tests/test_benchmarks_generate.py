"""benchmarks/generate.py on a tiny model: four contenders per batch size, the same greedy tokens, flag errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from .conftest import load_script, sentences  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "generate.py"


def load_benchmark():
    return load_script(SCRIPT, "benchmark_generate")


def test_tiny_run_measures_four_contenders_with_parity(tmp_path: Path, capsys, one_thread) -> None:
    (tmp_path / "train.txt").write_text("\n".join(sentences(300)) + "\n")
    (tmp_path / "test.txt").write_text("\n\n".join(sentences(10, seed=1)) + "\n")
    load_benchmark().main(["--sizes", "tiny", "--batches", "1", "2", "--prompt-tokens", "6", "--new-tokens", "3",
                           "--repeats", "1", "--vocab-size", "300", "--threads", "1",
                           "--train", str(tmp_path / "train.txt"), "--test", str(tmp_path / "test.txt")])
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["batch"], r["impl"], r["cache"]) for r in rows] == [
        (b, impl, cache) for b in (1, 2) for impl in ("sesame", "transformers") for cache in (True, False)]
    assert all(r["tokens_per_s"] > 0 and r["prompt_tokens"] == 6 for r in rows)
    assert out.count("identical greedy tokens on all four") == 2 and "MISMATCH" not in out


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "huge"], "--sizes huge: unknown"),
    (["--batches", "0"], "--batches: must be at least 1"),
    (["--prompt-tokens", "1000", "--new-tokens", "100"], "the models have 1024 positions"),
    (["--train", str(SCRIPT), "--test", "missing.txt"], "--test missing.txt: no such file"),
])
def test_bad_flags_fail_in_one_line(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit):
        load_benchmark().main(argv)
    assert message in capsys.readouterr().err
