"""``sesame serve`` against requests that would exhaust it: texts counted before they are tokenized, a generation's
beams and decoder state bounded, malformed JSON refused in one line, a deadline per request, the work of a client that
has gone dropped or stopped, SIGTERM's drain, and the server's peak memory under oversized requests (a process of its
own). The models are written on the spot with random weights; the clocks of the deadlines are the only timing here."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import load_script
from .test_serve import client, load, runs  # noqa: F401 (runs: a fixture); it skips this module too without the extra

import httpx  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from sesame.apps.serve import ServeSpec  # noqa: E402
from sesame.apps.serve import app as serve_app  # noqa: E402
from sesame.apps.serve.app import background, create_app  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"
PEAK_GROWTH_MB = 100  # docs/serving.md states it: the idle server's peak memory grows by less under oversized requests
pytestmark = pytest.mark.usefixtures("one_thread")


def until(condition, what: str, seconds: float = 60) -> None:
    """Wait for ``condition()`` (a bounded wait, not a measurement)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def test_texts_are_counted_before_the_tokenizer_sees_them(runs):
    loaded = load(str(runs / "classify"))
    features = loaded.model.features
    seen = []
    loaded.model.features = lambda examples, **kw: seen.append(examples) or features(examples, **kw)
    app = create_app(ServeSpec(model="classify", max_batch_tokens=10), loaded)  # 16 × 10 characters a request
    with TestClient(app) as c:
        long = c.post("/v1/predict", json={"inputs": ["cat " * 41]})
        split = c.post("/v1/predict", json={"inputs": ["cat " * 20, "dog " * 21]})
        assert seen == []
        assert c.post("/v1/predict", json={"inputs": "the cat"}).status_code == 200 and len(seen) == 1
    for response in (long, split):
        assert response.status_code == 422
        assert "164 characters, more than the 160" in response.json()["error"]
        assert "--max-batch-tokens 10" in response.json()["error"]


@pytest.mark.parametrize("limits, parameters, words", [
    ({}, {"beams": 9}, ["beams 9", "--max-beams 8"]),
    ({"max_beams": 2}, {"beams": 3}, ["beams 3", "--max-beams 2"]),
    ({"max_batch_tokens": 100}, {"beams": 2, "max_new_tokens": 30},
     ["2 prompts × 2 beams", "+ 30 new tokens", "--max-batch-tokens 100"]),
])
def test_beams_and_the_decoder_state_are_bounded(runs, limits, parameters, words):
    with client(runs / "gpt", **limits) as c:
        for stream in (False, True):
            response = c.post("/v1/generate", json={"inputs": ["The cat", "A dog"], "parameters": parameters,
                                                    "stream": stream})
            assert response.status_code == 422, response.text
            for word in words:
                assert word in response.json()["error"], response.json()
        ok = c.post("/v1/generate", json={"inputs": "The cat", "parameters": {"max_new_tokens": 4}})
        assert ok.status_code == 200 and c.app.state.server.in_flight == 0
        info = c.get("/info").json()["limits"]
        assert info["max_beams"] == limits.get("max_beams", 8) and info["request_timeout"] == 60


