"""benchmarks/feature_probe.py: a frozen backbone's pooled states fitted by logistic regression, for a run and its
random twin; the figures, the table, and a clear refusal of a folder that is no run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from .conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "feature_probe.py"


def test_a_run_and_its_scratch_twin_are_probed_with_every_pooling(tiny_runs, tmp_path, capsys) -> None:
    probe = load_script(SCRIPT, "feature_probe")
    pre = str(tiny_runs / "pre")
    argv = ["--train", str(tiny_runs / "train.csv"), "--dev", str(tiny_runs / "dev.csv"), "--max-length", "32",
            "--runs", f"scratch:{pre}", pre, "--json", str(tmp_path / "probe.json")]
    results = probe.main(argv)
    assert list(results) == [f"scratch:{pre}", pre]
    for scores in results.values():
        assert list(scores) == list(probe.POOLINGS) and all(0 <= s <= 1 for s in scores.values())
    texts = ["a cat sat on the mat.", "the dog ran", "birds fly over the sea tonight"]
    read, drawn = (probe.pooled(*probe.backbone_of(name, 0), texts, 32) for name in (pre, f"scratch:{pre}"))
    hidden, layers = read["mean"].shape[1], probe.backbone_of(pre, 0)[0].config.layers + 1
    assert read["first"].shape == read["mean"].shape == (3, hidden)
    assert read["mean of every layer"].shape == (3, hidden * layers)
    assert (read["mean of the embeddings"] == read["mean of every layer"][:, :hidden]).all()
    assert not (read["mean"] == drawn["mean"]).all()  # the pre-trained weights were read, not drawn again
    assert json.loads((tmp_path / "probe.json").read_text()) == results
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| run | first | mean | mean of the embeddings | mean of every layer |" and len(table) == 4
    assert probe.main(argv[:-2]) == results  # the twin's weights are a function of the seed


def test_counts_are_the_twin_with_the_token_table_a_new_run_starts_from(tiny_runs) -> None:
    probe = load_script(SCRIPT, "feature_probe")
    pre = str(tiny_runs / "pre")
    twin, counted = (probe.backbone_of(f"{kind}:{pre}", 0)[0].state_dict() for kind in ("scratch", "counts"))
    table = "embed.tokens.weight"
    assert all((twin[k] == counted[k]).all() for k in twin if k != table)  # only the token table differs
    specials = probe.load_tokenizer(pre).specials.all
    moved = (twin[table] != counted[table]).any(1)
    assert moved.sum() > 0 and not moved[specials].any()  # the specials keep their random rows
    norms = counted[table][moved].norm(dim=1)  # the counted rows: every one at the random rows' mean norm
    assert torch.allclose(norms, twin[table].norm(dim=1).mean().expand_as(norms), rtol=1e-4)


def test_a_folder_that_is_no_run_exits_2_naming_it(tiny_runs, tmp_path, capsys) -> None:
    probe = load_script(SCRIPT, "feature_probe")
    with pytest.raises(SystemExit) as refused:
        probe.main(["--train", str(tiny_runs / "train.csv"), "--dev", str(tiny_runs / "dev.csv"),
                    "--runs", str(tmp_path)])
    assert refused.value.code == 2
    assert str(tmp_path) in capsys.readouterr().err
