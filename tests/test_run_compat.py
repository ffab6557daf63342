"""Run directories written by older sesame code still load, evaluate, predict and fine-tune the same.

tests/fixtures/runs/ holds a tiny pre-trained BERT and a classifier fine-tuned from it, written by the code
of the commit named in tests/fixtures/expected.json (before config.json became a typed, versioned schema),
with what that code computed from them; and two classifiers whose recipes inserted adapters and a scalar mix,
written when the stack's config recorded those (tests/fixtures/make_recipe_runs.py, expected_recipes.json). Their
config.json files are kept byte for byte as that code wrote them, but for their paths, made relative to the
repository; tests/fixtures/make_runs.py and make_recipe_runs.py are the record of how they were made. Do not
regenerate them to make this test pass: a failure here means the current code reads old runs differently.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sesame
from sesame.cli import main
from sesame.models.additions import Additions
from sesame.run import load_backbone

from .conftest import documents, sentences

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PRETRAINED, CLASSIFIER = FIXTURES / "runs" / "pretrained", FIXTURES / "runs" / "classifier"
ADAPTERS, FEATURES = FIXTURES / "runs" / "adapters", FIXTURES / "runs" / "features"
TRAIN_CSV, DEV_CSV, EVAL_TXT = (FIXTURES / "data" / name for name in ("train.csv", "dev.csv", "eval.txt"))
TOLERANCE = 1e-5
# config.json as the pre-refactor code wrote it: these fixtures must not be rewritten in a newer format
CONFIG_SHA256 = {
    PRETRAINED: "49b3405fc56fa32a9f99b7781ef252754dedd01530e251d5c7661a563f7484ec",
    CLASSIFIER: "91c64c563c11fc3dc5429cbfc3b1621c3c121aac0e60a83bd09fd976cae768e1",
    ADAPTERS: "ad4cf09940a91c34c95712bbe0e23d1a21ef1954cd46a0820f70e3f41f7eaea6",
    FEATURES: "2a18c90a407e8e280083aeda6985a5b9912037dd55cbcfa68a1973164596e985",
}

pytestmark = pytest.mark.usefixtures("one_thread")


def digests() -> dict[str, str]:
    return {str(p.relative_to(FIXTURES)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(FIXTURES.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module", autouse=True)
def read_only():
    """Loading, evaluating and fine-tuning from the fixtures writes nothing into them."""
    before = digests()
    yield
    assert digests() == before


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((FIXTURES / "expected.json").read_text())


def assert_close(actual, expected, where: str = "") -> None:
    """``actual`` holds everything ``expected`` does: the same strings and integers, floats within TOLERANCE
    (plus a hair, for values the code rounds to 5 or 6 decimals). Keys ``actual`` adds are allowed."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        missing = set(expected) - set(actual)
        assert not missing, f"{where}: missing {sorted(missing)}"
        for key, value in expected.items():
            assert_close(actual[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert isinstance(actual, (int, float)) and abs(actual - expected) <= TOLERANCE + 1e-9, \
            f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def test_fixtures_are_the_old_code_s_files():
    for run, digest in CONFIG_SHA256.items():
        assert hashlib.sha256((run / "config.json").read_bytes()).hexdigest() == digest, run
    assert not (PRETRAINED / "shards").exists()  # config.json names it; nothing that loads a run may need it


def test_an_old_classifier_predicts_the_same(expected):
    predictions = sesame.load(CLASSIFIER).predict(expected["texts"])
    assert [p["label"] for p in predictions] == [p["label"] for p in expected["predictions"]]
    assert_close(predictions, expected["predictions"], "predictions")
    assert sesame.predict(str(CLASSIFIER), expected["texts"][:1])[0]["label"] == expected["predictions"][0]["label"]


def test_an_old_classifier_evaluates_the_same(expected):
    assert_close(sesame.evaluate(str(CLASSIFIER), str(DEV_CSV)), expected["classifier_dev"], "classifier_dev")


def test_an_old_pretrained_run_scores_text_the_same(expected):
    report = sesame.evaluate(str(PRETRAINED), [str(EVAL_TXT)])
    for key in ("loss", "perplexity", "mlm_loss", "nsp_loss"):
        assert abs(report[key] - expected["pretrained_lm"][key]) <= TOLERANCE, key
    assert_close(report, expected["pretrained_lm"], "pretrained_lm")


def test_an_old_pretrained_run_scores_a_text_of_several_documents_as_the_changelog_says(tmp_path):
    """Cut into documents, a text evaluates as docs/run_formats.md says: since shards format 2 (merge 60e8e6b) each
    document ends in a separator and BERT's negative segments come from other documents of the file, so the numbers
    moved (the code of 2f456f2 read a file as one document and scored this text as eval.txt: perplexity 99.294,
    expected.json's). Pinned by value, so the next change fails here and gets its entry (issue 37: an old run's
    perplexity 1283.8 became 1278.7 without a word)."""
    lines = EVAL_TXT.read_text().splitlines()
    paragraphs = tmp_path / "paragraphs.txt"  # eval.txt's lines, six to a paragraph: ten documents
    paragraphs.write_text("\n\n".join("\n".join(lines[i: i + 6]) for i in range(0, len(lines), 6)) + "\n")
    report = sesame.evaluate(str(PRETRAINED), [str(paragraphs)])
    assert_close(report, {"loss": 5.296275517434784, "perplexity": 100.45283499426267, "tokens": 75,
                          "mlm_loss": 4.609688313802083, "nsp_loss": 0.6865872036327015}, "paragraphs")


def test_an_old_pretrained_run_can_be_fine_tuned_from(tmp_path, expected):
    out = tmp_path / "classifier"
    metrics = sesame.finetune(base=str(PRETRAINED), train=str(TRAIN_CSV), dev=str(DEV_CSV), out=str(out),
                              task="classify", text_column="text", label_column="label", max_length=32,
                              batch_size=8, max_steps=2, progress=False)
    assert 0 <= metrics["accuracy"] <= 1 and metrics["parameters"] > 0
    old, new = load_file(PRETRAINED / "model.safetensors"), load_file(out / "model.safetensors")
    backbone = [k for k in old if k.startswith("backbone.")]
    assert backbone and all(new[k].shape == old[k].shape for k in backbone)
    # the backbone started from the old run's weights: two warming-up fine-tuning steps move none by much, while the
    # old run's 20 pre-training steps moved some by ~5e-3 from the same seeded initialisation
    assert max(float((new[k] - old[k]).abs().max()) for k in backbone) < 5e-4
    predictions = sesame.load(out).predict(expected["texts"])
    assert len(predictions) == len(expected["texts"])
    assert {p["label"] for p in predictions} <= {"negative", "positive"}


@pytest.mark.parametrize("recorded", ["gelu", None])  # None: a config.json older still, without the field
def test_an_xlnet_run_from_before_the_tanh_gelu_loads_and_resumes_with_exact_gelu(tmp_path, recorded):
    """XLNet's runs use GELU's tanh form, as XLNet's code (issue 37); a run made before recorded exact GELU ("gelu",
    or no activation: the config's default): it loads and resumes with what it recorded."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(documents(sentences(120)))
    run, flags = tmp_path / "run", ["--no-progress", "pretrain", "--family", "xlnet", "--size", "tiny", "--corpus",
                                    str(corpus), "--vocab-size", "200", "--seq-len", "24", "--batch-size", "4"]
    assert main(flags + ["--max-steps", "1", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["activation"] == "gelu_tanh"
    assert load_backbone(run).feed_forward[0].activation.approximate == "tanh"
    if recorded is None:
        del config["model"]["activation"]
    else:
        config["model"]["activation"] = recorded
    (run / "config.json").write_text(json.dumps(config))
    assert load_backbone(run).feed_forward[0].activation.approximate == "none"
    assert main(flags + ["--max-steps", "2", "--out", str(run), "--resume"]) == 0
    assert json.loads((run / "config.json").read_text())["model"].get("activation") == recorded
    assert load_backbone(run).feed_forward[0].activation.approximate == "none"


@pytest.mark.parametrize("run, additions", [(ADAPTERS, Additions(adapter_size=4)),
                                            (FEATURES, Additions(scalar_mix=True))], ids=["adapters", "features"])
def test_an_old_run_whose_stack_config_held_its_adapters_or_mix_predicts_the_same(run, additions):
    """Before issue 34 a fine-tuned run's ``model`` recorded what its recipe inserted (``adapter_size``,
    ``scalar_mix``): read now, they are the run's ``additions``, inserted under the names the run saved (the load is
    strict), and it predicts and evaluates as the code that wrote it did. The test can tell: fresh modules in their
    place move the probabilities by more than its tolerance."""
    expected = json.loads((FIXTURES / "expected_recipes.json").read_text())
    predictor = sesame.load(run)
    assert predictor.config.additions == additions and "adapter_size" not in predictor.config.model.to_dict()
    assert_close(predictor.predict(expected["texts"]), expected[run.name]["predictions"], run.name)
    assert_close(sesame.evaluate(str(run), str(DEV_CSV)), expected[run.name]["dev"], run.name)
    additions.insert(predictor.model.backbone)  # fresh adapters or mix in place of the trained ones
    fresh = zip(predictor.predict(expected["texts"]), expected[run.name]["predictions"])
    assert max(abs(p["probabilities"][label] - e["probabilities"][label])
               for p, e in fresh for label in e["probabilities"]) > 10 * TOLERANCE


def test_an_old_adapter_run_exports_to_onnx_and_the_export_predicts_the_same(tmp_path):
    expected = json.loads((FIXTURES / "expected_recipes.json").read_text())
    assert main(["--no-progress", "export", "--model", str(ADAPTERS), "--out", str(tmp_path / "export")]) == 0
    predictions = sesame.load(tmp_path / "export").predict(expected["texts"])
    assert [p["label"] for p in predictions] == [p["label"] for p in expected["adapters"]["predictions"]]
    assert all(abs(p["probabilities"][label] - e["probabilities"][label]) <= 1e-4  # ONNX's fp32 kernels
               for p, e in zip(predictions, expected["adapters"]["predictions"]) for label in e["probabilities"])


@pytest.mark.parametrize("recipe, additions", [({"adapters": 4}, Additions(adapter_size=4)), ({}, Additions())],
                         ids=["adapters again", "none"])
def test_an_old_adapter_run_can_be_fine_tuned_from_with_its_adapters_or_without(tmp_path, recipe, additions):
    """Inserted again, the run's adapters start from its weights; not, they are left behind (the code that wrote the
    run refused that, after writing the new run's config.json) and the backbone starts from the rest of its weights."""
    out = tmp_path / "tuned"
    sesame.finetune(base=str(ADAPTERS), train=str(TRAIN_CSV), dev=str(DEV_CSV), out=str(out), task="classify",
                    max_length=32, batch_size=8, max_steps=1, lr=1e-9, progress=False, **recipe)
    assert sesame.load(out).config.additions == additions
    old, new = load_file(ADAPTERS / "model.safetensors"), load_file(out / "model.safetensors")
    assert {k for k in old if k.startswith("backbone.") and (recipe or ".adapter." not in k)} == \
        {k for k in new if k.startswith("backbone.")}
    assert all(torch.allclose(new[k], old[k], atol=1e-6) for k in new if k.startswith("backbone."))
