"""Load test of ``sesame serve``: bounded concurrent clients on 127.0.0.1 against a served classifier, with and without
micro-batching: throughput, p50/p99 latency and errors.

The model (``--model``, a fine-tuned run such as an airline classifier, or its ONNX export) is served twice in this
process, by uvicorn in a thread (:func:`sesame.apps.serve.app.background`): with micro-batching (``--batch-wait-ms``,
default the server's 2 ms) and without (0 ms: each request a forward pass of its own). ``--clients`` clients each send
one request after another, one text per request, until ``--requests`` requests have been sent; the texts are the
``--column`` of ``--data`` (a CSV/TSV/JSONL file), used in turn. Every request counts: a response other than 200 is
an error, and the line says how many there were. A warm-up of ``--clients`` requests comes first, uncounted.

One JSON line per setting: ``{"batch_wait_ms", "clients", "requests", "errors", "seconds", "requests_per_s",
"p50_ms", "p99_ms", "forward_passes", "mean_batch"}`` (the last two from the server's /metrics). The client and the
server share the machine's cores: compare the two lines of one run, not runs on different machines.

With ``--oversized``, ``sesame serve --model RUN`` runs as a process of its own under its default limits, and
``--clients`` clients send ``--requests`` requests in all that no server should compute, in turn: a text of nearly
``--payload-limit`` bytes (one input, and the most inputs a request may have), a body over the limit, JSON nested
100,000 levels deep, a lone surrogate, and for a language model (POST /v1/generate) a billion beams and a million
new tokens. One JSON line: the status each kind got, and the server's resident memory (Linux ``/proc/PID/status``)
at its peak before them (``VmHWM`` after warm-up requests) and after, in MB.

    python benchmarks/serve_load.py --model RUN --data ../shared/data/airline/dev.csv --clients 16 --requests 2000
    python benchmarks/serve_load.py --model RUN --data ../shared/data/airline/dev.csv --clients 2 --requests 8  # check
    python benchmarks/serve_load.py --model RUN --oversized --clients 16 --requests 64
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from sesame.apps.serve import ServeSpec  # noqa: E402
from sesame.apps.serve.app import background, create_app, load  # noqa: E402
from sesame.data.labeled import read_fields  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0 ≤ q ≤ 1) of ``values`` by the nearest-rank method."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def hammer(url: str, texts: list[str], *, clients: int, requests: int) -> dict:
    """``clients`` concurrent clients sending ``requests`` one-text requests in all: latencies and errors."""
    latencies: list[float] = []
    errors = 0
    sent = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors, sent
        while sent < requests:
            text = texts[sent % len(texts)]
            sent += 1
            start = time.perf_counter()
            try:
                response = await http.post(f"{url}/v1/predict", json={"inputs": [text]})
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            errors += not ok

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - start
    return {"requests": len(latencies), "errors": errors, "seconds": round(seconds, 3),
            "requests_per_s": round(len(latencies) / seconds, 2),
            "p50_ms": round(1000 * percentile(latencies, 0.5), 2),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 2)}


def batches(url: str) -> tuple[float, float]:
    """(forward passes, features) the server has counted (its /metrics)."""
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("sesame_batch_size_count") or line.startswith("sesame_batch_size_sum"):
            name, value = line.split()
            values[name] = float(value)
    return values["sesame_batch_size_count"], values["sesame_batch_size_sum"]


@contextmanager
def served(command: list[str], *, timeout: float = 300) -> Iterator[tuple[str, subprocess.Popen]]:
    """``command`` (a ``sesame serve`` on 127.0.0.1) run as a process, for the ``with``: its base URL, once uvicorn
    says it listens, and the process; stopped (SIGTERM, then SIGKILL) at the end. Its log is kept in ``.log``."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    process.log, found = [], threading.Event()

    def read() -> None:
        for line in process.stderr:
            process.log.append(line)
            if re.search(r" on http://127\.0\.0\.1:\d+", line):
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not found.wait(0.1):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {''.join(process.log)[-2000:]}")
        url = next(m[1] for line in process.log if (m := re.search(r"(http://127\.0\.0\.1:\d+)", line)))
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(60)


