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

import errno
import importlib
import logging
import socket

from ...errors import SesameError
from ...runtime import Runtime
from .spec import ServeSpec

INSTALL = "pip install 'sesame-nlp[serve]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")

__all__ = ["ServeSpec", "require", "serve"]


def require() -> None:
    """Fail, saying how to install them, when the serve extra's packages are missing."""
    for name in ("starlette", "uvicorn", "prometheus_client"):
        try:
            importlib.import_module(name)
        except ImportError:
            raise SesameError(f"sesame serve needs Starlette, uvicorn and prometheus_client ({name} is missing): "
                              f"{INSTALL}") from None


def serve(spec: ServeSpec, *, runtime: Runtime | None = None) -> None:
    """Load ``spec.model`` onto ``runtime``'s device and serve it until SIGTERM or Ctrl-C, which answer the requests
    in flight and then end the process: SIGTERM by the signal itself, as uvicorn does (status 143); Ctrl-C with
    :class:`~sesame.train.Interrupted` (the command's status 130)."""
    from ...errors import warn
    from ...options import check_ranges
    from ...train import Interrupted

    require()
    check_ranges(spec)
    import uvicorn

    from .app import create_app, load

    if spec.host not in LOOPBACK and spec.api_key is None:
        warn(f"--host {spec.host}: anyone who can reach this address can use the model; give --api-key")
    app = create_app(spec, load(spec.model, runtime=runtime))
    with listening(spec.host, spec.port) as sock:
        config = uvicorn.Config(app, log_level="info")
        host, port = sock.getsockname()[:2]
        logging.getLogger("uvicorn.error").info(
            "sesame serve: --model %s on http://%s:%d (SIGTERM or Ctrl-C: answers the requests in flight, then ends)",
            spec.model, f"[{host}]" if ":" in host else host, port)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except KeyboardInterrupt:  # Ctrl-C, raised again by uvicorn once the requests in flight are answered
            raise Interrupted("stopped by Ctrl-C, after answering the requests in flight") from None


def listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, made before uvicorn starts, so that an address nobody can listen on
    is one line naming the flag at fault (uvicorn logs the system's error, naming no flag, and exits 3)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise SesameError(f"--host {host}: no such address ({getattr(err, 'strerror', None) or err}); give a name "
                          "or address of this machine, such as 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # connections made before uvicorn starts wait to be accepted
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise SesameError(f"--port {port}: {host}:{port} is in use by another program; choose another --port "
                              "(0: any free one)") from None
        if err.errno == errno.EACCES:
            raise SesameError(f"--port {port}: this user may not listen on it ({err.strerror}; ports below 1024 "
                              "need privileges); choose another --port") from None
        raise SesameError(f"--host {host}: cannot listen there ({err.strerror}); give an address of this machine, "
                          "such as 127.0.0.1") from None
    return sock
