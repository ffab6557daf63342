"""``sesame serve``: every endpoint, every limit's status code, micro-batched == one at a time, the API key, and the
demo page in headless Chromium. The models are written on the spot with random weights (no training)."""
from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
import torch

from .conftest import sentences

if os.environ.get("CI") != "true":  # CI installs the test extra, which has them
    for module in ("starlette", "uvicorn", "prometheus_client", "httpx"):
        pytest.importorskip(module, reason="sesame serve's extra: pip install 'sesame-nlp[serve]'")

import httpx  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from sesame.apps.serve import ServeSpec  # noqa: E402
from sesame.apps.serve.app import create_app, load  # noqa: E402

LABELS = ["animal", "none", "plant"]
pytestmark = pytest.mark.usefixtures("one_thread")


def write_run(root: Path, name: str, task: str, options: dict, labels: list[str], *, family: str = "bert",
              max_length: int = 24, seed: int = 0) -> Path:
    """A run of ``family`` tiny with random weights: fine-tuned for ``task`` (a head scaled up so that outputs differ
    clearly between inputs), or pre-trained when ``task`` is None."""
    from sesame.families import backbone_config
    from sesame.models import Transformer
    from sesame.run import FinetunedPart, PretrainedPart, RunConfig, write_config
    from sesame.tasks import make_task
    from sesame.tokenizer import train_tokenizer
    from sesame.train.checkpoint import save_weights

    torch.manual_seed(seed)
    tok = train_tokenizer(sentences(200), "bpe" if family == "gpt" else "wordpiece", 300)
    cfg = backbone_config(family, "tiny", tok.vocab_size, tok.specials.pad, 0.0, 64)
    run = root / name
    run.mkdir()
    tok.save(run / "tokenizer.json")
    if task is None:
        weights = {"backbone." + k: v for k, v in Transformer(cfg).state_dict().items()}
        config = RunConfig(kind="pretrained", family=family, size="tiny", model=cfg, pooling="last",
                           pretrained=PretrainedPart(objective="clm", seq_len=32))
    else:
        model = make_task(task, options).build(Transformer(cfg), len(labels), "mean", 0.0)
        for name_, p in model.named_parameters():
            if not name_.startswith("backbone."):
                p.data.normal_(0, 1.0)
        weights = model.state_dict()
        config = RunConfig(kind="finetuned", family=family, size="tiny", model=cfg, pooling="mean",
                           max_length=max_length,
                           finetuned=FinetunedPart(task=task, task_options=make_task(task, options).options()))
        if labels:
            (run / "labels.json").write_text(json.dumps(labels))
    save_weights(run / "model.safetensors", weights)
    write_config(run, config)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve_runs")
    write_run(root, "classify", "classify", {}, LABELS)
    write_run(root, "pair", "pair", {}, ["no", "yes"])
    write_run(root, "regress", "regress", {}, [])
    write_run(root, "tag", "tag", {}, ["B-X", "I-X", "O"])
    write_run(root, "span_qa", "span_qa", {"version": "1.1", "doc_stride": 8}, [])
    write_run(root, "gpt", None, {}, [], family="gpt")
    return root


def client(run: Path, **limits) -> TestClient:
    return TestClient(create_app(ServeSpec(model=str(run), **limits), load(str(run))))


def texts(n: int, seed: int = 0) -> list[str]:
    return [s[:60] for s in sentences(n, seed)]


def test_predict_answers_one_input_or_many_with_the_fields_of_a_predict_line(runs):
    from sesame.pipelines import load as load_predictor

    with client(runs / "classify") as c:
        one = c.post("/v1/predict", json={"inputs": "The cat sleeps."})
        many = c.post("/v1/predict", json={"inputs": texts(3)})
    assert one.status_code == 200 and many.status_code == 200
    expected = load_predictor(runs / "classify").predict(["The cat sleeps.", *texts(3)])
    got = one.json()["predictions"] + many.json()["predictions"]
    for text, line, want in zip(["The cat sleeps.", *texts(3)], got, expected):
        assert line == {"text": text, **want}  # `sesame predict`'s line: the example's fields and the prediction
        assert line["label"] in LABELS and abs(sum(line["probabilities"].values()) - 1) < 1e-4


