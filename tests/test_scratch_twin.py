"""`--from scratch:RUN`: a pretrained run's twin, its family, shape and tokenizer with new weights, fine-tuned as a
model from scratch is (issue 36: a user can always measure what pre-training bought); `--from counts:RUN`, that twin
with the token table its run's counts give."""
import importlib
import json
import shutil

import pytest
import torch

import sesame
from sesame.errors import SesameError
from sesame.families import get_family
from sesame.pipelines.starts import counted_table
from sesame.run import build_backbone, load_tokenizer
from sesame.sources import resolve_source
from sesame.train.checkpoint import load_weights

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


def test_a_counted_twin_starts_its_token_table_from_the_runs_counts(tiny_runs, tmp_path, monkeypatch):
    """`--from counts:RUN`: the twin whose token table starts as a new run of the run's shards starts it (the
    frozen probe's counts:RUN, benchmarks/feature_probe.py), to measure what the training steps bought over it."""
    loaded = []
    monkeypatch.setattr(finetune_pipeline, "load_pretrained", lambda *args, **kwargs: loaded.append(args))
    pre = tiny_runs / "pre"
    sesame.finetune(f"counts:{pre}", str(tiny_runs / "train.csv"), str(tiny_runs / "dev.csv"), str(tmp_path / "counts"),
                    max_steps=1, lr=1e-12, weight_decay=0.0, batch_size=16, max_length=32, progress=False)
    config = json.loads((tmp_path / "counts/config.json").read_text())
    tuned = json.loads((tiny_runs / "clf/config.json").read_text())
    assert config["base"] == f"counts:{pre}" and config["model"] == tuned["model"]
    assert config["train"]["lr"] == 1e-12  # as given; left out, its run's rate: the next test
    source = resolve_source(f"counts:{pre}", "--from")
    random, backbone = (torch.manual_seed(0) and build_backbone(source.config) for _ in range(2))
    counted_table(backbone, source.config, load_tokenizer(pre), progress=False)
    table = load_weights(tmp_path / "counts/model.safetensors")["backbone.embed.tokens.weight"]
    counted = (backbone.embed.tokens.weight != random.embed.tokens.weight).any(1)
    assert counted.sum() > 0  # the run's counts reached the table, and nothing else drew the counted rows
    direction = torch.nn.functional.normalize  # a counted row's norm is its own random table's mean norm
    assert torch.allclose(direction(table[counted], dim=1), direction(backbone.embed.tokens.weight[counted], dim=1),
                          atol=1e-5)
    assert loaded == []  # none of the run's trained weights


def test_a_counted_twin_needs_a_pretrained_run_with_its_shards_and_a_token_table(tiny_runs, tmp_path):
    assert resolve_source(f"counts:{tiny_runs / 'pre'}", "--from").counted
    with pytest.raises(SesameError, match="counts:RUN twins a run that `sesame pretrain` made.*finetuned"):
        resolve_source(f"counts:{tiny_runs / 'clf'}", "--from")
    with pytest.raises(SesameError, match="no such run directory; write counts:RUN"):
        resolve_source(f"counts:{tmp_path / 'none'}", "--from")
    shutil.copytree(tiny_runs / "pre", tmp_path / "moved", ignore=shutil.ignore_patterns("shards"))
    config = json.loads((tmp_path / "moved/config.json").read_text())
    config["shards"] = str(tmp_path / "moved/shards")
    (tmp_path / "moved/config.json").write_text(json.dumps(config))
    with pytest.raises(SesameError, match="names no shards folder that is still there"):
        resolve_source(f"counts:{tmp_path / 'moved'}", "--from")
    assert get_family("bert").token_table and not get_family("elmo").token_table


def test_a_counted_twin_fine_tunes_at_its_runs_rate_and_resumes_at_it(tiny_runs, tmp_path):
    pre, out = tiny_runs / "pre", tmp_path / "counts"
    options = dict(batch_size=16, max_length=32, progress=False)
    sesame.finetune(f"counts:{pre}", str(tiny_runs / "train.csv"), str(tiny_runs / "dev.csv"), str(out), max_steps=2,
                    save_every=1, **options)
    tuned = json.loads((tiny_runs / "clf/config.json").read_text())["train"]["lr"]
    assert json.loads((out / "config.json").read_text())["train"]["lr"] == tuned < 1e-3  # not a new model's 1e-3
    sesame.finetune(f"counts:{pre}", str(tiny_runs / "train.csv"), str(tiny_runs / "dev.csv"), str(out), max_steps=3,
                    resume=True, **options)
    assert json.loads((out / "config.json").read_text())["train"]["lr"] == tuned
