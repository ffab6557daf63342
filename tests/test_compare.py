"""sesame compare on tiny generated data: the table and its files, reuse, resumption, the baselines, runs
made elsewhere, per-approach fine-tuning options, bad input."""
import argparse
import csv
import hashlib
import json
import os
import random
import shutil
import signal
from pathlib import Path

import pytest

import sesame.apps.compare as compare_module
from sesame import api, pipelines
from sesame.apps.compare import COLUMNS, CompareSpec, CompareTask, parse_approach, tfidf_baseline
from sesame.apps.compare.cells import (Start, finetune_cell, pretrain_cell, pretraining_spec, prior_training,
                                      scratch_twins)
from sesame.commands.compare import add, run
from sesame.errors import SesameError
from sesame.families import FAMILIES
from sesame.pipelines.stages import RECORD
from sesame.runtime import Runtime
from sesame.train import Interrupted, Trainer
from sesame.train.checkpoint import checkpoint_dir
from sesame.train.metrics_log import read_metrics

from .conftest import sentences

RECIPE = "seq_len=32:batch_size=8:vocab_size=300"
APPROACHES = [f"gpt:tiny:{RECIPE}", f"gpt:tiny:{RECIPE}:lr=0.001"]
SETTINGS = dict(minutes=1, max_steps=3, epochs=2, lr=1e-3, batch_size=16, max_length=32, progress=False)
BASELINES = ["scratch:gpt:tiny", "tf-idf + logistic regression"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest on a shared CPU


def compare(approaches, corpus, tasks, out, **settings):
    return compare_module.compare(CompareSpec(approaches=approaches, corpus=corpus, tasks=tasks, out=out, **settings))


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


def test_what_pre_training_bought_is_read_from_each_run(done):
    out, _ = done
    pretraining = json.loads((out / "results.json").read_text())["pretraining"]
    assert [r["approach"] for r in pretraining] == APPROACHES
    for r in pretraining:
        last = [m for m in read_metrics(out / "pretrain" / parse_approach(r["approach"]).slug / "metrics.jsonl")
                if m["split"] == "dev"][-1]
        assert r["objective"] == "clm" and r["steps"] == 3 and r["tokens"] == 3 * 8 * 32
        assert r["valid_loss"] == last["loss"] and r["valid_perplexity"] == last["perplexity"]
    md = (out / "results.md").read_text()
    assert "## Pre-training" in md and md.count("| clm | 3 | 768 |") == 2


def test_a_second_call_reuses_every_cell(done, data, monkeypatch, capsys):
    out, rows = done
    before = snapshot(out)

    for module, name in ((api, "pretrain"), (api, "finetune"), (compare_module, "tfidf_baseline")):
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
    stray = out / "animals" / "scratch-gpt2-tiny" / "tokenizer.json"  # a cell that died before its config.json
    stray.parent.mkdir(parents=True)
    stray.write_text("stale")
    pre = out / "pretrain" / parse_approach(spec).slug
    assert json.loads((checkpoint_dir(pre) / "trainer_state.json").read_text())["step"] == 2
    assert not (pre / "compare.json").exists()

    calls = []
    pretrain, finetune = pipelines.pretrain, api.finetune  # what a pre-training cell and a fine-tuning cell call

    def pretrain_spy(spec):
        calls.append(("pretrain", spec.resume))
        return pretrain(spec)

    def finetune_spy(*a, **k):
        calls.append(("finetune", k["resume"]))
        return finetune(*a, **k)
    monkeypatch.setattr(pipelines, "pretrain", pretrain_spy)
    monkeypatch.setattr(api, "finetune", finetune_spy)
    rows = compare(*args, **SETTINGS)
    assert calls == [("pretrain", True), ("finetune", False), ("finetune", False)]
    assert json.loads((checkpoint_dir(pre) / "trainer_state.json").read_text())["step"] == 3
    assert [r["approach"] for r in rows] == [spec, "scratch:gpt2:tiny", BASELINES[1]]
    assert stray.read_text() != "stale"  # the dead cell was removed and made again

    calls.clear()  # a fine-tuned cell that lost its record is resumed, not retrained
    (out / rows[0]["run"] / "compare.json").unlink()
    again = compare(*args, **SETTINGS)
    assert calls == [("finetune", True)]
    assert [{k: r[k] for k in ("dev_accuracy", "train_accuracy", "parameters")} for r in again] == \
        [{k: r[k] for k in ("dev_accuracy", "train_accuracy", "parameters")} for r in rows]


def test_tfidf_baseline_beats_chance(labeled):
    train, dev = labeled
    result = tfidf_baseline(CompareTask("animals", str(train), str(dev)))
    dev_labels = [line.rsplit(",", 1)[1] for line in dev.read_text().splitlines()[1:]]
    majority = max(dev_labels.count(label) for label in set(dev_labels)) / len(dev_labels)
    assert result["dev"]["accuracy"] >= max(0.85, majority + 0.1)
    assert result["train"]["accuracy"] >= result["dev"]["accuracy"] - 0.1
    assert result["C"] in compare_module.C_GRID and result["parameters"] > 100


def test_tfidf_baseline_reads_pairs_through_what_they_share(data):
    pairs = CompareTask("pairs", str(data / "pairs-train.tsv"), str(data / "pairs-dev.tsv"), "sentence1", "label",
                        "sentence2")
    result = tfidf_baseline(pairs)
    assert result["dev"]["accuracy"] >= 0.75  # half the pairs name the same animal: chance is 0.5
    alone = tfidf_baseline(CompareTask("first", pairs.train, pairs.dev, "sentence1", "label"))
    assert alone["dev"]["accuracy"] < 0.65  # the first text alone says nothing about the label


def test_one_scratch_twin_per_architecture_and_tokenizer(tmp_path):
    plan = [parse_approach(spec) for spec in ("bert:mini", "spanbert:mini", "electra:mini", "roberta:mini",
                                              "albert:mini", "bert:mini:lr=1e-3")]
    for a, tokenizer in zip(plan, ("wordpiece", "wordpiece", "wordpiece", "bpe", "wordpiece", "other")):
        (tmp_path / a.slug).mkdir()
        (tmp_path / a.slug / "tokenizer.json").write_text(tokenizer)
    twins = {name: [a.spec for a in approaches] for name, approaches in scratch_twins(plan, tmp_path).items()}
    assert twins == {"scratch:bert:mini": ["bert:mini", "spanbert:mini", "electra:mini"],
                     "scratch:roberta:mini": ["roberta:mini"],
                     "scratch:albert:mini": ["albert:mini"],  # factorised, shared layers: another architecture
                     "scratch:bert:mini:tokenizer-of-bert-mini-lr=1e-3": ["bert:mini:lr=1e-3"]}


def test_recipes_parse_into_pretrain_and_objective_options():
    approach = parse_approach("bert:mini:lr=1:seq_len=64:masking=whole_word")
    assert (approach.family, approach.size) == ("bert", "mini")
    assert approach.options == {"lr": 1.0, "seq_len": 64, "objective_options": {"masking": "whole_word"}}
    assert approach.slug == "bert-mini-lr=1-seq_len=64-masking=whole_word"


TEACHER = Path(__file__).resolve().parent / "fixtures" / "runs" / "pretrained"  # bert tiny, mlm_nsp, one layer


def test_a_teacher_approach_pretrains_its_student_with_distilberts_weights(corpus, tmp_path):
    """``sesame pretrain --teacher`` through compare: the keys reach the spec typed, the student takes the teacher's
    family and size (compare used to give its own, which --teacher refuses), it has no from-scratch twin of
    FAMILY:SIZE's architecture, and its cell depends on the teacher's weights."""
    approach = parse_approach(f"bert:tiny:teacher={TEACHER}:kl_weight=3:mlm_weight=1:cosine_weight=0.5:temperature=4:"
                              "student_layers=[0]:seq_len=32:batch_size=4")
    assert approach.pretrains and approach.distils and not approach.has_twin
    spec = CompareSpec(approaches=[approach.spec], corpus=[str(corpus)], tasks=[], out=str(tmp_path), minutes=1,
                       max_steps=2, progress=False)
    pretraining = pretraining_spec(approach, tmp_path / "run", spec, runtime=Runtime())
    taught = pretraining.distillation
    assert (pretraining.teacher, taught.kl_weight, taught.mlm_weight, taught.cosine_weight, taught.temperature,
            taught.student_layers) == (str(TEACHER), 3.0, 1.0, 0.5, 4.0, [0])
    record, reused = pretrain_cell(approach, tmp_path / "run", spec)
    assert record["steps"] == 2 and not reused
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["family"], config["objective"], config["setup"]["kl_weight"], config["setup"]["temperature"],
            config["setup"]["student_layers"]) == ("bert", "mlm", 3.0, 4.0, [0])
    assert json.loads((tmp_path / "run" / RECORD).read_text())["settings"]["teacher"]["from"] == str(TEACHER)


