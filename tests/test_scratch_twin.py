"""`--from scratch:RUN`: a pretrained run's twin, its family, shape and tokenizer with new weights, fine-tuned as a
model from scratch is (issue 36: a user can always measure what pre-training bought)."""
import importlib
import json
import shutil

import sesame
from sesame.errors import SesameError
from sesame.sources import resolve_source

import pytest

finetune_pipeline = importlib.import_module("sesame.pipelines.finetune")  # the package exports its function


def test_a_twin_is_the_runs_family_shape_and_tokenizer_with_none_of_its_weights(tiny_runs, tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr(finetune_pipeline, "load_pretrained", lambda *args, **kwargs: loaded.append(args))
    pre = tiny_runs / "pre"
    sesame.finetune(f"scratch:{pre}", str(tiny_runs / "train.csv"), str(tiny_runs / "dev.csv"), str(tmp_path / "twin"),
                    epochs=1, batch_size=16, max_length=32, progress=False)
    assert loaded == []  # no weights read from the run
    twin, tuned = (json.loads((folder / "config.json").read_text()) for folder in (tmp_path / "twin", tiny_runs / "clf"))
    assert twin["base"] == f"scratch:{pre}" and (twin["family"], twin["size"]) == (tuned["family"], tuned["size"])
    assert twin["model"] == tuned["model"]  # the shape fine-tuning from the run itself gives
    assert (tmp_path / "twin/tokenizer.json").read_bytes() == (tiny_runs / "clf/tokenizer.json").read_bytes()
    assert twin["train"]["lr"] == 1e-3 > tuned["train"]["lr"]  # trained at the rate a model from scratch is


def test_a_twin_needs_a_pretrained_run(tiny_runs, tmp_path):
    assert resolve_source(f"scratch:{tiny_runs / 'pre'}", "--from").kind == "scratch"
    with pytest.raises(SesameError, match="holds a 'finetuned' run; give a pretrained run, or scratch:FAMILY:SIZE"):
        resolve_source(f"scratch:{tiny_runs / 'clf'}", "--from")
    shutil.copytree(tiny_runs / "pre", tmp_path / "bert:tiny")  # a run's folder wins over the FAMILY:SIZE reading
    assert resolve_source(f"scratch:{tmp_path / 'bert:tiny'}", "--from").path == tmp_path / "bert:tiny"
