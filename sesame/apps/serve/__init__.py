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
from dataclasses import dataclass

from ...errors import SesameError
from ...options import option
from ...runtime import Runtime

INSTALL = "pip install 'sesame-nlp[serve]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
CHARACTERS_PER_TOKEN = 16  # a request's texts may have this many characters per token of --max-batch-tokens (a
# bound checked before tokenizing, without which one long text costs hundreds of megabytes; English averages about 4)
MAX_DEPTH = 32  # levels a request's JSON may nest (its deepest strings, a multiple-choice input's choices: 4)


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
    max_batch_tokens: int = option(16384, within=(1, 1 << 31), help="tokens of one forward pass (a generation's: "
                                                                     "prompts x beams x (the longest prompt + the new "
                                                                     "tokens)); a request with more, or with texts "
                                                                     f"of more than {CHARACTERS_PER_TOKEN} characters "
                                                                     "per token of it "
                                                                     "(counted before tokenizing), is refused with 422")
    max_client_batch_size: int = option(32, within=(1, 1 << 31), help="inputs of one request; more: 422")
    payload_limit: int = option(2_000_000, within=(1, 1 << 31), help="bytes of a request's body; more: 413")
    auto_truncate: bool = option(False, help="cut inputs longer than the model reads (its fine-tuning --max-length) "
                                             "instead of refusing them with 422")
    batch_wait_ms: float = option(2.0, within=(0, 1000), help="how long the first request of a micro-batch waits "
                                                               "for others (0: each request is a forward pass "
                                                               "of its own)")
    max_new_tokens: int = option(256, within=(1, 1 << 31), help="the most new tokens a /v1/generate request may "
                                                                 "ask for; more: 422")
    max_beams: int = option(8, within=(1, 1 << 31), help="the most beams a /v1/generate request may ask for (beam "
                                                         "search holds prompts x beams copies of the decoder's "
                                                         "state); more: 422")
    request_timeout: float = option(60.0, within=(0, 1e6), help="seconds from a request's arrival to its answer (a "
                                                                "stream: its last event); past them its work stops "
                                                                "(a generation at its next token) and it gets 408 "
                                                                "if its body had not arrived, 503 if the model had "
                                                                "not started on it, else 504 (0: no limit)")


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