@pytest.mark.parametrize("items, message", [
    ("kl_weight=2", "--approaches bert:tiny:kl_weight=2: --kl-weight: options of pre-training distillation; give "
                    "--teacher too"),
    ("teacher={teacher}:kl_weight=-1", "kl_weight=-1: --kl-weight -1.0: a weight is 0 (off) or more"),
    ("teacher={teacher}:temperature=0", "--temperature 0.0: must be positive"),
    ("teacher={teacher}:student_layers=0,1", "student_layers=0,1 should be a list of int"),
    ("teacher={teacher}:student_layers=[0,0]", "--student-layers 0 0: give each teacher layer once"),
    ("teacher={teacher}:kl_wieght=1", "kl_wieght: neither a pre-training option nor an option of the mlm objective"),
    ("teacher={teacher}:vocab_size=300", "vocab_size: a student has its teacher's family, size, tokenizer and width"),
    ("teacher={teacher}/nowhere", "nowhere: no such directory; give a pretrained masked LM run"),
    ("masking=whole_word:nsp=1", "nsp: neither a pre-training option nor an option of the mlm_nsp objective"),
])
def test_a_bad_teacher_key_or_value_is_refused_when_parsed_naming_the_approach(items, message):
    approach = f"bert:tiny:{items.format(teacher=TEACHER)}"
    with pytest.raises(SesameError) as err:
        parse_approach(approach)
    assert str(err.value).startswith(f"--approaches {approach}: ") and message in str(err.value)


