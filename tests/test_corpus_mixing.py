"""`sesame pretrain --mixing-temperature T`: each training window drawn from one --corpus argument at T5's
temperature-scaled rate (Raffel et al. 2020, §3.5.2; the formula's own tests: tests/test_mixing.py), recorded in
config.json, a function of (seed, example) alone, and refused where it cannot apply."""
import json
import random

import pytest

import sesame
from sesame.cli import main
from sesame.data.shards import Shards
from sesame.data.windows import source_pools, training_windows, window_batches
from sesame.objectives import build_objective
from sesame.pipelines.pretrain import window_length
from sesame.run import build_backbone, load_tokenizer, read_config
from sesame.train import TrainConfig

from .conftest import refused

GREEK = "alpha beta gamma delta epsilon zeta eta theta".split()
COLOURS = "red green blue yellow purple orange black white".split()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """big.txt (Greek letters, 400 documents) and small.txt (colours, 40): no word in common."""
    folder = tmp_path_factory.mktemp("mixing")
    draw = random.Random(1)
    for name, words, n in (("big.txt", GREEK, 400), ("small.txt", COLOURS, 40)):
        (folder / name).write_text("\n\n".join(" ".join(draw.choice(words) for _ in range(40)) for _ in range(n)))
    return folder


def pretrained(sources, out, temperature, **options):
    return sesame.pretrain([str(sources / "big.txt"), str(sources / "small.txt")], str(out), size="tiny",
                           vocab_size=200, seq_len=32, batch_size=8, max_steps=2, objective="mlm",
                           mixing_temperature=temperature, progress=False, **options)


@pytest.mark.parametrize("temperature", [1.0, 100.0])
def test_windows_are_drawn_from_each_source_at_its_rate(sources, tmp_path, temperature):
    run = tmp_path / "run"
    pretrained(sources, run, temperature)
    mixing = json.loads((run / "config.json").read_text())["corpus_mixing"]
    big, small = mixing["windows"]
    assert mixing["sources"] == [str(sources / "big.txt"), str(sources / "small.txt")] and big > 5 * small > 0
    expected = big ** (1 / temperature) / (big ** (1 / temperature) + small ** (1 / temperature))
    assert mixing["rates"] == pytest.approx([expected, 1 - expected])
    config, tok = read_config(run, "--out"), load_tokenizer(run)
    shards, length = Shards(config.pretrained.shards), window_length(config)
    windows = training_windows(shards, None, length=length, seq_len=32)[0]
    assert source_pools(shards, windows, config.pretrained.corpus_mixing)[1] == {0: big, 1: small}
    obj = build_objective("mlm", build_backbone(config), tok)
    cfg = TrainConfig(batch_size=50, seed=3)
    batches = window_batches(obj, shards, [(length, windows)], cfg, mixing=config.pretrained.corpus_mixing)
    greek = {tok.backend.token_to_id(word) for word in GREEK} - {None}
    drawn = [2 * sum(i in greek for i in row) > len(row) for step in range(20) for batch in batches(step, 0)
             for row in batch["ids"].tolist()]  # a row of Greek letters (most of its tokens stay unmasked)
    share, n = sum(drawn) / len(drawn), len(drawn)
    assert abs(share - expected) < 4 * (expected * (1 - expected) / n) ** 0.5  # 1,000 draws
    again = window_batches(obj, shards, [(length, windows)], cfg, mixing=config.pretrained.corpus_mixing)
    assert all(a["ids"].equal(b["ids"]) for a, b in zip(batches(7, 0), again(7, 0)))  # (seed, example) alone


def test_a_resume_keeps_the_mixing_and_refuses_another(sources, tmp_path, capsys):
    run = tmp_path / "run"
    pretrained(sources, run, 2.0)
    corpus = ["--corpus", str(sources / "big.txt"), str(sources / "small.txt"), "--out", str(run), "--resume"]
    refused(["pretrain", *corpus, "--mixing-temperature", "3"], capsys, tmp_path, "--mixing-temperature 3",
            "was made with 2.0")
    assert main(["--no-progress", "pretrain", *corpus, "--max-steps", "3"]) == 0
    assert json.loads((run / "config.json").read_text())["corpus_mixing"]["temperature"] == 2.0
    plain = tmp_path / "plain"
    pretrained(sources, plain, None)
    refused(["pretrain", *corpus[:-3], "--out", str(plain), "--resume", "--mixing-temperature", "2"], capsys,
            tmp_path, "--mixing-temperature 2", "was made with no mixing")


@pytest.mark.parametrize("options, message", [
    ({"mixing_temperature": 0.0}, "--mixing-temperature 0: a number above 0"),
    ({"mixing_temperature": 2.0, "static_masks": 4}, "--static-masks 4 fixes a window's masks"),
])
def test_what_mixing_cannot_do_is_refused_in_one_line(sources, tmp_path, options, message):
    with pytest.raises(sesame.errors.SesameError, match=message):
        sesame.pretrain([str(sources / "big.txt"), str(sources / "small.txt")], str(tmp_path / "run"), **options)
    with pytest.raises(sesame.errors.SesameError, match="mixes two or more --corpus arguments, and one --corpus is "
                                                        "one source"):
        sesame.pretrain([str(sources / "big.txt")], str(tmp_path / "run"), mixing_temperature=2.0)
    assert not (tmp_path / "run").exists()
