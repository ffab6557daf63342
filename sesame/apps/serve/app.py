"""The HTTP side of ``sesame serve``: routes, limits, authentication and metrics on Starlette.

Routes: ``POST /v1/predict`` (a fine-tuned run), ``POST /v1/generate`` (a language model; server-sent events with
``"stream": true``), ``GET /health``, ``GET /info``, ``GET /metrics`` (Prometheus), ``GET /openapi.json`` and the demo
page ``GET /``. Every refusal is a JSON body ``{"error": message, "status": code}``: 400 malformed JSON, 401 a missing
or wrong API key, 404 an endpoint this model does not serve, 413 a body over ``--payload-limit``, 422 inputs of the wrong
shape, too many (``--max-client-batch-size``), too long (unless ``--auto-truncate``), too many tokens
(``--max-batch-tokens``) or too many new tokens (``--max-new-tokens``), 429 more than ``--max-concurrent-requests`` in
flight, 500 an error of the server (logged with its traceback). A request's error is its own: it is answered and the
server goes on.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass, fields
from contextlib import asynccontextmanager, contextmanager
from importlib import resources
from typing import AsyncIterator, Awaitable, Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ...decoding import GenerationConfig
from ...errors import SesameError
from ...generation import Transducer, generate, load_generator
from ...interop import resolve
from ...interop.onnx_export import is_export
from ...language_model import LanguageModel
from ...pipelines import Predictor
from ...pipelines.evaluate import ExportedPredictor
from ...rundir import describe, read_config
from ...runtime import Runtime
from . import ServeSpec
from .schema import openapi
from .worker import Batching, Call, Finish, Model, Predict, Refused, Worker

log = logging.getLogger("sesame.serve")
PARAMETERS = {f.name: f for f in fields(GenerationConfig) if f.name != "cache"}  # /v1/generate's "parameters"


@dataclass
class Loaded:
    """A model ready to serve: a fine-tuned run's predictor (or an ONNX export's), or a language model's generator;
    ``about``: what /info says of it (:func:`sesame.rundir.describe`)."""

    about: dict
    model: Model | None = None
    generator: LanguageModel | Transducer | None = None


def load(model: str, *, runtime: Runtime | None = None) -> Loaded:
    """``--model`` loaded by its kind: a fine-tuned run as a :class:`Predictor`, a folder ``sesame export`` wrote as
    an :class:`ExportedPredictor` (the same interface: one worker serves both), a pre-trained run for generation."""
    if is_export(model):
        predictor = ExportedPredictor(model, runtime=runtime)
        return Loaded(predictor.about, model=predictor)
    with resolve(model, "--model") as run:
        config = read_config(run, "--model")
        if config.kind == "finetuned":
            predictor = Predictor(run, runtime=runtime)
            return Loaded(predictor.about, model=predictor)
        return Loaded(describe(config), generator=load_generator(str(run), runtime=runtime))


class Cancelled(Exception):
    """A streamed generation whose client has gone."""


class Server:
    """The state behind the routes: the model's worker thread, the requests in flight and the metrics."""

    def __init__(self, spec: ServeSpec, loaded: Loaded):
        self.spec, self.loaded, self.in_flight = spec, loaded, 0
        self.registry = CollectorRegistry()
        self.requests = Counter("sesame_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=self.registry)
        self.latency = Histogram("sesame_request_duration_seconds", "time to a response (a stream: to its start)",
                                 ["endpoint"], registry=self.registry)
        self.batch_size = Histogram("sesame_batch_size", "inputs (features) per forward pass of predictions",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry)
        self.batch_tokens = Histogram("sesame_batch_tokens", "tokens per forward pass of predictions",
                                      buckets=tuple(2 ** k for k in range(4, 17)), registry=self.registry)
        depth = Gauge("sesame_queue_depth", "jobs waiting for the model", registry=self.registry)
        Gauge("sesame_requests_in_flight", "requests queued or running", registry=self.registry).set_function(
            lambda: self.in_flight)
        batching = Batching(wait=spec.batch_wait_ms / 1000, max_tokens=spec.max_batch_tokens,
                            truncate=spec.auto_truncate)
        self.worker = Worker(loaded.model, batching, on_batch=self._on_batch)
        depth.set_function(self.worker.depth)

    def _on_batch(self, features: int, tokens: int) -> None:
        self.batch_size.observe(features)
        self.batch_tokens.observe(tokens)

    # -- the wrapper of every route: authentication, errors as JSON, metrics -------------------------------

    def route(self, path: str, handler: Callable[[Request], Awaitable[Response]], *, method: str = "GET",
              protected: bool = True) -> Route:
        async def endpoint(request: Request) -> Response:
            start = time.perf_counter()
            try:
                if protected:
                    self.authorize(request)
                response = await handler(request)
            except Refused as err:
                response = error(err.status, str(err))
            except SesameError as err:
                response = error(422, str(err))
            except Exception:
                log.exception("%s %s failed", method, path)
                response = error(500, "the server failed on this request (its log has the details)")
            self.requests.labels(path, str(response.status_code)).inc()
            self.latency.labels(path).observe(time.perf_counter() - start)
            return response

        return Route(path, endpoint, methods=[method])

    def authorize(self, request: Request) -> None:
        key = self.spec.api_key
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise Refused(401, "this server needs its API key: send the header 'Authorization: Bearer KEY'")

    def admit(self) -> None:
        """Count a request in flight, or refuse it (429) when ``--max-concurrent-requests`` are."""
        if self.in_flight >= self.spec.max_concurrent_requests:
            raise Refused(429, f"{self.in_flight} requests are in flight, the server's --max-concurrent-requests: "
                               "retry later")
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    async def body(self, request: Request, allowed: tuple[str, ...]) -> dict:
        """The request's JSON object, within ``--payload-limit`` (413), well formed (400), with only ``allowed``
        keys and ``inputs`` (422)."""
        limit = self.spec.payload_limit
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise Refused(413, f"the body has {declared} bytes, more than the server's --payload-limit {limit}")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise Refused(413, f"the body has more than the server's --payload-limit {limit} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise Refused(400, f"the body is not JSON ({err})") from None
        if not isinstance(body, dict):
            raise Refused(422, 'the body must be a JSON object, {"inputs": [...]}')
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise Refused(422, f"unknown field {unknown[0]!r}; a request has {', '.join(allowed)}")
        if "inputs" not in body:
            raise Refused(422, 'no "inputs": give one input, or a list of them')
        return body

    def inputs(self, body: dict) -> list:
        """The request's inputs: a list of them, or one input (not a list)."""
        values = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
        if not values:
            raise Refused(422, '"inputs" is an empty list; give at least one input')
        if len(values) > self.spec.max_client_batch_size:
            raise Refused(422, f"{len(values)} inputs, more than the server's --max-client-batch-size "
                               f"{self.spec.max_client_batch_size}: split them over several requests")
        return values

    async def run(self, job: Callable[[Finish], Predict | Call]) -> object:
        """The result of ``job(finish)`` from the model's thread (its error raised here)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.worker.submit(job(lambda result: loop.call_soon_threadsafe(_resolve, future, result)))
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    # -- routes ----------------------------------------------------------------------------------------------

    async def predict(self, request: Request) -> Response:
        model = self.loaded.model
        if model is None:
            raise Refused(404, f"--model {self.spec.model} is a language model, not a fine-tuned run: use "
                               "POST /v1/generate")
        values = self.inputs(await self.body(request, ("inputs",)))
        examples = [model.task.example_of(value, f"inputs[{i}]") for i, value in enumerate(values)]
        self.admit()
        try:
            results = await self.run(lambda finish: Predict(examples, finish))
        finally:
            self.release()
        return JSONResponse({"predictions": [{**example, **result} for example, result in zip(examples, results)]})

    async def generate(self, request: Request) -> Response:
        generator = self.loaded.generator
        if generator is None:
            raise Refused(404, f"--model {self.spec.model} is a fine-tuned {self.loaded.model.task.name} model, not "
                               "a language model: use POST /v1/predict")
        body = await self.body(request, ("inputs", "parameters", "stream"))
        prompts = self.inputs(body)
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str) or not prompt.strip():
                raise Refused(422, f"inputs[{i}]: a prompt is a non-empty text")
        cfg = self.generation(body.get("parameters", {}))
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise Refused(422, '"stream" is true or false')
        self.admit()
        if not stream:
            try:
                records = await self.run(lambda finish: Call(
                    lambda: generate(generator, prompts, cfg, batch_size=len(prompts)), finish))
            finally:
                self.release()
            return JSONResponse({"generations": records})
        try:
            events = await self.stream(generator, prompts, cfg)
        except BaseException:
            self.release()
            raise
        return StreamingResponse(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})

    def generation(self, parameters: object) -> GenerationConfig:
        """The request's ``parameters`` as a :class:`GenerationConfig` (422 for unknown, mistyped or out-of-range
        ones; ``max_new_tokens`` defaults to 50, at most the server's ``--max-new-tokens``)."""
        if not isinstance(parameters, dict):
            raise Refused(422, '"parameters" is an object, e.g. {"max_new_tokens": 20}')
        values = {"max_new_tokens": min(GenerationConfig.max_new_tokens, self.spec.max_new_tokens)}
        for key, value in parameters.items():
            if key not in PARAMETERS:
                raise Refused(422, f"parameters: unknown {key!r}; known: {', '.join(PARAMETERS)}")
            default = PARAMETERS[key].default if key != "stop" else ()
            if key == "stop":
                ok = isinstance(value, list) and all(isinstance(s, str) for s in value)
                value = tuple(value) if ok else value
            elif isinstance(default, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok = type(value) is type(default)
            if not ok:
                wanted = "a list of strings" if key == "stop" else f"a {type(default).__name__}"
                raise Refused(422, f"parameters: {key} is {json.dumps(value)}; it is {wanted}")
            values[key] = value
        if values["max_new_tokens"] > self.spec.max_new_tokens:
            raise Refused(422, f"parameters: max_new_tokens {values['max_new_tokens']} is more than the server's "
                               f"--max-new-tokens {self.spec.max_new_tokens}")
        cfg = GenerationConfig(**values)
        cfg.validate()
        return cfg

    async def stream(self, generator: LanguageModel | Transducer, prompts: list[str], cfg: GenerationConfig
                     ) -> AsyncIterator[str]:
        """Server-sent events of a generation: ``token`` events ``{"index", "text"}`` as each prompt's text becomes
        final, then ``done`` with the records of a non-streamed answer, or ``error``. Its first event is awaited
        here, so a refused generation (a prompt too long) is answered with its status rather than a stream."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()

        def on_text(index: int, text: str) -> None:
            if gone.is_set():
                raise Cancelled
            if text:
                loop.call_soon_threadsafe(events.put_nowait, ("token", {"index": index, "text": text}))

        def finish(result: object) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ("error", result) if isinstance(result, BaseException)
                                      else ("done", {"generations": result}))

        self.worker.submit(Call(lambda: generate(generator, prompts, cfg, batch_size=len(prompts), on_text=on_text),
                                finish=finish))
        first = await events.get()
        if first[0] == "error":
            gone.set()
            raise first[1]

        async def sent() -> AsyncIterator[str]:
            kind, data = first
            try:
                while True:
                    if kind == "error":
                        log.error("a streamed generation failed", exc_info=data)
                        yield _event("error", {"error": str(data) if isinstance(data, SesameError)
                                               else "the generation failed (the server's log has the details)"})
                        return
                    yield _event(kind, data)
                    if kind == "done":
                        return
                    kind, data = await events.get()
            finally:
                gone.set()
                self.release()

        return sent()

    async def health(self, request: Request) -> Response:
        if not self.worker.thread.is_alive():
            return error(503, "the model's thread has stopped; restart the server")
        return JSONResponse({"status": "ok"})

    async def info(self, request: Request) -> Response:
        about, model, spec = self.loaded.about, self.loaded.model, self.spec
        limits = {"max_concurrent_requests": spec.max_concurrent_requests, "max_batch_tokens": spec.max_batch_tokens,
                  "max_client_batch_size": spec.max_client_batch_size, "payload_limit": spec.payload_limit,
                  "auto_truncate": spec.auto_truncate, "batch_wait_ms": spec.batch_wait_ms}
        if model is not None:
            limits["max_input_tokens"] = model.max_length
        else:
            limits["max_new_tokens"] = spec.max_new_tokens
        return JSONResponse({
            "model": spec.model, **about,
            "task": model.task.name if model is not None else None,
            "task_options": model.task.options() if model is not None else None,
            "labels": model.labels if model is not None else None,
            "endpoint": "/v1/predict" if model is not None else "/v1/generate", "limits": limits})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def schema(self, request: Request) -> Response:
        return JSONResponse(openapi())

    async def page(self, request: Request) -> Response:
        return HTMLResponse(resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8"))


def create_app(spec: ServeSpec, loaded: Loaded) -> Starlette:
    """The ASGI application serving ``loaded`` under ``spec``'s limits; its model thread stops at shutdown."""
    server = Server(spec, loaded)
    routes = [server.route("/v1/predict", server.predict, method="POST"),
              server.route("/v1/generate", server.generate, method="POST"),
              server.route("/info", server.info), server.route("/metrics", server.metrics),
              server.route("/health", server.health, protected=False),
              server.route("/openapi.json", server.schema, protected=False),
              server.route("/", server.page, protected=False)]

    async def http_error(request: Request, exc: HTTPException) -> Response:  # unknown paths, wrong methods
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}; see GET /openapi.json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(server.worker.close)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                    lifespan=lifespan)
    app.state.server = server
    return app


@contextmanager
def background(app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """``app`` served by uvicorn in a thread (on a free port by default) for the ``with``: its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="sesame-serve-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise SesameError(f"the server could not listen on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def _event(kind: str, data: object) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _resolve(future: asyncio.Future, result: object) -> None:
    if not future.done():  # a request whose client has gone is cancelled
        future.set_result(result)