@pytest.mark.parametrize("name, endpoint", [("classify", "/v1/predict"), ("gpt", "/v1/generate")])
def test_a_lone_surrogate_or_deep_nesting_is_400_in_one_line(runs, name, endpoint, caplog):
    bodies = {b'{"inputs": ["the \\ud800 cat"]}': "\\ud800, half of a UTF-16 surrogate pair",
              b'{"inputs": "x", "\\udfff": 1}': "\\udfff",
              b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}": "nests deeper than 32 levels",
              b'{"inputs": ' + b"[" * 40 + b'"x"' + b"]" * 40 + b"}": "nests deeper than 32 levels"}
    with caplog.at_level(logging.ERROR, logger="sesame.serve"), client(runs / name) as c:
        for body, words in bodies.items():
            response = c.post(endpoint, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400 and words in response.json()["error"], response.text
            assert "\n" not in response.json()["error"]
        pair = c.post(endpoint, content=b'{"inputs": ["the \\ud83d\\ude00 cat"]}',  # a whole pair is a character
                      headers={"content-type": "application/json"})
        assert pair.status_code == 200, pair.text
    assert not caplog.records  # nothing failed: no traceback in the log


def gated(loaded, gate: threading.Event) -> list[list[dict]]:
    """Hold ``loaded``'s forward passes until ``gate`` is set (bounded); the features of each, in order."""
    forward, passes = loaded.model.outputs, []

    def held(features):
        passes.append(features)
        gate.wait(60)
        return forward(features)

    loaded.model.outputs = held
    return passes


def test_past_the_deadline_a_running_request_gets_504_and_a_queued_one_503_unrun(runs):
    loaded = load(str(runs / "classify"))
    gate = threading.Event()
    passes = gated(loaded, gate)
    app = create_app(ServeSpec(model="classify", batch_wait_ms=0, request_timeout=3), loaded)
    server = app.state.server

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve") as c:
            running = asyncio.create_task(c.post("/v1/predict", json={"inputs": "the cat"}))
            while not passes:  # the first request is on the model
                await asyncio.sleep(0.01)
            queued = await c.post("/v1/predict", json={"inputs": "the dog"})
            running = await running
            gate.set()
            await asyncio.to_thread(until, lambda: server.in_flight == 0, "the requests to be let go")
            return running, queued

    running, queued = asyncio.run(scenario())
    assert running.status_code == 504 and "--request-timeout of 3 s" in running.json()["error"]
    assert queued.status_code == 503 and "waited for the model" in queued.json()["error"]
    assert len(passes) == 1  # the queued request never reached the model
    assert TestClient(app).post("/v1/predict", json={"inputs": "the dog"}).status_code == 200  # the server goes on


def held_generation(monkeypatch, loaded, at: int) -> list[int]:
    """Hold ``loaded``'s generation at its forward pass ``at`` until the server marks the job gone (bounded); the
    forward passes it made."""
    gone, real = [], serve_app.stopping

    def stopping(module, event):
        gone.append(event)
        return real(module, event)

    monkeypatch.setattr(serve_app, "stopping", stopping)
    passes = []

    def hold(module, args):
        passes.append(1)
        if len(passes) == at:
            gone[-1].wait(60)

    loaded.generator.backbone.embed.register_forward_pre_hook(hold)
    return passes


def test_a_generation_past_its_deadline_gets_504_and_stops_at_its_next_token(runs, monkeypatch):
    loaded = load(str(runs / "gpt"))
    passes = held_generation(monkeypatch, loaded, 3)
    app = create_app(ServeSpec(model="gpt", request_timeout=3), loaded)
    with TestClient(app) as c:
        response = c.post("/v1/generate", json={"inputs": "The cat", "parameters": {"max_new_tokens": 40}})
        assert response.status_code == 504 and "--request-timeout" in response.json()["error"]
        until(lambda: app.state.server.in_flight == 0, "the generation to stop")
    assert len(passes) == 3  # not 40: the pass after the deadline was the last


def raw_post(url: str, path: str, body: dict) -> socket.socket:
    """A connection that has sent ``POST path`` with ``body`` and reads nothing."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    connection = socket.create_connection((host, int(port)), timeout=60)
    connection.sendall(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                       f"content-length: {len(data)}\r\n\r\n".encode() + data)
    return connection


def test_a_body_that_does_not_arrive_by_the_deadline_gets_408(runs):
    app = create_app(ServeSpec(model="classify", request_timeout=1), load(str(runs / "classify")))
    with background(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as connection:
            connection.sendall(b"POST /v1/predict HTTP/1.1\r\nhost: serve\r\ncontent-type: application/json\r\n"
                               b'content-length: 100\r\n\r\n{"inputs": ')  # and the rest never comes
            answer = b""
            while b"}" not in answer and (piece := connection.recv(65536)):  # to the end of the JSON body
                answer += piece
        assert answer.startswith(b"HTTP/1.1 408") and b"--request-timeout of 1 s" in answer, answer
        assert app.state.server.in_flight == 0


def test_a_queued_request_whose_client_leaves_is_dropped_unrun(runs):
    loaded = load(str(runs / "classify"))
    gate = threading.Event()
    passes = gated(loaded, gate)
    app = create_app(ServeSpec(model="classify", batch_wait_ms=0), loaded)
    server = app.state.server
    with background(app) as url:
        first = {}
        thread = threading.Thread(target=lambda: first.update(
            response=httpx.post(f"{url}/v1/predict", json={"inputs": "the cat"}, timeout=60)))
        thread.start()
        until(lambda: passes, "the first request to reach the model")
        leaving = raw_post(url, "/v1/predict", {"inputs": "the dog"})
        until(lambda: server.worker.depth() == 1, "the second request to be queued")
        leaving.close()
        until(lambda: 'status="499"} 1.0' in httpx.get(f"{url}/metrics").text, "the server to see the client go")
        gate.set()
        thread.join(60)
        until(lambda: server.in_flight == 0, "the dropped request to be let go")
    assert first["response"].status_code == 200 and len(passes) == 1  # the client that left: never on the model


@pytest.mark.parametrize("at", [1, 3], ids=["before its first token", "streaming"])
def test_a_generation_whose_client_leaves_stops_at_the_next_token(runs, monkeypatch, at):
    loaded = load(str(runs / "gpt"))
    passes = held_generation(monkeypatch, loaded, at)
    app = create_app(ServeSpec(model="gpt"), loaded)
    with background(app) as url:
        for stream in (False, True):
            passes.clear()
            leaving = raw_post(url, "/v1/generate", {"inputs": "The cat", "parameters": {"max_new_tokens": 40},
                                                     "stream": stream})
            until(lambda: len(passes) == at, "the generation to reach the held pass")
            leaving.close()
            until(lambda: app.state.server.in_flight == 0, "the generation to stop")
            assert len(passes) == at, stream  # not 40


GATED_SERVE = """
import signal, sys, time
from pathlib import Path
import sesame.apps.serve.app as app
from sesame.cli import main

# Ctrl-C as a terminal delivers it: a background job of a script (``nohup pytest ... &``) starts with SIGINT ignored,
# and a server started so drains on SIGINT and then exits 0, since the ignored signal uvicorn raises again is ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
gate, load = Path(sys.argv[1]), app.load

def held(model, **kw):  # its generation's third forward pass waits until the file ``gate`` exists
    loaded, passes = load(model, **kw), []
    def hold(module, args):
        passes.append(1)
        for _ in range(6000 if len(passes) == 3 else 0):
            if gate.exists():
                break
            time.sleep(0.01)
    loaded.generator.backbone.embed.register_forward_pre_hook(hold)
    return loaded

app.load = held
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("stop, status", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)],
                         ids=["SIGTERM ends by the signal (a shell's 143)", "Ctrl-C ends with 130"])
