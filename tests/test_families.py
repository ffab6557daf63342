"""Every family in the registry pre-trains on tiny data (its loss goes down) and fine-tunes from its export."""
import json

import pytest

import sesame
from sesame.families import FAMILIES
from sesame.rundir import read_config

from .conftest import sentences


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    for i in range(3):  # three documents, for next-sentence negatives
        (root / f"doc{i}.txt").write_text("\n".join(sentences(150, seed=i)) + "\n")
    animals = {"cat", "dog", "bird", "fish"}
    for split, seed in (("train", 5), ("dev", 6)):
        rows = ["text,label"] + [f"{s},{'animal' if animals & set(s.lower()[:-1].split()) else 'none'}"
                                 for s in sentences(40, seed)]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return root


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_pretrains_and_fine_tunes(family, data, tmp_path, one_thread):
    run = tmp_path / "pre"
    sesame.pretrain([str(data / f"doc{i}.txt") for i in range(3)], str(run), family=family, size="tiny",
                    vocab_size=300, seq_len=32, batch_size=16, max_steps=40, lr=2e-3, warmup=0.1, dropout=0.0,
                    eval_every=40, progress=False)
    config = read_config(run, "--out", ("pretrained",))
    assert config["objective"] == FAMILIES[family].objective
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r["split"] == "train"]
    assert losses[-1] < 0.8 * losses[0], f"{family}: loss {losses[0]:.2f} → {losses[-1]:.2f}"
    metrics = sesame.finetune(str(run), str(data / "train.csv"), str(data / "dev.csv"), str(tmp_path / "clf"),
                              epochs=1, batch_size=8, max_length=32, progress=False)
    assert 0.0 <= metrics["accuracy"] <= 1.0
