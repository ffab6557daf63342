"""sesame compare on tiny generated data: the table and its files, reuse, resumption, the baselines, bad input."""
import argparse
import csv
import functools
import hashlib
import json
import random
import signal

import pytest

import sesame.compare as compare_module
from sesame import api
from sesame.compare import COLUMNS, Task, _scratch_twins, add_parser, compare, parse_approach, run, tfidf_baseline
from sesame.errors import SesameError
from sesame.train import Interrupted, Trainer
from sesame.train.checkpoint import checkpoint_dir

from .conftest import sentences

RECIPE = "seq_len=32:batch_size=8:vocab_size=300"
APPROACHES = [f"gpt:tiny:{RECIPE}", f"gpt:tiny:{RECIPE}:lr=0.001"]
SETTINGS = dict(minutes=1, max_steps=3, epochs=2, lr=1e-3, batch_size=16, max_length=32, progress=False)
BASELINES = ["scratch:gpt:tiny", "tf-idf + logistic regression"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest on a shared CPU


ANIMALS = ["otter", "heron", "lynx", "newt"]  # none of them in the sentences' words


def animal_pairs(n: int, seed: int) -> list[str]:
    """TSV rows sentence1, sentence2, label: do the two sentences name the same animal of ANIMALS (half do)?"""
    rng = random.Random(seed)
    rows = []
    for i, (a, b) in enumerate(zip(sentences(n, seed), sentences(n, seed + 100))):
        first = rng.choice(ANIMALS)
        second = first if i % 2 else rng.choice([x for x in ANIMALS if x != first])
        rows.append(f"{a[:-1]} {first}.\tThe {second} {b.lower()}\t{'same' if first == second else 'other'}")
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A corpus and three tasks: does the text name an animal (a JSON object), a colour (a JSON list), do
    two texts name the same animal (a pair task, in a file that also sets its own fine-tuning epochs)."""
    root = tmp_path_factory.mktemp("compare-data")
    (root / "corpus.txt").write_text("\n".join(sentences(400)) + "\n")
    for name, words in (("animals", {"cat", "dog", "bird", "fish"}), ("colours", {"green", "blue"})):
        for split, seed, n in (("train", 1, 120), ("dev", 2, 40)):
            lines = ["text\tlabel"] + [f"{s}\t{'yes' if words & set(s.lower()[:-1].split()) else 'no'}"
                                       for s in sentences(n, seed)]
            (root / f"{name}-{split}.tsv").write_text("\n".join(lines) + "\n")
    (root / "animals.json").write_text(json.dumps({"name": "animals", "train": "animals-train.tsv",
                                                   "dev": "animals-dev.tsv"}))
    (root / "colours.json").write_text(json.dumps([{"name": "colours", "train": "colours-train.tsv",
                                                    "dev": "colours-dev.tsv", "text_column": "text"}]))
    for split, seed, n in (("train", 1, 160), ("dev", 2, 60)):
        (root / f"pairs-{split}.tsv").write_text("\n".join(["sentence1\tsentence2\tlabel"] + animal_pairs(n, seed)))
    (root / "pairs.json").write_text(json.dumps({"name": "pairs", "train": "pairs-train.tsv", "dev": "pairs-dev.tsv",
                                                 "text_column": "sentence1", "pair_column": "sentence2",
                                                 "epochs": 3}))
    return root


TASKS = ["animals.json", "colours.json", "pairs.json:epochs=1"]


@pytest.fixture(scope="module")
def done(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    rows = compare(APPROACHES, [str(data / "corpus.txt")], [str(data / t) for t in TASKS], str(out), **SETTINGS)
    return out, rows


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_approach_and_both_baselines_with_every_column(done):
    _, rows = done
    for task in ("animals", "colours", "pairs"):
        mine = {r["approach"]: r for r in rows if r["task"] == task}
        assert list(mine) == APPROACHES + BASELINES
        for r in mine.values():
            assert set(COLUMNS) <= set(r)
            assert r["parameters"] > 0 and r["finetune_seconds"] > 0
            assert 0 <= r["train_accuracy"] <= 1 and 0 <= r["dev_accuracy"] <= 1
        for spec in APPROACHES:  # steps × batch × sequence length
            assert mine[spec]["pretrain_tokens"] == 3 * 8 * 32 and mine[spec]["pretrain_seconds"] > 0
            assert mine[spec]["finetune_epochs"] == (1 if task == "pairs" else 2)  # the command line wins
        scratch, tfidf = mine["scratch:gpt:tiny"], mine["tf-idf + logistic regression"]
        assert scratch["parameters"] == mine[APPROACHES[0]]["parameters"]  # same architecture and tokenizer
        assert scratch["twin_of"] == APPROACHES  # so one twin serves both
        assert scratch["pretrain_tokens"] == tfidf["pretrain_tokens"] == 0 and tfidf["finetune_epochs"] is None


def test_results_are_written_as_csv_markdown_json_and_png(done):
    out, rows = done
    assert json.loads((out / "results.json").read_text())["rows"] == rows
    with open(out / "results.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(rows) == 12 and set(COLUMNS) <= set(table[0])
    md = (out / "results.md").read_text()
    assert "sesame compare --approaches" in md and "--minutes 1 --max-steps 3" in md
    assert md.count("| approach | kind | parameters |") == 3 and "## animals" in md and "## colours" in md
    assert md.count("| scratch:gpt:tiny | scratch |") == 3
    # the recipe both approaches share is said once, and the tables show what differs
    assert f"includes `{RECIPE}`" in md and md.count("| gpt:tiny | pretrained |") == 3
    assert md.count("| gpt:tiny:lr=0.001 | pretrained |") == 3 and "`scratch:gpt:tiny` for gpt:tiny, gpt:tiny:lr=0.001" in md
    assert "sentence1 + sentence2 → label; fine-tuning for this task, epochs 1;" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_call_reuses_every_cell(done, data, monkeypatch, capsys):
    out, rows = done
    before = snapshot(out)

    for module, name in ((api, "pretrain"), (api, "finetune"), (compare_module, "tfidf_baseline")):
        @functools.wraps(getattr(module, name))  # compare reads pretrain's signature
        def retrain(*args, **kwargs):
            raise AssertionError("a finished cell was run again")
        monkeypatch.setattr(module, name, retrain)
    again = compare(APPROACHES, [str(data / "corpus.txt")], [str(data / t) for t in TASKS], str(out), **SETTINGS)
    assert again == rows and snapshot(out) == before
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 + 3 * 4 and all(line.endswith("(reused)") for line in lines)


def test_changed_settings_are_refused_rather_than_mixed(done, data):
    out, _ = done
    with pytest.raises(SesameError, match="made with other settings .*minutes"):
        compare(APPROACHES, [str(data / "corpus.txt")], [str(data / "animals.json")], str(out),
                **{**SETTINGS, "minutes": 2})


def test_an_interrupted_compare_resumes(data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    spec = f"gpt2:tiny:{RECIPE}"
    args = ([spec], [str(data / "corpus.txt")], [str(data / "animals.json")], str(out))
    stray = out / "animals" / "scratch-gpt2-tiny" / "stray.txt"  # a cell that died before its first checkpoint
    stray.parent.mkdir(parents=True)
    stray.write_text("")
    step = Trainer._train_step

    def ctrl_c_at_step_two(self, wrapped):
        result = step(self, wrapped)
        if self.step == 2:
            self._request_stop(signal.SIGINT, None)
        return result

    monkeypatch.setattr(Trainer, "_train_step", ctrl_c_at_step_two)
    with pytest.raises(Interrupted, match="run the same command again"):
        compare(*args, **SETTINGS)
    monkeypatch.setattr(Trainer, "_train_step", step)
    pre = out / "pretrain" / parse_approach(spec).slug
    assert json.loads((checkpoint_dir(pre) / "trainer_state.json").read_text())["step"] == 2
    assert not (pre / "compare.json").exists()

    calls = []
    for name in ("pretrain", "finetune"):
        real = getattr(api, name)

        @functools.wraps(real)  # compare reads pretrain's signature
        def spy(*a, _name=name, _real=real, **k):
            calls.append((_name, k["resume"]))
            return _real(*a, **k)
        monkeypatch.setattr(api, name, spy)
    rows = compare(*args, **SETTINGS)
    assert calls == [("pretrain", True), ("finetune", False), ("finetune", False)]
    assert json.loads((checkpoint_dir(pre) / "trainer_state.json").read_text())["step"] == 3
    assert [r["approach"] for r in rows] == [spec, "scratch:gpt2:tiny", BASELINES[1]] and not stray.exists()

    calls.clear()  # a fine-tuned cell that lost its record is resumed, not retrained
    (out / rows[0]["run"] / "compare.json").unlink()
    again = compare(*args, **SETTINGS)
    assert calls == [("finetune", True)]
    assert [{k: r[k] for k in ("dev_accuracy", "train_accuracy", "parameters")} for r in again] == \
        [{k: r[k] for k in ("dev_accuracy", "train_accuracy", "parameters")} for r in rows]


def test_tfidf_baseline_beats_chance(labeled):
    train, dev = labeled
    result = tfidf_baseline(Task("animals", str(train), str(dev)))
    dev_labels = [line.rsplit(",", 1)[1] for line in dev.read_text().splitlines()[1:]]
    majority = max(dev_labels.count(label) for label in set(dev_labels)) / len(dev_labels)
    assert result["dev"]["accuracy"] >= max(0.85, majority + 0.1)
    assert result["train"]["accuracy"] >= result["dev"]["accuracy"] - 0.1
    assert result["C"] in compare_module.C_GRID and result["parameters"] > 100


def test_tfidf_baseline_reads_pairs_through_what_they_share(data):
    pairs = Task("pairs", str(data / "pairs-train.tsv"), str(data / "pairs-dev.tsv"), "sentence1", "label", "sentence2")
    result = tfidf_baseline(pairs)
    assert result["dev"]["accuracy"] >= 0.75  # half the pairs name the same animal: chance is 0.5
    alone = tfidf_baseline(Task("first", pairs.train, pairs.dev, "sentence1", "label"))
    assert alone["dev"]["accuracy"] < 0.65  # the first text alone says nothing about the label


def test_one_scratch_twin_per_architecture_and_tokenizer(tmp_path):
    plan = [parse_approach(spec) for spec in ("bert:mini", "spanbert:mini", "electra:mini", "roberta:mini",
                                              "albert:mini", "bert:mini:lr=1e-3")]
    for a, tokenizer in zip(plan, ("wordpiece", "wordpiece", "wordpiece", "bpe", "wordpiece", "other")):
        (tmp_path / a.slug).mkdir()
        (tmp_path / a.slug / "tokenizer.json").write_text(tokenizer)
    twins = {name: [a.spec for a in approaches] for name, approaches in _scratch_twins(plan, tmp_path).items()}
    assert twins == {"scratch:bert:mini": ["bert:mini", "spanbert:mini", "electra:mini"],
                     "scratch:roberta:mini": ["roberta:mini"],
                     "scratch:albert:mini": ["albert:mini"],  # factorised, shared layers: another architecture
                     "scratch:bert:mini:tokenizer-of-bert-mini-lr=1e-3": ["bert:mini:lr=1e-3"]}


def test_recipes_parse_into_pretrain_and_objective_options():
    approach = parse_approach("gpt:mini:lr=1:seq_len=64:masking=whole_word")
    assert (approach.family, approach.size) == ("gpt", "mini")
    assert approach.options == {"lr": 1.0, "seq_len": 64, "objective_options": {"masking": "whole_word"}}
    assert approach.slug == "gpt-mini-lr=1-seq_len=64-masking=whole_word"


@pytest.mark.parametrize("flags, message", [
    ({"--approaches": ["bert"]}, "--approaches 'bert': write FAMILY:SIZE"),
    ({"--approaches": ["bert:"]}, "--approaches 'bert:': write FAMILY:SIZE"),
    ({"--approaches": ["nope:mini"]}, "--approaches nope:mini: --family 'nope' is unknown"),
    ({"--approaches": ["bert:huge"]}, "--approaches bert:huge: --size 'huge' is unknown"),
    ({"--approaches": ["bert:mini:lr"]}, "--approaches bert:mini:lr: 'lr' should be KEY=VALUE"),
    ({"--approaches": ["bert:mini:lr=1:lr=2"]}, "each KEY once"),
    ({"--approaches": ["bert:mini:lr=fast"]}, "--approaches bert:mini:lr=fast: lr=\"fast\" should be a float"),
    ({"--approaches": ["bert:mini:max_minutes=30"]}, "max_minutes is set by compare for every approach"),
    ({"--approaches": ["gpt:mini:batch_size=30:accumulate=4"]},
     "--approaches gpt:mini:batch_size=30:accumulate=4: --accumulate"),
    ({"--approaches": ["gpt:mini", "gpt:mini"]}, "--approaches: give at least one approach, each once"),
    ({"--tasks": ["imdb"]}, "--tasks imdb: neither a built-in task"),
    ({"--tasks": ["{root}/animals.json:seed=1"]}, "'seed=1' should be KEY=VALUE with KEY one of epochs, lr"),
    ({"--tasks": ["{root}/animals.json:epochs=two"]}, 'epochs="two" should be a int, like the default epochs=3'),
    ({"--tasks": ["airline"], "--data": ["{root}/nowhere"]},
     "airline/train.csv: no such file (task airline; check --data)"),
    ({"--corpus": ["{root}/missing.txt"]}, "--corpus"),
    ({"--minutes": ["0"]}, "--minutes: must be positive"),
])
def test_bad_input_is_a_sesame_error_naming_the_flag(flags, message, data, tmp_path):
    parser = argparse.ArgumentParser(prog="sesame")
    add_parser(parser.add_subparsers(dest="command"))
    given = {"--approaches": ["gpt:tiny"], "--corpus": [str(data / "corpus.txt")],
             "--tasks": [str(data / "animals.json")], "--minutes": ["1"], "--out": [str(tmp_path / "out")], **flags}
    args = parser.parse_args(["compare"] + [x for flag, values in given.items()
                                            for x in [flag, *(v.format(root=data) for v in values)]])
    with pytest.raises(SesameError) as err:
        run(args)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()
