"""T5's multi-task mixing (Raffel et al. 2020, §3.5.2): the rates' formula, draws that follow it and depend on (seed,
draw) alone, the mixture file's reading and errors, the mean that picks a mixture's kept weights, and the spec's
refusals. End to end (fine-tuning over two tasks, resume): tests/test_text2text_cli.py."""
import json
import math
from collections import Counter

import pytest

from sesame.errors import SesameError
from sesame.specs import FinetuneSpec
from sesame.data.mixing import mixing_rates, mixture_example
from sesame.tasks.mixing import MIXING_CAP, mixture_scores, read_mixture


def test_mixing_rates_follow_t5s_formula():
    sizes = {"a": 100, "b": 1000, "c": 10000, "d": 0}
    assert mixing_rates(sizes, cap=5000) == pytest.approx({"a": 100 / 6100, "b": 1000 / 6100, "c": 5000 / 6100,
                                                           "d": 0.0})
    roots = 10 + math.sqrt(1000) + math.sqrt(5000)  # T = 2: square roots of the capped sizes
    assert mixing_rates(sizes, cap=5000, temperature=2) == pytest.approx(
        {"a": 10 / roots, "b": math.sqrt(1000) / roots, "c": math.sqrt(5000) / roots, "d": 0.0})
    assert mixing_rates(sizes, cap=5000, temperature=math.inf) == pytest.approx(
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3, "d": 0.0})  # equal mixing
    with pytest.raises(SesameError, match="temperature T=0"):
        mixing_rates(sizes, cap=10, temperature=0)


@pytest.mark.parametrize("cap, temperature", [(1000, 1.0), (1000, 2.0), (MIXING_CAP, 1.0)])
def test_drawn_tasks_and_examples_follow_the_rates(cap, temperature):
    """Over 20,000 draws each task's share is its rate r_m = min(e_m, K)^(1/T) / Σ min(e_n, K)^(1/T) (within 3.5
    standard deviations; the cap and the temperature move the rates far more than that), and a task's examples are
    drawn uniformly (each of the small task's 50 within 5 standard deviations of its expected count)."""
    sizes = {"big": 5000, "small": 50, "mid": 800, "empty": 0}
    rates = mixing_rates(sizes, cap=cap, temperature=temperature)
    n = 20000
    draws = [mixture_example(rates, sizes, seed=3, index=g) for g in range(n)]
    shares = Counter(task for task, _ in draws)
    for task, rate in rates.items():
        assert shares[task] / n == pytest.approx(rate, abs=3.5 * math.sqrt(rate * (1 - rate) / n) + 1e-9)
    assert shares["empty"] == 0
    assert all(0 <= i < sizes[task] for task, i in draws)
    small = Counter(i for task, i in draws if task == "small")
    expected = shares["small"] / 50
    assert set(small) == set(range(50)) and all(abs(c - expected) < 5 * math.sqrt(expected) for c in small.values())


def test_a_draw_depends_on_the_seed_and_its_index_alone():
    """So a resumed run draws step s's examples as the uninterrupted run did, whatever was drawn before."""
    rates, sizes = mixing_rates({"a": 30, "b": 60}, cap=100), {"a": 30, "b": 60}
    draws = [mixture_example(rates, sizes, seed=3, index=g) for g in range(200)]
    assert [mixture_example(rates, sizes, seed=3, index=g) for g in (170, 5, 170)] == [draws[170], draws[5], draws[170]]
    assert [mixture_example(rates, sizes, seed=4, index=g) for g in range(200)] != draws


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_mixture_file_names_its_tasks_files_and_reading_options(tmp_path):
    (tmp_path / "data").mkdir()
    mixture = write(tmp_path / "data" / "mix.json", {
        "mt": {"train": "train.en", "dev": str(tmp_path / "val.en"), "languages": "en-de", "prefix": "translate:"},
        "sst2": {"train": "sst2/train.tsv", "dev": "sst2/dev.tsv", "cast": "classify"}})
    assert read_mixture(mixture) == {
        "mt": {"train": str(tmp_path / "data" / "train.en"), "dev": str(tmp_path / "val.en"),  # relative to the file
               "options": {"languages": "en-de", "prefix": "translate:"}},
        "sst2": {"train": str(tmp_path / "data" / "sst2" / "train.tsv"),
                 "dev": str(tmp_path / "data" / "sst2" / "dev.tsv"), "options": {"cast": "classify"}}}


