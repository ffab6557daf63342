"""``sesame distil``: the loss (Hinton et al. 2015's T²-scaled soft targets, logit regression), the student's
batches, the teacher's outputs computed once and kept in the run, and whole runs whose students ``evaluate`` and
``predict`` load."""
from __future__ import annotations

import csv
import hashlib
import importlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import sesame
from sesame.cli import main
from sesame.errors import SesameError
from sesame.models import build_model
from sesame.families import backbone_config
from sesame.objectives.distillation import LayerMatching, logit_loss, soft_target_loss, uniform_layer_map
from sesame.pipelines.distil import OUTPUTS, RECORD, Distillation, Distilled
from sesame.pipelines.finetune import with_learners_own
from sesame.specs import layer_pairs
from sesame.tasks import make_task
from sesame.train.checkpoint import load_weights, read_json

from .conftest import refused, shared_data, snapshot

Q = ["--no-progress"]


def test_t_squared_kl_equals_the_hand_computed_value() -> None:
    """T = 2, teacher logits (2, 0), student (1, 2): softmax(z/T) = (0.7311, 0.2689) and (0.3775, 0.6225);
    KL = 0.7311·ln(0.7311/0.3775) + 0.2689·ln(0.2689/0.6225) = 0.25740; × T² = 1.02961. A second example whose
    student equals its teacher adds nothing to the sum."""
    teacher, student = torch.tensor([[2.0, 0.0], [0.5, -1.0]]), torch.tensor([[1.0, 2.0], [0.5, -1.0]])
    p = [math.exp(1) / (math.exp(1) + 1), 1 / (math.exp(1) + 1)]
    q = [math.exp(0.5) / (math.exp(0.5) + math.exp(1)), math.exp(1) / (math.exp(0.5) + math.exp(1))]
    by_hand = 4 * sum(a * math.log(a / b) for a, b in zip(p, q))
    assert by_hand == pytest.approx(1.0296127, abs=1e-6)
    assert float(soft_target_loss(student, teacher, temperature=2.0)) == pytest.approx(by_hand, abs=1e-5)
    # at T = 1 the same logits give the unscaled KL of the plain softmaxes
    p1, q1 = torch.tensor([2.0, 0.0]).softmax(0), torch.tensor([1.0, 2.0]).softmax(0)
    assert float(soft_target_loss(student, teacher, temperature=1.0)) == pytest.approx(
        float((p1 * (p1 / q1).log()).sum()), abs=1e-5)
    # the logits' squared error: (1-2)² + (2-0)² = 5
    assert float(logit_loss(student, teacher, temperature=2.0)) == pytest.approx(5.0)


def tiny_student(n_out: int) -> torch.nn.Module:
    torch.manual_seed(0)
    backbone = build_model(backbone_config("bert", "tiny", 50, 0, 0.1).to_dict())
    return make_task("classify").build(backbone, n_out, "cls", 0.1)


def a_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 50, (4, 7), generator=torch.Generator().manual_seed(0))
    return {"ids": ids, "padding": torch.ones_like(ids, dtype=torch.bool), "targets": torch.tensor([0, 2, 1, 0]),
            "gold": torch.tensor([True, False, True, False])}


@pytest.mark.parametrize("loss", ["kl", "mse"])
def test_a_student_equal_to_its_teacher_has_loss_zero(loss: str) -> None:
    """The teacher's outputs are the student's own (dropout off): the distillation loss is 0; other outputs are not."""
    student = tiny_student(3).eval()
    batch = a_batch()
    with torch.no_grad():
        own = student.outputs(batch)
        distilled = Distilled(student, loss=loss, temperature=2.0, alpha=0.0)
        assert distilled.part_names == ("distil",)
        assert float(distilled({**batch, "teacher": own})["distil"]) == pytest.approx(0.0, abs=1e-5)
        assert float(distilled({**batch, "teacher": own + torch.tensor([1.0, 0.0, 0.0])})["distil"]) > 0.1


