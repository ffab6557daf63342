"""A transformers directory works wherever a run does (``resolve``): converted on the fly for
``finetune --from`` and, when it is a *ForSequenceClassification whose head maps, for ``predict``,
``evaluate`` and ``sesame.load``; sequence classifiers import as the exact inverse of their export,
and an exported classifier gives sesame's probabilities through transformers' pipeline."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import sesame  # noqa: E402
from sesame import api  # noqa: E402
from sesame.cli import main  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.interop import from_hf, resolve, to_hf  # noqa: E402
from sesame.interop import sources  # noqa: E402
from sesame.interop.sources import MINILM_INSTALL, MINILM_PACKAGE  # noqa: E402
from sesame.train.checkpoint import read_json  # noqa: E402

from .conftest import sentences, shared_data  # noqa: E402
from .test_interop import loaded, make_hf  # noqa: E402

SENTIMENTS = {0: "negative", 1: "neutral", 2: "positive"}
WORDS = ["w1 w2 w33", "w4 w90 w5 w5 w61", "w7"]  # in the tiny checkpoints' vocabularies


def hf_probabilities(folder: Path, texts: list[str]) -> torch.Tensor:
    """transformers' class probabilities for ``texts`` (its own tokenizer and model)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**tok(texts, return_tensors="pt", padding=True)).logits.softmax(-1)


def probabilities(predictions: list[dict], labels: list[str]) -> torch.Tensor:
    return torch.tensor([[p["probabilities"][name] for name in labels] for p in predictions])


# -- resolve --------------------------------------------------------------------------------------------

def test_resolve_gives_a_run_itself_and_converts_a_transformers_directory(tmp_path: Path) -> None:
    make_hf(tmp_path / "hf", "bert")
    from_hf(tmp_path / "hf", tmp_path / "run")
    with resolve(tmp_path / "run", "--from") as path:
        assert path == tmp_path / "run"
    with resolve(str(tmp_path / "hf"), "--from") as path:
        config = read_json(path / "config.json")
        assert config["kind"] == "pretrained" and config["hf"]["source"] == str((tmp_path / "hf").resolve())
    assert not path.exists()  # the temporary run is gone


@pytest.mark.parametrize("model_type, reason", [
    ("bert", "a BertModel checkpoint, without a sequence-classification head"),
    ("electra", "electra's sequence classifier does not match sesame's: its head applies GELU"),
    ("distilbert", "distilbert's sequence classifier does not match sesame's: its head is a dense layer with ReLU"),
    ("gpt2", "gpt2's sequence classifier does not match sesame's: GPT2ForSequenceClassification's score layer"),
])
def test_predicting_needs_a_head_that_maps(tmp_path: Path, model_type: str, reason: str, monkeypatch) -> None:
    """Refused with the reason, before converting anything; ``convert`` imports such a classifier's backbone."""
    head = "AutoModel" if model_type == "bert" else "AutoModelForSequenceClassification"
    make_hf(tmp_path / "hf", model_type, head=head)
    with monkeypatch.context() as patch:
        patch.setattr(sources, "from_hf", None)  # converting would fail with a TypeError
        with pytest.raises(SesameError, match=re.escape(f"--model {tmp_path / 'hf'}: {reason}")
                           + ".*" + re.escape(f"(sesame finetune --from {tmp_path / 'hf'} ...)")):
            sesame.load(tmp_path / "hf")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert summary["kind"] == "pretrained"
    notes = [] if model_type == "bert" else [reason]
    assert [n[: len(reason)] for n in summary["notes"]] == notes
    assert all(n.endswith("; its backbone alone is imported") for n in summary["notes"])


def test_minilm_without_the_package_says_how_to_install(tmp_path: Path, monkeypatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == MINILM_PACKAGE
                        else find_spec(name, *a))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm").mkdir()  # the name, not this directory
    message = f"minilm: the MiniLM weights are not installed; run `{MINILM_INSTALL}`"
    with pytest.raises(SesameError, match=re.escape(message)):
        with resolve("minilm", "--from"):
            pass


def test_finetune_from_a_transformers_directory_keeps_nothing_temporary(tmp_path: Path, labeled, monkeypatch,
                                                                        one_thread) -> None:
    """The fine-tuned run records the real directory, and works once the temporary run is removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    make_hf(tmp_path / "hf", "bert")
    train, dev = labeled
    api.finetune(str(tmp_path / "hf"), str(train), str(dev), str(tmp_path / "tuned"), epochs=1, batch_size=16,
                 max_length=32, progress=False)
    config = read_json(tmp_path / "tuned" / "config.json")
    assert config["base"] == str(tmp_path / "hf")
    assert config["hf"]["source"] == str((tmp_path / "hf").resolve()) and config["hf"]["model_type"] == "bert"
    assert str(tmp_path / "tmp") not in (tmp_path / "tuned" / "config.json").read_text()
    assert not any((tmp_path / "tmp").iterdir())
    assert len(sesame.load(tmp_path / "tuned").predict(sentences(3))) == 3


# -- sequence classifiers in ------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["bert", "roberta", "albert"])
def test_sequence_classifier_imports_exactly(tmp_path: Path, model_type: str, one_thread) -> None:
    """*ForSequenceClassification → a fine-tuned classify run (labels from id2label, cls pooling) that
    predicts transformers' probabilities, and exports back to the same checkpoint."""
    make_hf(tmp_path / "hf", model_type, head="AutoModelForSequenceClassification", id2label=SENTIMENTS)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["kind"], summary["task"], summary["dropped_heads"]) == ("finetuned", "classify", [])
    config = read_json(tmp_path / "run" / "config.json")
    assert (config["pooling"], config["max_length"]) == ("cls", 64)  # no model_max_length: all 64 positions
    labels = read_json(tmp_path / "run" / "labels.json")
    assert labels == list(SENTIMENTS.values())
    expected = hf_probabilities(tmp_path / "hf", WORDS)
    for source in (tmp_path / "run", tmp_path / "hf"):  # the run, and the directory converted on the fly
        predictions = sesame.load(source).predict(WORDS)
        assert float((probabilities(predictions, labels) - expected).abs().max()) <= 1e-5
        assert [p["label"] for p in predictions] == [SENTIMENTS[int(i)] for i in expected.argmax(1)]
    to_hf(tmp_path / "run", tmp_path / "back")
    back = loaded(tmp_path / "back", "AutoModelForSequenceClassification")
    assert back.config.id2label == SENTIMENTS
    assert float((hf_probabilities(tmp_path / "back", WORDS) - expected).abs().max()) <= 1e-6