def test_a_signal_answers_the_request_in_flight_then_ends_the_server(runs, tmp_path, stop, status):
    served = load_script(SCRIPT, "benchmark_serve_load").served
    gate = tmp_path / "gate"
    command = [sys.executable, "-c", GATED_SERVE, str(gate), "--no-progress", "serve", "--model", str(runs / "gpt"),
               "--port", "0"]
    with served(command) as (url, process):
        body = {"inputs": "The cat", "parameters": {"max_new_tokens": 12}, "stream": True}
        with httpx.stream("POST", f"{url}/v1/generate", json=body, timeout=120) as response:
            lines = response.iter_lines()
            assert next(lines) == "event: token"  # the generation is under way, held at its third token
            process.send_signal(stop)
            gate.touch()
            rest = list(lines)
        assert process.wait(120) == status
    done = json.loads(rest[rest.index("event: done") + 1].removeprefix("data: "))
    assert done["generations"][0]["new_tokens"] == 12  # the request in flight was answered in full
    log = "".join(process.log)
    assert "Shutting down" in log and "Traceback" not in log
    if stop == signal.SIGINT:
        assert process.log[-1].startswith("sesame: stopped by Ctrl-C"), process.log[-3:]


def test_peak_memory_stays_bounded_under_oversized_requests_and_each_is_refused(runs):
    """The acceptance load test: 48 oversized requests from 16 clients on 127.0.0.1 to ``sesame serve`` under its
    default limits, as `benchmarks/serve_load.py --oversized` sends them. Before the character bound, one text of 1.9
    MB made the server's peak memory grow by about 300 MB as it was tokenized, 16 of them by over 1 GB."""
    script = load_script(SCRIPT, "benchmark_serve_load")
    expected = {"one long text": 422, "32 long texts": 422, "over the payload limit": 413, "nested 100,000 deep": 400,
                "a lone surrogate": 400, "a billion beams": 422, "a million new tokens": 422}
    for name in ("classify", "gpt"):
        result = script.oversized(str(runs / name), clients=16, requests=48)
        for kind, counts in result["statuses"].items():
            assert set(counts) == {expected[kind]}, (name, kind, counts)
        assert sum(sum(counts.values()) for counts in result["statuses"].values()) == 48
        assert result["growth_mb"] < PEAK_GROWTH_MB, result