@pytest.mark.parametrize("name, inputs, check", [
    ("pair", [["The cat sleeps.", "A dog runs."]], lambda p: p["text"] == "The cat sleeps." and p["pair"] ==
     "A dog runs." and set(p["probabilities"]) == {"no", "yes"}),
    ("regress", ["The cat sleeps."], lambda p: isinstance(p["score"], float)),
    ("tag", ["the cat sleeps", ["a", "dog", "runs"]], lambda p: len(p["tags"]) == len(p["words"]) == 3 and
     set(p["tags"]) <= {"B-X", "I-X", "O"}),
    ("span_qa", [{"question": "who sleeps", "context": " ".join(texts(4)), "id": "q1"}],
     lambda p: p["id"] == "q1" and p["answer"] and p["answer"] in p["context"] and p["n_best"]),
])
def test_every_task_predicts_as_the_predictor_does(runs, name, inputs, check):
    from sesame.pipelines import load as load_predictor

    with client(runs / name) as c:
        response = c.post("/v1/predict", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    predictor = load_predictor(runs / name)
    examples = [predictor.task.example_of(x, "test") for x in inputs]
    for line, example, want in zip(response.json()["predictions"], examples, predictor.predict(examples)):
        assert line == {**example, **want} and check(line), line


def test_each_task_reads_its_json_input_shape_and_names_the_shape_it_expects():
    from sesame.errors import SesameError
    from sesame.tasks import make_task

    assert make_task("pair").example_of(["a", "b"], "inputs[0]") == {"text": "a", "pair": "b"}
    with pytest.raises(SesameError, match=r"^inputs\[2\]: --task pair reads two non-empty texts"):
        make_task("pair").example_of("a b", "inputs[2]")
    assert make_task("tag").example_of(["New", "York"], "i") == {"words": ["New", "York"], "text": "New York"}
    with pytest.raises(SesameError, match="without spaces"):
        make_task("tag").example_of(["New York"], "i")
    with pytest.raises(SesameError, match="context"):
        make_task("span_qa").example_of({"question": "who?"}, "i")
    choice = make_task("multiple_choice")
    assert choice.example_of({"context": "c", "choices": ["x", "y"]}, "i") == {"text": "c", "choices": ["x", "y"]}
    with pytest.raises(SesameError, match="^i: no field 'choices'"):
        choice.example_of({"context": "c"}, "i")
    with pytest.raises(SesameError, match="^i: --task classify reads a non-empty text per input, not 3"):
        make_task("classify").example_of(3, "i")


def test_span_qa_reads_a_long_context_in_windows_not_refusing_it(runs):
    context = " ".join(texts(12))  # far more than the run's 24 tokens
    with client(runs / "span_qa") as c:
        response = c.post("/v1/predict", json={"inputs": [{"question": "what runs", "context": context}]})
    assert response.status_code == 200 and response.json()["predictions"][0]["answer"] in context


async def concurrently(app, bodies: list[dict]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as c:
        return await asyncio.gather(*(c.post("/v1/predict", json=body) for body in bodies))


def batches(app) -> tuple[float, float]:
    """(forward passes, features) of predictions so far, from /metrics."""
    text = TestClient(app).get("/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("sesame_batch_size_")}
    return values["sesame_batch_size_count"], values["sesame_batch_size_sum"]


def test_micro_batched_results_equal_one_at_a_time_results(runs):
    from sesame.pipelines import load as load_predictor

    inputs = texts(12, seed=3)
    app = create_app(ServeSpec(model=str(runs / "classify"), batch_wait_ms=300), load(str(runs / "classify")))
    responses = asyncio.run(concurrently(app, [{"inputs": [text]} for text in inputs]))
    passes, features = batches(app)
    assert features == 12 and passes < 12  # gathered: fewer forward passes than requests
    predictor = load_predictor(runs / "classify")
    alone = [predictor.predict([text])[0]["probabilities"] for text in inputs]
    for response, want in zip(responses, alone):
        got = response.json()["predictions"][0]["probabilities"]
        assert max(abs(got[k] - want[k]) for k in LABELS) <= 1e-5
    spread = max(abs(alone[0][k] - other[k]) for other in alone[1:] for k in LABELS)
    assert spread > 1e-2  # the inputs' answers differ, so a mix-up between requests would show


def test_without_micro_batching_each_request_is_a_forward_pass_of_its_own(runs):
    app = create_app(ServeSpec(model=str(runs / "classify"), batch_wait_ms=0), load(str(runs / "classify")))
    asyncio.run(concurrently(app, [{"inputs": texts(2, seed=i)} for i in range(5)]))
    assert batches(app) == (5, 10)


def test_one_bad_request_never_harms_another(runs):
    """A batch whose forward pass fails is run job by job: only the faulty request fails (500), and a request
    refused for its inputs (422) leaves the rest of its batch as it was."""
    from sesame.pipelines import load as load_predictor

    loaded = load(str(runs / "classify"))
    unk = loaded.model.tokenizer.specials.unk
    forward = loaded.model.outputs

    def outputs(features):
        if any(unk in f["ids"] for f in features):
            raise RuntimeError("a faulty input")
        return forward(features)

    loaded.model.outputs = outputs
    app = create_app(ServeSpec(model="classify", batch_wait_ms=300), loaded)
    good = texts(4, seed=5)
    bodies = [{"inputs": [good[0]]}, {"inputs": ["€€€ ###"]}, {"inputs": [good[1]]},
              {"inputs": [" ".join(good * 4)]}, {"inputs": [good[2]]}, {"inputs": 7}, {"inputs": [good[3]]}]
    responses = asyncio.run(concurrently(app, bodies))
    assert [r.status_code for r in responses] == [200, 500, 200, 422, 200, 422, 200]
    predictor = load_predictor(runs / "classify")
    for response, text in zip(responses[::2], good):
        assert response.json()["predictions"][0] == {"text": text, **predictor.predict([text])[0]}
    assert all(set(r.json()) == {"error", "status"} for r in responses[1::2])
    with TestClient(app) as c:  # and the server goes on
        assert c.post("/v1/predict", json={"inputs": good[0]}).status_code == 200


@pytest.mark.parametrize("limits, body, status, words", [
    ({"payload_limit": 100}, {"inputs": ["x" * 200]}, 413, ["--payload-limit 100"]),
    ({"max_client_batch_size": 2}, {"inputs": ["a", "b", "c"]}, 422, ["3 inputs", "--max-client-batch-size 2"]),
    ({}, {"inputs": [" ".join(["cat"] * 40)]}, 422, ["inputs[0]", "42 tokens", "--auto-truncate"]),
    ({"max_batch_tokens": 30}, {"inputs": ["the cat sleeps"] * 8}, 422, ["--max-batch-tokens 30"]),
    ({}, {"inputs": [["a", "b"]]}, 422, ["inputs[0]", "non-empty text"]),
    ({}, {"inputs": []}, 422, ["empty list"]),
    ({}, {"texts": ["a"]}, 422, ["unknown field 'texts'"]),
    ({}, ["a"], 422, ["JSON object"]),
])
def test_every_limit_answers_its_status_with_a_json_body(runs, limits, body, status, words):
    with client(runs / "classify", **limits) as c:
        response = c.post("/v1/predict", json=body)
        assert response.status_code == status and response.json()["status"] == status
        for word in words:
            assert word in response.json()["error"], response.json()
        assert c.post("/v1/predict", json={"inputs": "the cat"}).status_code == 200  # the server goes on


def test_auto_truncate_cuts_a_long_input_as_predict_does(runs):
    from sesame.pipelines import load as load_predictor

    long = " ".join(["cat"] * 40)
    with client(runs / "classify", auto_truncate=True) as c:
        response = c.post("/v1/predict", json={"inputs": long})
    assert response.status_code == 200
    assert response.json()["predictions"][0] == {"text": long, **load_predictor(runs / "classify").predict([long])[0]}


def test_malformed_json_unknown_routes_and_methods_are_json_errors(runs):
    with client(runs / "classify") as c:
        bad = c.post("/v1/predict", content=b'{"inputs": [', headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
        assert c.post("/v1/predict", content=b"\xff\xfe").status_code == 400
        assert c.get("/nothing").status_code == 404 and c.get("/nothing").json()["status"] == 404
        assert c.get("/v1/predict").status_code == 405 and "error" in c.get("/v1/predict").json()
        wrong = c.post("/v1/generate", json={"inputs": "The cat"})
        assert wrong.status_code == 404 and "/v1/predict" in wrong.json()["error"]


def test_more_requests_than_max_concurrent_requests_get_429(runs):
    loaded = load(str(runs / "classify"))
    gate, forward = threading.Event(), loaded.model.outputs

    def held(features):
        gate.wait(10)
        return forward(features)

    loaded.model.outputs = held
    app = create_app(ServeSpec(model="classify", max_concurrent_requests=1, batch_wait_ms=0), loaded)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as c:
            first = asyncio.create_task(c.post("/v1/predict", json={"inputs": "the cat"}))
            while app.state.server.in_flight == 0:
                await asyncio.sleep(0.01)
            second = await c.post("/v1/predict", json={"inputs": "the dog"})
            gate.set()
            return await first, second, await c.post("/v1/predict", json={"inputs": "the dog"})

    first, second, third = asyncio.run(scenario())
    assert (first.status_code, second.status_code, third.status_code) == (200, 429, 200)
    assert "--max-concurrent-requests" in second.json()["error"]


def test_the_api_key_guards_the_model_but_not_health(runs):
    with client(runs / "classify", api_key="s3cret") as c:
        assert c.post("/v1/predict", json={"inputs": "the cat"}).status_code == 401
        wrong = c.post("/v1/predict", json={"inputs": "the cat"}, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "Bearer" in wrong.json()["error"]
        assert c.get("/info").status_code == 401 and c.get("/metrics").status_code == 401
        right = {"authorization": "Bearer s3cret"}
        assert c.post("/v1/predict", json={"inputs": "the cat"}, headers=right).status_code == 200
        assert c.get("/info", headers=right).status_code == 200
        assert c.get("/health").json() == {"status": "ok"} and c.get("/").status_code == 200


def test_info_metrics_and_the_openapi_description(runs):
    with client(runs / "classify", max_client_batch_size=7) as c:
        c.post("/v1/predict", json={"inputs": ["the cat", "the dog"]})
        c.post("/v1/predict", json={"inputs": []})
        info = c.get("/info").json()
        metrics = c.get("/metrics").text
        schema = c.get("/openapi.json").json()
        routes = {route.path for route in c.app.routes}
    assert info["family"] == "bert" and info["task"] == "classify" and info["labels"] == LABELS
    assert info["limits"]["max_client_batch_size"] == 7 and info["limits"]["max_input_tokens"] == 24
    assert 'sesame_requests_total{endpoint="/v1/predict",status="200"} 1.0' in metrics
    assert 'sesame_requests_total{endpoint="/v1/predict",status="422"} 1.0' in metrics
    for name in ("sesame_request_duration_seconds_bucket", "sesame_queue_depth", "sesame_requests_in_flight",
                 "sesame_batch_size_bucket", "sesame_batch_tokens_bucket"):
        assert name in metrics, name
    assert set(schema["paths"]) == routes and schema["openapi"].startswith("3.")


def sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_generate_answers_as_sesame_generate_and_streams_the_same_text(runs):
    from sesame.generation import generate

    parameters = {"max_new_tokens": 12, "sample": True, "top_k": 20, "seed": 3}
    prompts = ["The cat", "A dog runs"]
    with client(runs / "gpt", max_new_tokens=16) as c:
        plain = c.post("/v1/generate", json={"inputs": prompts, "parameters": parameters})
        streamed = c.post("/v1/generate", json={"inputs": prompts, "parameters": parameters, "stream": True})
        assert c.post("/v1/predict", json={"inputs": "x"}).status_code == 404
    from sesame.decoding import GenerationConfig

    expected = generate(str(runs / "gpt"), prompts, GenerationConfig(**parameters), batch_size=2)
    assert plain.status_code == 200 and plain.json() == {"generations": expected}
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse(streamed.text)
    assert events[-1] == ("done", {"generations": expected})
    for i, record in enumerate(expected):
        pieces = [data["text"] for kind, data in events if kind == "token" and data["index"] == i]
        assert "".join(pieces) == record["text"] and len(pieces) >= 2  # token by token


@pytest.mark.parametrize("body, words", [
    ({"inputs": "The cat", "parameters": {"max_new_tokens": 17}}, ["max_new_tokens 17", "--max-new-tokens 16"]),
    ({"inputs": "The cat", "parameters": {"temperature": 0}}, ["temperature"]),
    ({"inputs": "The cat", "parameters": {"top_k": "5"}}, ["top_k", "int"]),
    ({"inputs": "The cat", "parameters": {"cache": False}}, ["unknown 'cache'"]),
    ({"inputs": "The cat", "stream": "yes"}, ["stream"]),
    ({"inputs": [""]}, ["inputs[0]"]),
    ({"inputs": " ".join(["cat"] * 70), "stream": True}, ["positions"]),
])
def test_generation_limits_answer_422(runs, body, words):
    with client(runs / "gpt", max_new_tokens=16) as c:
        response = c.post("/v1/generate", json=body)
        assert response.status_code == 422, response.text
        for word in words:
            assert word in response.json()["error"], response.json()
        assert c.get("/health").status_code == 200


def test_without_the_extra_the_error_says_what_to_install(monkeypatch):
    import sys

    from sesame.apps.serve import require
    from sesame.errors import SesameError

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(SesameError, match=r"uvicorn is missing.*pip install 'sesame-nlp\[serve\]'"):
        require()


@pytest.fixture
def busy_port():
    """A port of 127.0.0.1 another program listens on."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as held:
        yield held.getsockname()[1]


@pytest.mark.parametrize("argv, expected", [
    (["--model", "{root}/classify", "--port", "70000"], ["--port 70000"]),
    (["--model", "{root}/classify", "--batch-wait-ms", "-1"], ["--batch-wait-ms"]),
    (["--model", "{root}/missing"], ["--model", "missing"]),
    (["--model", "{root}/classify", "--port", "{port}"], ["--port {port}", "in use", "--port (0: any free one)"]),
    (["--model", "{root}/classify", "--host", "no-such-host.invalid"], ["--host no-such-host.invalid",
                                                                        "no such address"]),
])
def test_bad_flags_are_refused_in_one_line(runs, argv, expected, tmp_path, capsys, busy_port):
    from .conftest import refused

    given = {"root": runs, "port": busy_port}
    refused(["serve", "--api-key", "k", *(a.format(**given) for a in argv)], capsys, tmp_path,
            *(e.format(**given) for e in expected))
