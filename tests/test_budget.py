"""``sesame pretrain --size auto``: the compute-optimal rule as a pure function (sesame.budget), and the command that
measures, records the choice in config.json and reuses it on --resume (the timing stubbed: no test here depends on
the machine's speed)."""
import importlib
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sesame.budget import (MIN_STEPS, SMALLEST_BATCH, TOKENS_PER_PARAMETER, Candidate, batch_for, choose,
                           measured_candidates, sizing)
from sesame.cli import main
from sesame.data.shards import Shards
from sesame.data.windows import training_windows
from sesame.errors import SesameError
from sesame.run import build_backbone, load_tokenizer, read_config
from sesame.runtime import Runtime
from sesame.specs import PretrainSpec

sizing_pipeline = importlib.import_module("sesame.pipelines.sizing")

LADDER = ("tiny", "mini", "small", "medium", "base")
# a ladder as a machine measures it: parameters grow and throughput falls with size
ladders = st.lists(st.tuples(st.integers(10_000, 10**8), st.floats(10.0, 1e6)), min_size=1, max_size=5).map(
    lambda rows: [Candidate(LADDER[i], p, r) for i, (p, r) in
                  enumerate(zip(sorted(p for p, _ in rows), sorted((r for _, r in rows), reverse=True)))])


@given(ladders, st.floats(0.1, 600), st.floats(0.1, 600))
def test_the_chosen_size_grows_with_the_budget(candidates, a, b):
    small, large = sorted((a, b))
    order = [c.size for c in candidates]
    assert order.index(choose(candidates, small).size) <= order.index(choose(candidates, large).size)


@given(ladders, st.floats(0.1, 600))
def test_the_chosen_model_is_trained_on_twenty_tokens_per_parameter_or_is_the_smallest(candidates, minutes):
    chosen = choose(candidates, minutes)
    if chosen is not candidates[0]:
        assert TOKENS_PER_PARAMETER * chosen.parameters <= chosen.tokens_per_second * 60 * minutes
    larger = candidates[candidates.index(chosen) + 1:]
    assert not any(c.fits(minutes) for c in larger)  # the largest that fits


def test_none_fits_gives_the_smallest_and_timing_stops_at_the_first_that_does_not_fit():
    rates = {"tiny": 1000.0, "mini": 100.0, "small": 10.0}
    timed = []

    def measure(size):
        timed.append(size)
        return Candidate(size, {"tiny": 1000, "mini": 10_000, "small": 100_000}[size], rates[size])

    # 1 minute: tiny affords 60,000 tokens >= 20,000; mini 6,000 < 200,000, so small is never timed
    assert [c.size for c in measured_candidates(rates, measure, 1.0)] == ["tiny", "mini"] == timed
    assert choose([measure("mini"), measure("small")], 1.0).size == "mini"  # none fits: the smallest


def test_the_batch_shrinks_until_the_budget_gives_enough_steps():
    window = 128
    enough = MIN_STEPS * 32 * window
    assert batch_for(enough, batch_size=32, window=window) == 32
    assert batch_for(enough / 2, batch_size=32, window=window) == 16
    assert batch_for(1.0, batch_size=32, window=window) == SMALLEST_BATCH
    assert batch_for(1.0, batch_size=128, window=window, accumulate=32) == 32  # a multiple of the micro-batches
    chosen = sizing(["tiny"], lambda size: Candidate(size, 10, 1.0), minutes=1, batch_size=32, window=window,
                    keep_batch=True)
    assert chosen.batch_size == 32  # a batch the user gave is kept


STUB_RATES = {128: 100_000.0, 256: 20_000.0, 512: 5_000.0}  # tokens/s by width: tiny fits 2 minutes, mini does not


@pytest.fixture
def stub_timing(monkeypatch):
    calls = []

    def rate(spec, backbone, *args, **kwargs):
        calls.append(backbone.config.hidden)
        return STUB_RATES[backbone.config.hidden]

    monkeypatch.setattr(sizing_pipeline, "tokens_per_second", rate)
    return calls


def pretrain(corpus, out, *extra):
    return main(["--no-progress", "pretrain", "--corpus", str(corpus), "--vocab-size", "200", "--seq-len", "32",
                 "--max-steps", "2", "--out", str(out), *extra])


def test_size_auto_records_its_choice_prints_it_and_resume_measures_nothing(tiny_runs, tmp_path, stub_timing,
                                                                            capsys, monkeypatch):
    run = tmp_path / "auto"
    assert pretrain(tiny_runs / "corpus.txt", run, "--size", "auto", "--max-minutes", "2") == 0
    assert stub_timing == [128, 256]  # tiny fits, mini does not: nothing larger is timed
    lines = [line for line in capsys.readouterr().err.splitlines() if "--size auto" in line]
    assert len(lines) == 1 and "--size auto: tiny" in lines[0] and "100,000 tokens/s" in lines[0]
    config = json.loads((run / "config.json").read_text())
    assert config["size"] == "tiny" and config["model"]["hidden"] == 128
    record = config["sizing"]
    assert record["size"] == "tiny" and record["measured"] == {"tiny": 100_000.0, "mini": 20_000.0}
    assert record["affordable_tokens"] == 100_000 * 60 * 2 >= TOKENS_PER_PARAMETER * record["parameters"]
    assert record["batch_size"] == config["train"]["batch_size"] and "Hoffmann" in record["rule"]

    monkeypatch.setattr(sizing_pipeline, "tokens_per_second", lambda *args, **kwargs: pytest.fail("resume measured again"))
    for given_size in ([], ["--size", "auto"]):
        before = json.loads((run / "config.json").read_text())["train"]["max_steps"]
        assert pretrain(tiny_runs / "corpus.txt", run, "--resume", *given_size, "--max-minutes", "2",
                        "--max-steps", str(before + 1)) == 0
        config = json.loads((run / "config.json").read_text())
        assert config["sizing"] == record and config["size"] == "tiny" and config["train"]["max_steps"] == before + 1


def test_an_explicit_size_measures_nothing(tiny_runs, tmp_path, stub_timing):
    assert pretrain(tiny_runs / "corpus.txt", tmp_path / "mini", "--size", "tiny", "--max-minutes", "2") == 0
    config = json.loads((tmp_path / "mini" / "config.json").read_text())
    assert stub_timing == [] and "sizing" not in config and config["size"] == "tiny"


def test_the_measurement_times_real_training_steps(tiny_runs):
    pre = tiny_runs / "pre"
    config = read_config(pre, "--from")
    spec = PretrainSpec(corpus=[str(tiny_runs / "corpus.txt")], out="unused", size="tiny", seq_len=32,
                        training={"max_minutes": 1, "batch_size": 4})
    shards = Shards(config.pretrained.shards)
    windows = (32, training_windows(shards, None, length=32, seq_len=32)[0])
    rate = sizing_pipeline.tokens_per_second(spec, build_backbone(config), load_tokenizer(pre), shards,
                                             spec.train_config(), Runtime().place(), windows=windows)
    assert math.isfinite(rate) and rate > 0


def test_a_broken_sizing_record_is_refused_naming_the_file(tiny_runs, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    config = json.loads((tiny_runs / "pre" / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "sizing": {"size": "tiny"}}))
    with pytest.raises(SesameError, match=r"config.json: a broken sizing record .*; recreate the run"):
        read_config(run, "--out")