def test_alpha_adds_the_task_loss_of_the_gold_rows_only() -> None:
    student = tiny_student(3).eval()
    batch = a_batch()
    with torch.no_grad():
        own = student.outputs(batch)
        parts = Distilled(student, loss="kl", temperature=2.0, alpha=0.5)({**batch, "teacher": own})
        gold = batch["gold"]
        expected = torch.nn.functional.cross_entropy(own[gold], batch["targets"][gold], reduction="sum")
    assert float(parts["gold"]) == pytest.approx(float(expected), abs=1e-5)


def test_the_default_layer_map_spreads_the_student_evenly_over_the_teacher() -> None:
    """TinyBERT's uniform g(m) = m·N/M, embeddings to embeddings and top to top: 6 of 12 layers every other one,
    DistilBERT-like; 4 of 6 rounded to the nearest (halves up)."""
    assert uniform_layer_map(6, 12) == [(m, 2 * m) for m in range(7)]
    assert uniform_layer_map(2, 6) == [(0, 0), (1, 3), (2, 6)]
    assert uniform_layer_map(4, 6) == [(0, 0), (1, 2), (2, 3), (3, 5), (4, 6)]
    assert uniform_layer_map(2, 2) == [(0, 0), (1, 1), (2, 2)]


def all_states(backbone: torch.nn.Module):
    return lambda batch: backbone(batch["ids"], padding=batch["padding"], all_layers=True)


def test_layer_matching_is_zero_for_a_student_equal_to_its_teacher() -> None:
    """The teacher's states are the student's own and the widths agree, so every map is the identity and the
    hidden-state loss is 0; a teacher of other weights gives a positive loss, and one of another width gets learned
    maps from the student's width to its own."""
    student = tiny_student(3).eval()
    batch = a_batch()
    pairs = uniform_layer_map(2, 2)
    with torch.no_grad():
        same = LayerMatching(pairs, [128] * 3, [128] * 3, teacher=all_states(student.backbone), weight=0.5)
        assert all(isinstance(m, torch.nn.Identity) for m in same.maps)
        distilled = Distilled(student, loss="kl", temperature=2.0, alpha=0.0, matching=same)
        assert distilled.part_names == ("distil", "hidden") and distilled.part_weights["hidden"] == 0.5
        parts = distilled({**batch, "teacher": student.outputs(batch)})
        assert float(parts["hidden"]) == pytest.approx(0.0, abs=1e-6)
        other = tiny_student(3).eval()
        torch.nn.init.normal_(other.backbone.embed.tokens.weight)
        apart = LayerMatching(pairs, [128] * 3, [128] * 3, teacher=all_states(other.backbone), weight=1.0)
        assert float(apart(student.backbone(batch["ids"], padding=batch["padding"], all_layers=True), batch)) > 1.0
    wide = LayerMatching([(0, 0), (2, 1)], [128] * 3, [64, 256], teacher=all_states(student.backbone), weight=1.0)
    assert [tuple(m.weight.shape) for m in wide.maps] == [(64, 128), (256, 128)]


def test_a_layer_map_reads_pairs_separated_by_spaces_or_commas() -> None:
    assert layer_pairs(["0:1,1:3"]) == layer_pairs(["0:1,", "1:3"]) == layer_pairs(["0:1", "1:3"]) == [(0, 1), (1, 3)]
    with pytest.raises(SesameError, match="--layer-map 1-3"):
        layer_pairs(["0:1,1-3"])
    with pytest.raises(SesameError, match="each pair once"):
        layer_pairs(["0:1", "0:1"])


