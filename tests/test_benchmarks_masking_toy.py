"""benchmarks/masking_toy.py: each corruption's shares of [MASK], random and unchanged tokens, and a table of its
losses (the plumbing, not the figures)."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from .conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "masking_toy.py"


def test_each_corruption_keeps_its_shares_and_is_tabled(one_thread, capsys) -> None:
    bench = load_script(SCRIPT, "masking_toy")
    rows = bench.windows(0, n=256)
    generators = [torch.Generator().manual_seed(i) for i in range(256)]
    corrupted, selected = bench.SharesMLM(0.85, 0.0).corrupt_rows(rows, generators)
    kept = (corrupted[selected] == rows[selected]).float().mean().item()
    assert abs(kept - 0.15) < 0.04 and torch.equal(corrupted[~selected], rows[~selected])
    corrupted, selected = bench.SharesMLM(1.0, 0.0).corrupt_rows(rows, generators)
    assert (corrupted[selected] == bench.SPECIALS.mask).all()
    table = bench.main(["--marks", "2", "3"])
    assert len(table) == 5 and all(len(v) == 2 and all(math.isfinite(x) and x > 0 for x in v) for v in table.values())
    assert capsys.readouterr().out.count("\n") == 2 + 5
