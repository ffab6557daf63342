"""``sesame serve``: a fine-tuned run or a language model behind an HTTP API, with a demo page (docs/serving.md).

The stack is Starlette on uvicorn (the optional ``serve`` extra): an ASGI toolkit small enough to read whole, with
async streaming for server-sent events and a test client, on the ASGI server most Python services run; FastAPI would
add pydantic models and a generated OpenAPI page, which a handful of fixed endpoints does not need (their schema is
written out, :mod:`.schema`). Prometheus metrics come from ``prometheus_client``.

A fine-tuned run answers ``POST /v1/predict`` through :class:`sesame.pipelines.Predictor` (a folder ``sesame export``
wrote through :class:`sesame.pipelines.evaluate.ExportedPredictor`, run by onnxruntime), its inputs micro-batched
(:mod:`.worker`); a pre-trained language model (GPT, GPT-2, T5, BART) answers ``POST /v1/generate`` through
:func:`sesame.generation.generate`, streamed as server-sent events when asked. The routes, limits and metrics are
in :mod:`.app`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ...errors import SesameError
from ...options import option
from ...runtime import Runtime

INSTALL = "pip install 'sesame-nlp[serve]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeSpec:
    """What ``sesame serve`` serves and its limits (the defaults are text-embeddings-inference's where it has one)."""

    model: str = option(help="a fine-tuned run (or a transformers sequence classifier directory, or a folder "
                             "`sesame export` wrote), served at /v1/predict; or a pre-trained language model (gpt, "
                             "gpt2, t5, bart), served at /v1/generate")
    host: str = option("127.0.0.1", help="the address to listen on (another than 127.0.0.1 exposes the model to the "
                                         "network: give --api-key)")
    port: int = option(8000, within=(0, 65536), help="the port to listen on (0: any free port)")
    api_key: str | None = option(None, help="require 'Authorization: Bearer KEY' on /v1/*, /info and /metrics "
                                            "(default: no key)")
    max_concurrent_requests: int = option(512, within=(1, 1 << 31), help="requests in flight at once (queued or "
                                                                           "running); more are refused with 429")
    max_batch_tokens: int = option(16384, within=(1, 1 << 31), help="tokens of one forward pass; a request with "
                                                                     "more is refused with 422")
    max_client_batch_size: int = option(32, within=(1, 1 << 31), help="inputs of one request; more: 422")
    payload_limit: int = option(2_000_000, within=(1, 1 << 31), help="bytes of a request's body; more: 413")
    auto_truncate: bool = option(False, help="cut inputs longer than the model reads (its fine-tuning --max-length) "
                                             "instead of refusing them with 422")
    batch_wait_ms: float = option(2.0, within=(0, 1000), help="how long the first request of a micro-batch waits "
                                                               "for others (0: each request is a forward pass "
                                                               "of its own)")
    max_new_tokens: int = option(256, within=(1, 1 << 31), help="the most new tokens a /v1/generate request may "
                                                                 "ask for; more: 422")


def require() -> None:
    """Fail, saying how to install them, when the serve extra's packages are missing."""
    for name in ("starlette", "uvicorn", "prometheus_client"):
        try:
            importlib.import_module(name)
        except ImportError:
            raise SesameError(f"sesame serve needs Starlette, uvicorn and prometheus_client ({name} is missing): "
                              f"{INSTALL}") from None


def serve(spec: ServeSpec, *, runtime: Runtime | None = None) -> None:
    """Load ``spec.model`` onto ``runtime``'s device and serve it until interrupted."""
    from ...errors import warn
    from ...options import check_ranges

    require()
    check_ranges(spec)
    import uvicorn

    from .app import create_app, load

    if spec.host not in LOOPBACK and spec.api_key is None:
        warn(f"--host {spec.host}: anyone who can reach this address can use the model; give --api-key")
    app = create_app(spec, load(spec.model, runtime=runtime))
    uvicorn.run(app, host=spec.host, port=spec.port, log_level="info")