def test_a_teacher_of_another_family_is_named_by_its_own():
    with pytest.raises(SesameError, match=f"a bert tiny run; write bert:tiny:teacher={TEACHER}$"):
        parse_approach(f"gpt:tiny:teacher={TEACHER}")


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
    ({"--approaches": ["cove:tiny"]}, "--approaches cove:tiny: cove is not pre-trained by compare; train it with "
                                      "`sesame cove`"),
    ({"--approaches": ["lstm:tiny:lr=1e-3"]}, "--approaches lstm:tiny:lr=1e-3: lr: pre-training options, but this "
                                              "approach (lstm) is a baseline"),
    ({"--approaches": ["gpt:tiny:from={root}/nowhere:seq_len=64"]}, "seq_len: pre-training options, but this approach "
                                                                     "starts from"),
    ({"--approaches": ["gpt:tiny:from={root}/nowhere"]}, "/nowhere: no such directory; give a run"),
    ({"--approaches": ["gpt:tiny:from={root}"]}, "neither a sesame run nor a transformers model directory"),
    ({"--approaches": ["gpt:tiny:finetune.nope=1"]}, "--approaches gpt:tiny:finetune.nope=1: finetune.nope is not a "
                                                     "fine-tuning option"),
    ({"--approaches": ["gpt:tiny:finetune.lr=fast"]}, 'finetune.lr=fast: finetune.lr="fast" should be a float'),
    ({"--approaches": ["gpt:tiny:finetune.gradual_unfreezing=1"]}, "finetune.gradual_unfreezing=1 should be a bool"),
    ({"--approaches": ["gpt:tiny:finetune.seed=1"]}, "finetune.seed is set by compare for every row"),
    ({"--approaches": ["gpt:tiny:finetune.vectors={root}/corpus.txt"]}, "finetune.vectors initialises the word"),
    ({"--approaches": ["lstm:tiny:finetune.vectors={root}/none.txt"]}, "none.txt: no such file"),
    ({"--approaches": ["lstm:tiny:finetune.pooling=best"]}, "finetune.pooling=best: choose one of"),
    ({"--approaches": ["ulmfit:tiny:finetune.schedule=cosine"]},
     "--approaches ulmfit:tiny:finetune.schedule=cosine: fine-tuning --schedule: choose one of"),
])
def test_bad_input_is_a_sesame_error_naming_the_flag(flags, message, data, tmp_path):
    parser = argparse.ArgumentParser(prog="sesame")
    add(parser.add_subparsers(dest="command"))
    given = {"--approaches": ["gpt:tiny"], "--corpus": [str(data / "corpus.txt")],
             "--tasks": [str(data / "animals.json")], "--minutes": ["1"], "--out": [str(tmp_path / "out")], **flags}
    args = parser.parse_args(["compare"] + [x for flag, values in given.items()
                                            for x in [flag, *(v.format(root=data) for v in values)]])
    with pytest.raises(SesameError) as err:
        run(args)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_failing_cell_names_its_approach_and_task(data, tmp_path):
    task = CompareTask("animals", str(data / "animals-train.tsv"), str(data / "animals-dev.tsv"))
    spec = CompareSpec(approaches=["gpt:tiny"], corpus=[], tasks=[], out=str(tmp_path), minutes=1, progress=False)
    start = Start(name="gpt:tiny:from=nowhere", base=str(tmp_path / "nowhere"), origin={})
    with pytest.raises(SesameError, match=r"^--approaches gpt:tiny:from=nowhere \(task animals\): --from .*nowhere"):
        finetune_cell(start, tmp_path / "cell", task, spec, options={"epochs": 1, "max_length": 32})
    assert not (tmp_path / "cell").exists()