def peak_mb(pid: int) -> float:
    """The peak resident memory of process ``pid`` so far (its VmHWM), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) / 1024


def oversized_requests(endpoint: str, payload_limit: int, clients: int) -> dict[str, tuple[str, bytes]]:
    """By name, the oversized requests (endpoint, body) a server with ``payload_limit`` must refuse: texts of
    nearly the limit, a body over it, deep nesting, a lone surrogate; a billion beams and a million new tokens for
    a language model."""
    words = "the flight was late again and nobody said why "
    text = (words * (payload_limit // len(words)))[: payload_limit - 100]
    many = [text[: len(text) // clients - 20]] * clients  # ``clients`` inputs of a request
    requests = {"one long text": {"inputs": [text]}, f"{clients} long texts": {"inputs": many}}
    bodies = {name: json.dumps(body).encode() for name, body in requests.items()}
    bodies.update({"over the payload limit": b'{"inputs": ["' + b"x" * payload_limit + b'"]}',
                   "nested 100,000 deep": b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                   "a lone surrogate": b'{"inputs": ["\\ud800"]}'})
    if endpoint == "/v1/generate":
        for name, parameters in (("a billion beams", {"beams": 1_000_000_000}),
                                 ("a million new tokens", {"max_new_tokens": 1_000_000})):
            bodies[name] = json.dumps({"inputs": ["The cat"], "parameters": parameters}).encode()
    return {name: (endpoint, body) for name, body in bodies.items()}


async def send_all(url: str, requests: list[tuple[str, str, bytes]], clients: int) -> dict[str, dict[int, int]]:
    """``requests`` (name, endpoint, body) sent by ``clients`` concurrent clients: per name, the count of each
    status (0: no answer)."""
    statuses: dict[str, dict[int, int]] = {}
    queue = list(reversed(requests))

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            name, endpoint, body = queue.pop()
            try:
                status = (await http.post(url + endpoint, content=body,
                                          headers={"content-type": "application/json"})).status_code
            except httpx.HTTPError:
                status = 0
            counts = statuses.setdefault(name, {})
            counts[status] = counts.get(status, 0) + 1

    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return statuses


def oversized(model: str, *, clients: int, requests: int) -> dict:
    """``sesame serve --model`` under its default limits, sent ``requests`` oversized requests by ``clients``
    clients: the statuses they got, and the server's peak memory before (after warm-up) and after them."""
    command = [sys.executable, "-m", "sesame", "--no-progress", "serve", "--model", model, "--port", "0"]
    with served(command) as (url, process):
        kind = httpx.get(f"{url}/info").json()["endpoint"]
        named = oversized_requests(kind, ServeSpec.payload_limit, ServeSpec.max_client_batch_size)
        order = [(name, *named[name]) for name in list(named) * (requests // len(named) + 1)][:requests]
        warm = [("warm-up", kind, json.dumps({"inputs": ["The cat sleeps."]}).encode())] * clients
        asyncio.run(send_all(url, warm, clients))
        before = peak_mb(process.pid)
        statuses = asyncio.run(send_all(url, order, clients))
        after = peak_mb(process.pid)
    return {"model": model, "endpoint": kind, "clients": clients, "requests": len(order), "statuses": statuses,
            "peak_mb_before": round(before, 1), "peak_mb_after": round(after, 1),
            "growth_mb": round(after - before, 1)}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a fine-tuned run (or with --oversized, a language model too)")
    p.add_argument("--data", help="a CSV/TSV/JSONL file with the texts to send (not with --oversized)")
    p.add_argument("--oversized", action="store_true", help="send oversized requests to the model served in a "
                                                            "process of its own: statuses and peak memory")
    p.add_argument("--column", default="text", help="the column of the texts (default: text)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--requests", type=int, default=2000, help="requests per setting (default 2000)")
    p.add_argument("--batch-wait-ms", type=float, default=ServeSpec.batch_wait_ms,
                   help=f"micro-batching's wait (default {ServeSpec.batch_wait_ms}); the other setting is 0")
    args = p.parse_args(argv)
    if args.oversized:
        result = oversized(args.model, clients=args.clients, requests=args.requests)
        print(json.dumps(result), flush=True)
        return [result]
    if args.data is None:
        p.error("--data is required (but with --oversized)")
    texts = [row["text"] for row in read_fields(args.data, {"text": (args.column, "--column")})]
    loaded = load(args.model)
    results = []
    for wait in (args.batch_wait_ms, 0.0):
        spec = ServeSpec(model=args.model, batch_wait_ms=wait, max_concurrent_requests=max(512, args.clients),
                         auto_truncate=True)
        app = create_app(spec, loaded)
        with background(app) as url:
            asyncio.run(hammer(url, texts, clients=args.clients, requests=args.clients))  # warm-up
            before = batches(url)
            result = asyncio.run(hammer(url, texts, clients=args.clients, requests=args.requests))
            after = batches(url)
        passes = after[0] - before[0]
        result = {"batch_wait_ms": wait, "clients": args.clients, **result, "forward_passes": int(passes),
                  "mean_batch": round((after[1] - before[1]) / max(passes, 1), 2)}
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    main()