@pytest.mark.parametrize("data, message", [
    ("{", "mix.json: not valid JSON"),
    ({"mt": {"train": "a", "dev": "b"}}, "mix.json: a mixture is a JSON object of two or more tasks"),
    ([1, 2], "a mixture is a JSON object of two or more tasks"),
    ({"mt": {"train": "a"}, "b": {"train": "a", "dev": "b"}}, """task 'mt': give a JSON object with its "train" and"""),
    ({"mt": {"train": "a", "dev": "b", "beams": 4}, "b": {"train": "a", "dev": "b"}},
     "task 'mt': beams is no option of one task .* give those as --task-option"),
    ({"m t": {"train": "a", "dev": "b"}, "b": {"train": "a", "dev": "b"}}, "task 'm t': name a task with letters"),
    # a task's options are the file's, not a flag's
    ({"mt": {"train": "a", "dev": "b", "cast": "clasify"}, "b": {"train": "a", "dev": "b"}},
     "^[^ ]*mix.json: task 'mt': cast=clasify: choose one of text, classify"),
    ({"mt": {"train": "a", "dev": "b", "prefix": 3}, "b": {"train": "a", "dev": "b"}},
     "^[^ ]*mix.json: task 'mt': prefix=3 should be a str$"),
])
def test_a_bad_mixture_file_is_named_with_its_task(tmp_path, data, message):
    with pytest.raises(SesameError, match=message):
        read_mixture(write(tmp_path / "mix.json", data))


def test_the_mean_that_picks_a_mixtures_weights_reads_every_task_on_a_0_to_100_scale():
    reports = {"mt": {"bleu": 20.0, "exact": 0.1}, "sst2": {"accuracy": 0.8, "per_class": {"x": 1}},
               "stsb": {"pearson": 0.5, "spearman": 0.4}}
    scores = mixture_scores(reports, {"mt": "bleu", "sst2": "accuracy", "stsb": "pearson"})
    assert scores == {"mean": pytest.approx((20 + 80 + 50) / 3), "mt_bleu": 20.0, "mt_exact": 0.1,
                      "sst2_accuracy": 0.8, "stsb_pearson": 0.5, "stsb_spearman": 0.4}


@pytest.mark.parametrize("fields, message", [
    ({"train": "t.csv"}, "--train and --dev: give both"),
    ({"train": "t.csv", "dev": "d.csv", "mixing_cap": 10}, "--mixing-cap: sets the rates of a --mixture's tasks"),
    ({"mixture": "m.json", "train": "t.csv"}, "--mixture m.json names each task's train and dev files"),
    ({"mixture": "m.json", "task": "classify"}, "--mixture: mixes text2text tasks"),
    ({"mixture": "m.json", "mixing_temperature": 0.0}, "--mixing-temperature 0.0: a number above 0"),
    ({"mixture": "m.json", "mixing_cap": 0}, "--mixing-cap 0: must be at least 1"),
    ({"mixture": "m.json", "task_options": {"prefix": "sst2", "bos": None}}, "--task-option prefix: with --mixture"),
])
def test_the_spec_refuses_files_and_mixing_options_that_do_not_go_together(fields, message):
    spec = FinetuneSpec(base="scratch:t5:tiny", out="out", **{"task": "text2text", **fields})
    with pytest.raises(SesameError, match=message):
        spec.validate()
