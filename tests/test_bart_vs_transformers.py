"""scripts/bart_vs_transformers.py replays a bart run: its sesame side's losses are the run's logged ones, and
transformers' model, given the same weights and batches, follows step for step (no dropout: the same function)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import sesame

from .conftest import documents, load_script, sentences

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
race = load_script(Path(__file__).parents[1] / "scripts" / "bart_vs_transformers.py", "bart_vs_transformers")


def test_the_replay_repeats_the_run_and_transformers_follows(tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text(documents(sentences(300)))
    sesame.pretrain([str(tmp_path / "corpus.txt")], str(tmp_path / "run"), family="bart", size="tiny",
                    vocab_size=300, seq_len=32, batch_size=4, max_steps=3, eval_every=3, dropout=0.0, lr=1e-3,
                    warmup=0.3, progress=False)
    logged = {r["step"]: r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text()
                                                  .splitlines()) if r["split"] == "train"}
    race.main([str(tmp_path / "run"), "--valid", str(tmp_path / "corpus.txt"), "--every", "1", "--rows", "2"])
    lines = capsys.readouterr().out.splitlines()
    steps = {r["step"]: r for r in map(json.loads, lines[1:4])}
    assert set(steps) == {1, 2, 3} and logged and set(logged) <= set(steps)
    for step, loss in logged.items():
        assert steps[step]["sesame"] == pytest.approx(loss, abs=1e-4)
    for r in steps.values():
        assert r["transformers"] == pytest.approx(r["sesame"], abs=1e-4)
    assert steps[3]["sesame"] != steps[1]["sesame"]  # it trained
    # the source use: three losses, then the spread after the embeddings and both layers, alike on both sides
    ours, theirs = ([float(x) for line in lines[4:] if line.startswith(side) for x in re.findall(r"\d+\.\d{4}", line)]
                    for side in ("sesame", "transformers"))
    assert len(ours) == 3 + 3 and ours == pytest.approx(theirs, abs=2e-4)


def test_a_run_of_another_family_is_refused(tiny_runs, capsys):
    with pytest.raises(SystemExit) as exit:
        race.main([str(tiny_runs / "pre"), "--valid", str(tiny_runs / "corpus.txt")])
    assert exit.value.code == 2 and "a bert run of mlm_nsp; give a bart denoising run" in capsys.readouterr().err
