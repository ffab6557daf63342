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

    python benchmarks/serve_load.py --model RUN --data ../shared/data/airline/dev.csv --clients 16 --requests 2000
    python benchmarks/serve_load.py --model RUN --data ../shared/data/airline/dev.csv --clients 2 --requests 8  # check
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

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


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a fine-tuned run")
    p.add_argument("--data", required=True, help="a CSV/TSV/JSONL file with the texts to send")
    p.add_argument("--column", default="text", help="the column of the texts (default: text)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--requests", type=int, default=2000, help="requests per setting (default 2000)")
    p.add_argument("--batch-wait-ms", type=float, default=ServeSpec.batch_wait_ms,
                   help=f"micro-batching's wait (default {ServeSpec.batch_wait_ms}); the other setting is 0")
    args = p.parse_args(argv)
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