def test_fine_tuning_options_precedence():
    """command < family defaults < task < approach: recurrent families fine-tune at their own rate (2e-3)."""
    common = {"epochs": 2, "lr": 1e-3, "batch_size": 16, "max_length": 32, "seed": 0}
    family = FAMILIES["lstm"].finetune
    assert family["lr"] != common["lr"]
    plain = CompareTask("plain", "train.csv", "dev.csv")
    mine = CompareTask("mine", "train.csv", "dev.csv", options={"lr": 0.05})
    assert parse_approach("gpt:tiny").fine_tuning(common, plain) == common
    lstm = parse_approach("lstm:tiny:finetune.warmup=0.2:finetune.gradual_unfreezing=true")
    assert lstm.kind == "baseline" and not lstm.pretrains and not lstm.has_twin
    assert lstm.fine_tuning(common, plain) == {**common, **family, "warmup": 0.2, "gradual_unfreezing": True}
    assert lstm.fine_tuning(common, mine)["lr"] == 0.05
    assert parse_approach("gru:tiny:finetune.lr=0.1").fine_tuning(common, mine)["lr"] == 0.1
    assert parse_approach("bert:tiny:finetune.pooling=mean:finetune.adapters=8").finetune == {"pooling": "mean",
                                                                                               "adapters": 8}


def test_feature_extractors_baselines_and_outside_runs_get_no_twin(tmp_path):
    hf = tmp_path / "hf-bert"  # a transformers directory: its architecture need not be scratch:bert:tiny's
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert"}))
    plan = [parse_approach(spec) for spec in ("elmo:tiny", "lstm:tiny", "bilstm:tiny", f"bert:tiny:from={hf}")]
    assert [a.kind for a in plan] == ["pretrained", "baseline", "baseline", "pretrained"]
    assert [a.pretrains for a in plan] == [True, False, False, False]
    assert scratch_twins(plan, tmp_path) == {}
    assert prior_training(str(hf)) == {"seconds": None, "tokens": None}


def test_prior_training_sums_the_runs_a_run_continued(tmp_path):
    """ULMFiT's target LM continues the general LM: its pre-training is both runs'."""
    def fake_run(name, config, step, batch, elapsed):
        run = tmp_path / name
        (run / "checkpoint").mkdir(parents=True)
        config = {"kind": "pretrained", "family": "ulmfit", "model": {"arch": "recurrent", "vocab_size": 8}, **config}
        (run / "config.json").write_text(json.dumps(config))
        (run / "checkpoint" / "trainer_state.json").write_text(json.dumps(
            {"step": step, "elapsed": elapsed, "config": {"batch_size": batch}}))
        return str(run)

    general = fake_run("general-lm", {"seq_len": 70, "base": None}, 100, 64, 600.0)
    target = fake_run("target-lm", {"seq_len": 70, "base": general}, 10, 64, 30.5)
    assert prior_training(target) == {"seconds": 630.5, "tokens": 110 * 64 * 70}
    cove = fake_run("cove", {}, 5, 32, 12.0)  # translation pairs: no seq_len, so no token count
    assert prior_training(cove) == {"seconds": 12.0, "tokens": None}
    (tmp_path / "general-lm" / "checkpoint" / "trainer_state.json").unlink()
    assert prior_training(target) == {"seconds": None, "tokens": None}  # half the story is no story


