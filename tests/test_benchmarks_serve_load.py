"""benchmarks/serve_load.py on a tiny classifier: both settings measured, every request answered, and with
micro-batching the requests of concurrent clients share forward passes."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import load_script, sentences

pytest.importorskip("uvicorn", reason="sesame serve's extra: pip install 'sesame-nlp[serve]'")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"


def test_a_short_load_test_of_both_settings_without_errors(tmp_path: Path, one_thread) -> None:
    from .test_serve import LABELS, write_run

    run = write_run(tmp_path, "clf", "classify", {}, LABELS)
    (tmp_path / "dev.csv").write_text("text\n" + "".join(f'"{s}"\n' for s in sentences(12)))
    rows = load_script(SCRIPT, "benchmark_serve_load").main([
        "--model", str(run), "--data", str(tmp_path / "dev.csv"), "--clients", "4", "--requests", "16",
        "--batch-wait-ms", "50"])
    assert [r["batch_wait_ms"] for r in rows] == [50, 0]
    for row in rows:
        assert row["requests"] == 16 and row["errors"] == 0 and row["requests_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert rows[0]["forward_passes"] < 16 and rows[1]["forward_passes"] == 16  # gathered, and not