def test_one_label_imports_as_regression(tmp_path: Path) -> None:
    original = make_hf(tmp_path / "hf", "bert", head="AutoModelForSequenceClassification", num_labels=1)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["task"], summary["labels"]) == ("regress", [])
    assert not (tmp_path / "run" / "labels.json").exists()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = original(**tok(WORDS, return_tensors="pt", padding=True)).logits[:, 0]
    scores = torch.tensor([p["score"] for p in sesame.load(tmp_path / "run").predict(WORDS)])
    assert float((scores - expected).abs().max()) <= 1e-5


def test_labels_must_name_every_id(tmp_path: Path) -> None:
    make_hf(tmp_path / "hf", "bert", head="AutoModelForSequenceClassification", id2label={0: "a", 1: "b"})
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "id2label": {"0": "a", "2": "b"}}))
    with pytest.raises(SesameError, match=re.escape(f"{path}: id2label") + ".* must name the ids 0 to 1"):
        from_hf(tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()


# -- a sesame classifier out and back ------------------------------------------------------------------------

def test_fine_tuned_classifier_through_its_exported_directory(tmp_path: Path, labeled, capsys, monkeypatch,
                                                              one_thread) -> None:
    """Fine-tune → to_hf → predict and evaluate through the directory: the run's predictions and
    metrics; its max_length comes back through model_max_length."""
    train, dev = labeled
    api.finetune("scratch:bert:tiny", str(train), str(dev), str(tmp_path / "run"), epochs=1, batch_size=16,
                 max_length=40, progress=False)
    to_hf(tmp_path / "run", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["model_max_length"] == 40
    texts = sentences(12, seed=5)
    ours, theirs = sesame.load(tmp_path / "run").predict(texts), sesame.load(tmp_path / "hf").predict(texts)
    assert [p["label"] for p in theirs] == [p["label"] for p in ours]
    labels = ["animal", "none"]
    assert float((probabilities(theirs, labels) - probabilities(ours, labels)).abs().max()) <= 1e-5

    argv = ["--no-progress", "evaluate", "--data", str(dev), "--text-column", "text", "--label-column", "label",
            "--json"]
    assert main(argv[:2] + ["--model", str(tmp_path / "run")] + argv[2:]) == 0
    assert main(argv[:2] + ["--model", str(tmp_path / "hf")] + argv[2:]) == 0
    run_report, hf_report = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert hf_report["accuracy"] == run_report["accuracy"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(texts) + "\n"))
    assert main(["predict", "--model", str(tmp_path / "hf")]) == 0
    assert [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()] == [p["label"] for p in ours]


# -- transformers' pipeline ---------------------------------------------------------------------------------

def airline_rows(n: int) -> list[dict]:
    path = shared_data() / "airline" / "train.csv"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [row for _, row in zip(range(n), csv.DictReader(fh))]
    return [{"text": row["text"], "label": row["airline_sentiment"]} for row in rows]


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_pipeline_gives_sesames_probabilities(tmp_path: Path, family: str, one_thread) -> None:
    """An exported sentiment classifier in transformers' text-classification pipeline: the label names
    and probabilities of ``sesame.load(run).predict``, on airline tweets."""
    rows = airline_rows(260)
    for name, part in (("train", rows[:200]), ("dev", rows[200:])):
        with (tmp_path / f"{name}.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, ["text", "label"])
            writer.writeheader()
            writer.writerows(part)
    api.finetune(f"scratch:{family}:tiny", str(tmp_path / "train.csv"), str(tmp_path / "dev.csv"),
                 str(tmp_path / "run"), epochs=1, batch_size=16, lr=1e-3, max_length=64, progress=False)
    to_hf(tmp_path / "run", tmp_path / "hf")
    texts = [row["text"] for row in rows[200:216]]
    ours = sesame.load(tmp_path / "run").predict(texts)
    pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), tokenizer=str(tmp_path / "hf"),
                                 top_k=None)
    theirs = pipe(texts, truncation=True)
    for mine, scores in zip(ours, theirs):
        assert {s["label"] for s in scores} == {"negative", "neutral", "positive"}
        assert max(scores, key=lambda s: s["score"])["label"] == mine["label"]
        for s in scores:
            assert abs(s["score"] - mine["probabilities"][s["label"]]) <= 1e-5
