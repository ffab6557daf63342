"""benchmarks/copy_task.py for a few steps: both sides start from the same function and see the same batches, so
their losses agree step by step (the property the benchmark's reading rests on)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from .conftest import load_script  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "copy_task.py"


@pytest.mark.parametrize("style,redraw", [("t5", []), ("bart", []), ("bart", ["--embedding-std", "1"]),
                                          ("bart", ["--weight-init", "xavier"])])
def test_both_sides_follow_the_same_curve(style, redraw, capsys, one_thread) -> None:
    load_script(SCRIPT, "benchmark_copy_task").main(["--style", style, "--steps", "3", "--every", "1", *redraw])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert rows[0]["style"] == style and [r["step"] for r in rows[1:]] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert r["sesame"] == pytest.approx(r["transformers"], abs=2e-3)
    assert rows[-1]["sesame"] < rows[1]["sesame"]  # and they learn


def test_xavier_for_t5_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        load_script(SCRIPT, "benchmark_copy_task").main(["--style", "t5", "--weight-init", "xavier", "--steps", "0"])
    assert exit.value.code == 2 and "--weight-init xavier: weight_init 'xavier'" in capsys.readouterr().err