def test_the_learned_maps_decay_their_weights_but_not_their_biases() -> None:
    """Distillation's layer maps join the recipe's groups as every group splits: weights decay, biases do not."""
    student = tiny_student(3)
    matching = LayerMatching([(1, 1)], [128] * 3, [64] * 3, teacher=all_states(student.backbone), weight=1.0)
    learner = Distilled(student, loss="kl", temperature=2.0, alpha=0.0, matching=matching)
    recipe = [{"params": list(student.parameters()), "lr": 1e-3, "base_lr": 1e-3, "weight_decay": 0.01}]
    groups = with_learners_own(recipe, student, learner, lr=1e-3, weight_decay=0.01)
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay[id(matching.maps[0].weight)] == 0.01 and decay[id(matching.maps[0].bias)] == 0.0
    assert len(decay) == len(list(learner.parameters()))  # each parameter in one group
    assert with_learners_own(None, student, learner, lr=1e-3, weight_decay=0.01) is None  # AdamW's own split


def test_a_batch_carries_each_examples_teacher_row_and_marks_the_gold_ones() -> None:
    teaching = Distillation.__new__(Distillation)  # its collate reads only the teacher's outputs
    teaching.outputs = torch.arange(12, dtype=torch.float).view(4, 3)
    features = [{"example": 3, "ids": [5, 6, 7]}, {"example": 0, "ids": [5], "target": 2}]
    batch = teaching.collate(make_task("classify"), features, 0)
    assert batch["teacher"].tolist() == [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
    assert batch["gold"].tolist() == [False, True] and batch["targets"][1] == 2
    assert batch["counts"] == {"distil": 2, "gold": 1, "hidden": 4}  # hidden: the real tokens


# -- whole runs --------------------------------------------------------------------------------------------
SENTIMENTS = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Teachers that need no training, a seeded tiny transformers BERT sentiment classifier (``hf``) and its sesame
    run (``teacher``), a pretrained run (``pre``), and airline files: the first 40 rows of train and dev, and train's
    texts alone (``unlabeled.jsonl``)."""
    pytest.importorskip("transformers")
    from sesame.interop import from_hf

    from .test_interop import make_hf

    root = tmp_path_factory.mktemp("distil")
    make_hf(root / "hf", "bert", head="AutoModelForSequenceClassification", id2label=SENTIMENTS)
    from_hf(root / "hf", root / "teacher")
    make_hf(root / "hf-pre", "bert")
    from_hf(root / "hf-pre", root / "pre")
    data = shared_data() / "airline"
    for split in ("train", "dev"):
        with open(data / f"{split}.csv", newline="", encoding="utf-8") as f:
            rows = [row for _, row in zip(range(40), csv.DictReader(f))]
        with open(root / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "airline_sentiment", "airline_sentiment_confidence"],
                                    extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    with open(root / "train.csv", newline="", encoding="utf-8") as f:
        (root / "unlabeled.jsonl").write_text("".join(json.dumps({"text": row["text"]}) + "\n"
                                                      for row in csv.DictReader(f)))
    return root


def distil_command(root: Path, out: Path, *extra: str, teacher: str = "teacher") -> list[str]:
    return Q + ["distil", "--teacher", str(root / teacher), "--student", "scratch:bert:tiny", "--unlabeled",
                str(root / "unlabeled.jsonl"), "--dev", str(root / "dev.csv"), "--label-column", "airline_sentiment",
                "--batch-size", "16", "--max-length", "32", "--out", str(out), *extra]


def test_teacher_outputs_are_computed_once_and_reused_on_resume(inputs: Path, tmp_path: Path, monkeypatch, capsys,
                                                                one_thread) -> None:
    """The first run scores every example with the teacher once and keeps the rows (the teacher's own outputs, in the
    examples' order); resuming reads them back and never loads the teacher."""
    module = importlib.import_module("sesame.pipelines.distil")
    calls = []
    real = module.Predictor.outputs

    def counted(self, features):
        calls.append(len(features))
        return real(self, features)

    monkeypatch.setattr(module.Predictor, "outputs", counted)
    out = tmp_path / "student"
    first = distil_command(inputs, out, "--train", str(inputs / "train.csv"), "--alpha", "0.5")
    assert main(first + ["--max-steps", "2"]) == 0
    assert calls == [40, 40]  # the unlabeled texts, then the labeled ones
    cached = load_weights(out / OUTPUTS)["outputs"]
    record = read_json(out / RECORD)
    assert {k: v for k, v in record.items() if k != "transfer_set"} == {  # the fingerprint: the next test
        "teacher": str((inputs / "teacher").resolve()), "examples": 80, "columns": 3, "precision": "fp32"}
    texts = [json.loads(line) for line in (inputs / "unlabeled.jsonl").read_text().splitlines()]
    teacher = sesame.load(inputs / "teacher")
    assert torch.allclose(cached[:40], real(teacher, teacher.features(texts)), atol=1e-5)
    assert torch.allclose(cached[40:], cached[:40], atol=1e-5)  # the same texts, labeled
    before = (out / OUTPUTS).read_bytes()

    def no_teacher(*args, **kwargs):
        raise AssertionError("the teacher was loaded on resume")

    monkeypatch.setattr(module, "Predictor", no_teacher)
    assert main(first + ["--max-steps", "4", "--resume"]) == 0
    assert (out / OUTPUTS).read_bytes() == before
    assert read_json(out / "checkpoint" / "trainer_state.json")["step"] == 4
    config = read_json(out / "config.json")
    assert (config["kind"], config["task"], config["setup"]["alpha"], config["setup"]["loss"]) == (
        "finetuned", "classify", 0.5, "kl")
    refused(first + ["--max-steps", "6", "--resume", "--temperature", "4"], capsys, tmp_path,
            "--temperature 4", "2.0")
    before = snapshot(out)  # finished at step 4: resumed with that budget or a lower one, it writes nothing
    for budget in ("4", "2"):
        assert main(first + ["--max-steps", budget, "--resume"]) == 0
    assert snapshot(out) == before


def test_a_text_file_of_one_text_per_line_is_a_transfer_set(inputs: Path, tmp_path: Path, capsys, one_thread) -> None:
    """--unlabeled takes plain text, one text per non-blank line, as `pretrain --corpus` does: the teacher scores
    those texts, and the run records them as its transfer set. A pair teacher's two texts cannot come from it."""
    from sesame.pipelines.distil import fingerprint

    texts = [json.loads(line)["text"] for line in (inputs / "unlabeled.jsonl").read_text().splitlines()]
    texts = [text for text in texts if "\n" not in text and "\r" not in text][:20]
    (tmp_path / "unlabeled.txt").write_text("\n".join(texts[:10]) + "\n\n" + "\r\n".join(texts[10:]) + "\n")
    command = distil_command(inputs, tmp_path / "student", "--max-steps", "1")
    command[command.index("--unlabeled") + 1] = str(tmp_path / "unlabeled.txt")
    assert main(command) == 0
    record = read_json(tmp_path / "student" / RECORD)
    assert record["examples"] == 20 and record["transfer_set"] == fingerprint([{"text": text} for text in texts])
    refused(command[:-2] + ["--out", str(tmp_path / "pair"), "--pair-column", "second"], capsys, tmp_path,
            "unlabeled.txt", "--pair-column")


def test_a_second_student_reuses_the_teachers_outputs(inputs: Path, tmp_path: Path, monkeypatch,
                                                      one_thread) -> None:
    """The record of scoring carries the transfer set's fingerprint (by hand: the sha256 of each example's text as a
    canonical JSON line, none with a gold label); a second student (an LSTM, of another tokenizer) given
    --teacher-outputs gets the first run's outputs and record, bit for bit, without the teacher scoring anything, and
    resumes from its own copy once the first run is gone."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(distil_command(inputs, first, "--max-steps", "1")) == 0
    texts = [json.loads(line)["text"] for line in (inputs / "unlabeled.jsonl").read_text().splitlines()]
    lines = "".join(json.dumps([{"text": text}, False], sort_keys=True) + "\n" for text in texts)
    record = read_json(first / RECORD)
    assert record["transfer_set"] == hashlib.sha256(lines.encode()).hexdigest()

    def no_scoring(self, features):
        raise AssertionError("the teacher scored the transfer set again")

    monkeypatch.setattr(importlib.import_module("sesame.pipelines.distil").Predictor, "outputs", no_scoring)
    command = distil_command(inputs, second, "--teacher-outputs", str(first))
    command[command.index("--student") + 1] = "scratch:lstm:tiny"
    assert main(command + ["--max-steps", "1"]) == 0
    assert (second / OUTPUTS).read_bytes() == (first / OUTPUTS).read_bytes()
    assert read_json(second / RECORD) == record
    shutil.rmtree(first)
    assert main(command + ["--max-steps", "2", "--resume"]) == 0
    assert read_json(second / "checkpoint" / "trainer_state.json")["step"] == 2


def test_teacher_outputs_of_another_teacher_or_transfer_set_are_refused(inputs: Path, tmp_path: Path, capsys,
                                                                        one_thread) -> None:
    """--teacher-outputs is refused, naming itself, the record and what differs, before anything is written: one text
    changed, labeled examples added, another teacher (the same weights as a transformers directory: another path),
    another precision, and a record without a fingerprint (written before sesame made them)."""
    first, new = tmp_path / "first", tmp_path / "new"
    assert main(distil_command(inputs, first, "--max-steps", "1")) == 0
    reuse, where = ["--teacher-outputs", str(first), "--max-steps", "1"], str(first / RECORD)
    rows = (inputs / "unlabeled.jsonl").read_text().splitlines()
    rows[7] = json.dumps({"text": "@united the eighth tweet, reworded"})
    (tmp_path / "changed.jsonl").write_text("\n".join(rows) + "\n")
    changed = distil_command(inputs, new, *reuse)
    changed[changed.index("--unlabeled") + 1] = str(tmp_path / "changed.jsonl")
    refused(changed, capsys, tmp_path, f"--teacher-outputs {first}", where, "transfer_set", "drop --teacher-outputs")
    refused(distil_command(inputs, new, *reuse, "--train", str(inputs / "train.csv")), capsys, tmp_path, where,
            "examples 40 (this run: 80)", "transfer_set")
    refused(distil_command(inputs, new, *reuse, teacher="hf"), capsys, tmp_path, where,
            f"teacher {(inputs / 'teacher').resolve()} (this run: {(inputs / 'hf').resolve()})")
    record = read_json(first / RECORD)
    (first / RECORD).write_text(json.dumps({**record, "precision": "bf16"}))
    refused(distil_command(inputs, new, *reuse), capsys, tmp_path, where, "precision bf16 (this run: fp32)")
    (first / RECORD).write_text(json.dumps({k: record[k] for k in ("teacher", "examples", "columns")}))
    refused(distil_command(inputs, new, *reuse), capsys, tmp_path, f"--teacher-outputs {first}", where,
            "no fingerprint", "drop --teacher-outputs")


def test_bad_flags_are_refused_naming_themselves(inputs: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "student"
    refused(distil_command(inputs, out, "--alpha", "0.5"), capsys, tmp_path, "--alpha 0.5", "--train")
    refused(distil_command(inputs, out, "--task", "pair"), capsys, tmp_path, "--task pair", "classify")
    refused(distil_command(inputs, out, "--temperature", "0"), capsys, tmp_path, "--temperature 0")
    refused(distil_command(inputs, out, "--lm-weight", "0.5"), capsys, tmp_path, "--lm-weight")
    refused(distil_command(inputs, out, teacher="pre"), capsys, tmp_path, f"--teacher {inputs / 'pre'}", "finetuned")
    refused(distil_command(inputs, out, teacher="hf-pre"), capsys, tmp_path, f"--teacher {inputs / 'hf-pre'}")


def test_a_mixture_is_no_distil_option(inputs: Path, tmp_path: Path, capsys) -> None:
    """finetune's text2text --mixture (and its rates) are no flags of distil, whose teacher gives one row per example
    of one task; the Python API, which takes the spec's fields, refuses a mixture naming it."""
    with pytest.raises(SystemExit):
        main(distil_command(inputs, tmp_path / "student", "--mixing-cap", "8"))
    assert "unrecognized arguments: --mixing-cap 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["distil", "--help"])
    assert "--mixture" not in capsys.readouterr().out
    with pytest.raises(SesameError, match="mixture='tasks.json'"):
        sesame.distil(str(inputs / "teacher"), "scratch:bert:tiny", [str(inputs / "unlabeled.jsonl")],
                      str(inputs / "dev.csv"), str(tmp_path / "student"), mixture="tasks.json")
    assert not (tmp_path / "student").exists()


def test_a_transformers_classifier_distils_into_an_lstm_that_evaluate_and_predict_load(inputs: Path, tmp_path: Path,
                                                                                       capsys, one_thread) -> None:
    """A transformers sequence classifier teaches a scratch LSTM (another tokenizer: each reads the raw text) on
    airline text; the student's run is a classifier with the teacher's labels that ``evaluate`` and ``predict``
    load."""
    out = tmp_path / "student"
    command = distil_command(inputs, out, "--epochs", "2", "--batch-size", "8", "--json", teacher="hf")
    command[command.index("--student") + 1] = "scratch:lstm:tiny"
    assert main(command) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["n"] == 40 and 0 <= metrics["accuracy"] <= 1
    assert read_json(out / "labels.json") == list(SENTIMENTS.values())
    assert read_json(out / "config.json")["family"] == "lstm"
    assert load_weights(out / OUTPUTS)["outputs"].shape == (40, 3)
    assert main(Q + ["evaluate", "--model", str(out), "--data", str(inputs / "dev.csv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(metrics["accuracy"])
    assert main(Q + ["predict", "--model", str(out), "--input", str(inputs / "dev.csv"), "--output",
                     str(tmp_path / "predictions.jsonl")]) == 0
    predictions = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 40 and set(predictions[0]["probabilities"]) == set(SENTIMENTS.values())


def test_pair_and_regression_teachers_teach_their_tasks(inputs: Path, tmp_path: Path, one_thread) -> None:
    """A pair teacher's outputs are its scores of both texts (the student learns ``pair`` with the teacher's columns);
    a regression teacher's single score is learnt by squared error, the default, and dev scores by Pearson."""
    from .test_interop import make_hf

    shutil.copytree(inputs / "teacher", tmp_path / "pair-teacher")
    config = read_json(tmp_path / "pair-teacher" / "config.json")
    config.update(task="pair", task_options={"text_column": "first", "label_column": "airline_sentiment",
                                             "pair_column": "second", "symmetric": False})
    (tmp_path / "pair-teacher" / "config.json").write_text(json.dumps(config))
    with open(inputs / "dev.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    with open(tmp_path / "pairs.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["first", "second", "airline_sentiment"])
        writer.writerows([a["text"], b["text"], a["airline_sentiment"]] for a, b in zip(rows, rows[1:]))
    sesame.distil(str(tmp_path / "pair-teacher"), "scratch:bert:tiny", [str(tmp_path / "pairs.csv")],
                  str(tmp_path / "pairs.csv"), str(tmp_path / "pair-student"), max_steps=1, max_length=48)
    assert read_json(tmp_path / "pair-student" / "config.json")["task"] == "pair"
    examples = [{"text": a["text"], "pair": b["text"]} for a, b in zip(rows, rows[1:])]
    teacher = sesame.load(tmp_path / "pair-teacher")
    assert torch.allclose(load_weights(tmp_path / "pair-student" / OUTPUTS)["outputs"],
                          teacher.outputs(teacher.features(examples)), atol=1e-5)

    make_hf(tmp_path / "hf-regress", "bert", head="AutoModelForSequenceClassification", num_labels=1)
    metrics = sesame.distil(str(tmp_path / "hf-regress"), "scratch:lstm:tiny", [str(inputs / "unlabeled.jsonl")],
                            str(inputs / "dev.csv"), str(tmp_path / "regress-student"), max_steps=2,
                            label_column="airline_sentiment_confidence")
    assert "pearson" in metrics
    config = read_json(tmp_path / "regress-student" / "config.json")
    assert config["task"] == "regress" and config["setup"]["loss"] == "mse"  # the default for regression
    assert load_weights(tmp_path / "regress-student" / OUTPUTS)["outputs"].shape == (40, 1)


def test_a_regression_teacher_refuses_kl(inputs: Path, tmp_path: Path) -> None:
    """A regress teacher's single score has no softmax: --loss kl is refused naming it (mse is its default)."""
    from .test_interop import make_hf

    make_hf(tmp_path / "teacher", "bert", head="AutoModelForSequenceClassification", num_labels=1)
    with pytest.raises(SesameError, match="--loss kl: a regress teacher"):
        sesame.distil(str(tmp_path / "teacher"), "scratch:bert:tiny", [str(inputs / "unlabeled.jsonl")],
                      str(inputs / "dev.csv"), str(tmp_path / "student"), loss="kl")
    assert not (tmp_path / "student").exists()


def test_layer_matching_records_its_map_and_resume_holds_it(inputs: Path, tmp_path: Path, capsys, monkeypatch,
                                                            one_thread) -> None:
    """--hidden-weight with the teacher's tokenizer: the uniform map of the student's 2 layers over the teacher's 2
    lands in config.json, the checkpoint holds the learned maps (128 → 32 wide) while model.safetensors holds the
    student alone; a run killed after its step-2 checkpoint refuses another map on --resume, and resumed with the
    recorded one ends as the uninterrupted run does, maps included."""
    from .test_interrupted import Killed, kill_at_step

    out, straight = tmp_path / "student", tmp_path / "straight"
    layers = ["--hidden-weight", "1", "--tokenizer", str(inputs / "teacher"), "--max-steps", "4", "--save-every", "2"]
    assert main(distil_command(inputs, straight, *layers)) == 0
    assert read_json(straight / "config.json")["setup"]["layer_map"] == ["0:0", "1:1", "2:2"]
    whole = load_weights(straight / "checkpoint" / "model.safetensors")
    assert whole["matching.maps.1.weight"].shape == (32, 128)
    assert not any(k.startswith(("matching.", "student.")) for k in load_weights(straight / "model.safetensors"))
    kill_at_step(monkeypatch, 3)
    with pytest.raises(Killed):
        main(distil_command(inputs, out, *layers))
    monkeypatch.undo()
    halfway = load_weights(out / "checkpoint" / "model.safetensors")
    assert not torch.equal(halfway["matching.maps.1.weight"], whole["matching.maps.1.weight"])  # the maps learn
    refused(distil_command(inputs, out, *layers, "--resume", "--layer-map", "2:2"), capsys, tmp_path,
            "--layer-map 2:2", "0:0 1:1 2:2")
    # the recorded map 0:0 1:1 2:2, written in another order and with commas, is the same map
    assert main(distil_command(inputs, out, *layers, "--resume", "--layer-map", "2:2", "0:0,1:1,")) == 0
    resumed = load_weights(out / "checkpoint" / "model.safetensors")
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_layer_matching_refuses_what_it_cannot_match(inputs: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "student"
    refused(distil_command(inputs, out, "--hidden-weight", "1"), capsys, tmp_path, "--hidden-weight",
            "--tokenizer")  # a scratch student's own tokenizer reads other token ids
    with_tokenizer = ["--hidden-weight", "1", "--tokenizer", str(inputs / "teacher")]
    refused(distil_command(inputs, out, *with_tokenizer, "--layer-map", "3:1"), capsys, tmp_path,
            "--layer-map 3:1", "0 to 2")
    refused(distil_command(inputs, out, *with_tokenizer, "--layer-map", "1-1"), capsys, tmp_path, "--layer-map 1-1")
    refused(distil_command(inputs, out, "--layer-map", "1:1"), capsys, tmp_path, "--hidden-weight 0.0")