@pytest.fixture(scope="module")
def elsewhere(done, data, tmp_path_factory):
    """Baselines, a run pre-trained elsewhere (a copy of one of `done`'s) and per-approach fine-tuning options."""
    root = tmp_path_factory.mktemp("elsewhere")
    gpt = root / "gpt-run"
    shutil.copytree(done[0] / "pretrain" / parse_approach(APPROACHES[0]).slug, gpt)
    approaches = ["lstm:tiny", "gru:tiny:finetune.lr=0.01:finetune.epochs=1", f"gpt:tiny:from={gpt}:finetune.lr=0.003"]
    out = root / "out"
    rows = compare(approaches, [str(data / "corpus.txt")], [str(data / "animals.json")], str(out), **SETTINGS)
    return out, gpt, approaches, rows


def train_settings(out, row):
    return json.loads((out / row["run"] / "config.json").read_text())["train"]


def test_baselines_are_one_row_each_without_pretraining_or_twin(elsewhere):
    out, _, approaches, rows = elsewhere
    names = [r["approach"] for r in rows]
    assert names == [*approaches, "scratch:gpt:tiny:finetune.lr=0.003", "tf-idf + logistic regression"]
    lstm, gru = rows[0], rows[1]
    assert lstm["kind"] == gru["kind"] == "baseline" and lstm["run"] == "animals/lstm-tiny"
    assert lstm["pretrain_seconds"] == lstm["pretrain_tokens"] == 0 and 0 <= lstm["dev_accuracy"] <= 1
    assert not (out / "pretrain").exists()  # nothing was pre-trained
    # the family's defaults (lr 2e-3) over the command's lr 1e-3; the approach's over both
    family = FAMILIES["lstm"].finetune
    assert {k: train_settings(out, lstm)[k] for k in family} == family and family["lr"] != SETTINGS["lr"]
    assert train_settings(out, gru)["lr"] == 0.01 and gru["finetune_epochs"] == 1 and lstm["finetune_epochs"] == 2
    md = (out / "results.md").read_text()
    assert "| lstm:tiny | baseline | " in md and "`baseline` rows" in md and "- Pre-training:" not in md
    assert "Fine-tuned otherwise: `lstm:tiny` (lr 0.002" in md and \
        "`gru:tiny:finetune.lr=0.01:finetune.epochs=1` (epochs 1, lr 0.01" in md
    lstm_cells = next(line for line in md.splitlines() if line.startswith("| lstm:tiny |")).split(" | ")
    assert lstm_cells[3:5] == ["—", "—"] and lstm_cells[5] == "2"  # no pre-training; epochs shown


def test_a_run_from_elsewhere_is_fine_tuned_with_its_own_pretraining_time(elsewhere):
    out, gpt, approaches, rows = elsewhere
    row, twin = rows[2], rows[3]
    state = json.loads((checkpoint_dir(gpt) / "trainer_state.json").read_text())
    assert row["kind"] == "pretrained" and row["pretrain_seconds"] == round(state["elapsed"], 3) > 0
    assert row["pretrain_tokens"] == 3 * 8 * 32
    assert json.loads((out / row["run"] / "config.json").read_text())["base"] == str(gpt)
    assert train_settings(out, row)["lr"] == train_settings(out, twin)["lr"] == 0.003  # finetune.lr reaches both
    assert twin["twin_of"] == [approaches[2]] and twin["pretrain_seconds"] == 0
    vocabulary = [json.loads((run / "tokenizer.json").read_text())["model"]["vocab"] for run in (out / twin["run"], gpt)]
    assert vocabulary[0] == vocabulary[1]  # the twin uses the run's tokenizer (fine-tuning adds GPT's input tokens)
    assert "`from=` rows fine-tune an existing run" in (out / "results.md").read_text()


def test_a_changed_run_from_elsewhere_is_noticed(elsewhere, data, monkeypatch):
    out, gpt, approaches, rows = elsewhere
    for module, name in ((api, "pretrain"), (api, "finetune"), (compare_module, "tfidf_baseline")):
        def retrain(*args, **kwargs):
            raise AssertionError("a finished cell was run again")
        monkeypatch.setattr(module, name, retrain)
    args = (approaches, [str(data / "corpus.txt")], [str(data / "animals.json")], str(out))
    assert compare(*args, **SETTINGS) == rows  # unchanged: every cell reused
    weights = gpt / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    with pytest.raises(SesameError, match="made with other settings .*from"):
        compare(*args, **SETTINGS)


def test_a_run_from_elsewhere_must_match_the_approach(done):
    run = done[0] / "pretrain" / parse_approach(APPROACHES[0]).slug
    with pytest.raises(SesameError, match=f"from={run}: a gpt tiny run; write gpt:tiny:from="):
        parse_approach(f"gpt2:tiny:from={run}")
