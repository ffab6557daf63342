"""``sesame serve`` of a folder ``sesame export`` wrote: the same predictions (fields, labels, probabilities within the
export's parity bar) as serving the run it came from, micro-batched by the same worker; int8; /info from export.json;
endpoints and flags an export cannot serve refused with a JSON error or one line."""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from .conftest import onnxruntime_or_skip, refused
from .test_serve import LABELS, batches, client, concurrently, texts, write_run  # skips without the serve extra

from sesame.apps.serve import ServeSpec  # noqa: E402
from sesame.apps.serve.app import create_app, load  # noqa: E402

PARITY = 1e-4  # the bar for an fp32 export against its run (probabilities)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Random-weight bert tiny runs (a classifier and a pair classifier) and their exports: fp32 of both, int8 of
    the classifier."""
    from sesame.interop.onnx_export import to_onnx

    onnxruntime_or_skip()
    root = tmp_path_factory.mktemp("serve_export")
    for name, task, labels in (("classify", "classify", LABELS), ("pair", "pair", ["no", "yes"])):
        write_run(root, name, task, {}, labels)
        to_onnx(root / name, root / f"{name}-fp32")
    to_onnx(root / "classify", root / "classify-int8", quantize="int8")
    return root


def probabilities_apart(a: list[dict], b: list[dict]) -> float:
    return max(abs(x["probabilities"][k] - y["probabilities"][k]) for x, y in zip(a, b) for k in x["probabilities"])


PAIRS = [[a[:30], b[:30]] for a, b in zip(texts(8, seed=8), texts(8, seed=9))]  # each pair within the 24 tokens


@pytest.mark.parametrize("name, inputs", [("classify", texts(12, seed=7)), ("pair", PAIRS)])
def test_an_export_serves_the_predictions_of_its_run_micro_batched(runs, name, inputs):
    """Each input a request of its own, sent at once: the export's worker gathers them into fewer forward passes, and
    every answer has the run's fields and label, its probabilities within 1e-4 of the run's."""
    served = {}
    for model in (runs / name, runs / f"{name}-fp32"):
        app = create_app(ServeSpec(model=str(model), batch_wait_ms=300), load(str(model)))
        responses = asyncio.run(concurrently(app, [{"inputs": [x]} for x in inputs]))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        served[model.name] = [r.json()["predictions"][0] for r in responses]
        passes, features = batches(app)
        assert features == len(inputs) and passes < len(inputs)  # micro-batched
    run, export = served[name], served[f"{name}-fp32"]
    for a, b in zip(run, export):
        assert a.keys() == b.keys() and a["label"] == b["label"] and a["text"] == b["text"]
    assert probabilities_apart(run, export) <= PARITY
    assert probabilities_apart(run[:1], run[1:2]) > 1e-2  # the inputs' answers differ, so a mix-up would show


def test_an_int8_export_is_served_near_fp32(runs):
    inputs = texts(16, seed=4)
    answers = {}
    for model, quantize in (("classify-fp32", None), ("classify-int8", "int8")):
        with client(runs / model) as c:
            response = c.post("/v1/predict", json={"inputs": inputs})
            assert c.get("/info").json()["export"] == {"format": "onnx", "quantize": quantize}
        assert response.status_code == 200, response.text
        answers[model] = response.json()["predictions"]
    fp32, int8 = answers["classify-fp32"], answers["classify-int8"]
    moved = probabilities_apart(fp32, int8)
    assert 0.0 < moved < 0.05  # quantised (not the fp32 graph), and close
    for a, b in zip(fp32, int8):  # the label holds wherever fp32 is not a near-tie
        first, second = sorted(a["probabilities"].values(), reverse=True)[:2]
        if first - second > 2 * moved:
            assert a["label"] == b["label"]


def test_info_of_an_export_says_what_info_of_its_run_says_and_that_it_is_an_export(runs):
    with client(runs / "classify", max_client_batch_size=5) as c:
        of_run = c.get("/info").json()
    with client(runs / "classify-int8", max_client_batch_size=5) as c:
        of_export = c.get("/info").json()
    assert of_run["export"] is None and of_export["export"] == {"format": "onnx", "quantize": "int8"}
    assert of_export["model"] == str(runs / "classify-int8")
    for key in of_run.keys() - {"model", "export"}:  # family, size, causal, task, labels, limits, ...
        assert of_export[key] == of_run[key], key
    assert of_export["family"] == "bert" and of_export["size"] == "tiny" and of_export["labels"] == LABELS
    assert of_export["limits"]["max_input_tokens"] == 24 and of_export["limits"]["max_client_batch_size"] == 5


def test_what_an_export_cannot_serve_is_a_json_error_and_the_server_goes_on(runs):
    with client(runs / "classify-fp32") as c:
        generate = c.post("/v1/generate", json={"inputs": "The cat"})
        assert generate.status_code == 404 and generate.json()["status"] == 404
        assert "fine-tuned classify model" in generate.json()["error"] and "/v1/predict" in generate.json()["error"]
        asked = c.post("/v1/predict", json={"inputs": ["the cat"], "parameters": {"max_new_tokens": 3}})
        assert asked.status_code == 422 and "unknown field 'parameters'" in asked.json()["error"]
        long = c.post("/v1/predict", json={"inputs": " ".join(["cat"] * 40)})  # 42 tokens; the export reads 24
        assert long.status_code == 422 and "--auto-truncate" in long.json()["error"]
        assert c.post("/v1/predict", json={"inputs": "the cat"}).status_code == 200


def test_auto_truncate_cuts_an_input_for_an_export_as_for_its_run(runs):
    long = " ".join(texts(6, seed=2))
    answers = []
    for model in ("classify", "classify-fp32"):
        with client(runs / model, auto_truncate=True) as c:
            response = c.post("/v1/predict", json={"inputs": long})
        assert response.status_code == 200, response.text
        answers.append(response.json()["predictions"])
    assert probabilities_apart(*answers) <= PARITY


def test_serve_refuses_runtime_flags_an_export_cannot_follow(runs, capsys):
    export = runs / "classify-fp32"
    refused(["serve", "--model", str(export), "--precision", "bf16"], capsys, runs, "--precision", "ONNX export")
    refused(["serve", "--model", str(export), "--compile"], capsys, runs, "--compile", "ONNX export")


def test_an_export_whose_model_is_cut_short_is_one_line(runs, tmp_path, capsys):
    """onnxruntime's InvalidProtobuf came out as a traceback of `sesame serve`, and of predict and evaluate."""
    export = shutil.copytree(runs / "classify-fp32", tmp_path / "cut")
    model = export / "model.onnx"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    refused(["serve", "--model", str(export)], capsys, tmp_path, f"--model {export}", "cannot load model.onnx",
            "sesame export")


def test_the_demo_page_names_the_export_and_shows_its_label(runs, tmp_path):
    from .conftest import browser
    from .test_serve_page import Chromium

    import httpx

    from sesame.apps.serve.app import background

    chromium = Chromium(browser(), tmp_path / "profile")
    text = "The dog sleeps under the old tree."
    try:
        with background(create_app(ServeSpec(model="int8"), load(str(runs / "classify-int8")))) as url:
            expected = httpx.post(f"{url}/v1/predict", json={"inputs": text}).json()["predictions"][0]
            chromium.submit(url, text)
            about = chromium.evaluate("document.getElementById('about').textContent")
            label = chromium.wait("document.getElementById('label')?.textContent")
    finally:
        chromium.close()
    assert about.startswith("bert · tiny · classify · ONNX int8") and label == expected["label"]
