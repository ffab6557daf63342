"""benchmarks/seq2seq_generate.py on tiny models: one JSON line per style, batch and source length, with parity."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from .conftest import load_script  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "seq2seq_generate.py"


def load_benchmark():
    return load_script(SCRIPT, "benchmark_seq2seq_generate")


def test_tiny_run_times_both_sides_of_every_setting_with_parity(capsys, one_thread) -> None:
    load_benchmark().main(["--sizes", "tiny", "--batches", "1", "2", "--source-tokens", "5", "9", "--new-tokens", "3",
                           "--repeats", "1", "--vocab-size", "64", "--threads", "1"])
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["bench"] for r in rows] == [f"seq2seq-generate-{style}-tiny-b{b}-s{s}" for style in ("t5", "bart")
                                          for s in (5, 9) for b in (1, 2)]
    for r in rows:
        assert r["ratio"] == pytest.approx(r["sesame_tokens_per_s"] / r["transformers_tokens_per_s"], rel=1e-2)
        assert r["ratio"] > 0 and r["new_tokens"] == 3 and r["parity"] is True
    assert "MISMATCH" not in out


@pytest.mark.parametrize("argv, message", [
    (["--styles", "gpt"], "--styles gpt: unknown"),
    (["--sizes", "huge"], "--sizes huge: unknown"),
    (["--batches", "0"], "--batches: must be at least 1"),
    (["--source-tokens", "2000"], "at most 1024"),
])
def test_bad_flags_fail_in_one_line(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit):
        load_benchmark().main(argv)
    assert message in capsys.readouterr().err
