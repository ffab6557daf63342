"""The HTTP side of ``sesame serve``: routes, limits, authentication and metrics on Starlette.

Routes: ``POST /v1/predict`` (a fine-tuned run), ``POST /v1/generate`` (a language model; server-sent events with
``"stream": true``), ``GET /health``, ``GET /info``, ``GET /metrics`` (Prometheus), ``GET /openapi.json`` and the demo
page ``GET /``. Every refusal is a JSON body ``{"error": message, "status": code}``: 400 malformed JSON (or nested
deeper than :data:`~.spec.MAX_DEPTH` levels, or holding half of a UTF-16 surrogate pair), 401 a missing or
wrong API key, 404 an endpoint this model does not serve, 408 a body not received within ``--request-timeout``, 413 a
body over ``--payload-limit``, 422 inputs of the wrong shape, too many (``--max-client-batch-size``), too long (unless
``--auto-truncate``), too many characters or tokens (``--max-batch-tokens``), too many new tokens
(``--max-new-tokens``) or beams (``--max-beams``), 429 more than ``--max-concurrent-requests`` in flight, 503 or 504
past ``--request-timeout`` (waiting for the model, or worked on), 500 an error of the server (logged with its
traceback). A request's error is its own: it is answered and the server
goes on. A request whose client has gone is dropped (counted in the metrics as 499, nginx's "client closed request").

Memory: a request is counted in flight before its body is read, so the bodies held are at most
``--max-concurrent-requests`` × ``--payload-limit`` bytes; its texts are counted before they are tokenized
(:data:`~.spec.CHARACTERS_PER_TOKEN`), so the model's thread tokenizes at most ``CHARACTERS_PER_TOKEN`` ×
``--max-batch-tokens`` characters at once; a forward pass (a generation's decoder state: prompts × beams × (the
longest prompt + the new tokens)) holds at most ``--max-batch-tokens`` tokens.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
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
from ...interop.onnx_format import is_export
from ...language_model import LanguageModel
from ...pipelines import Predictor
from ...pipelines.evaluate import ExportedPredictor
from ...run import describe, read_config
from ...runtime import Runtime
from ...tasks.base import shown
from .schema import openapi
from .spec import CHARACTERS_PER_TOKEN, MAX_DEPTH, ServeSpec
from .worker import Batching, Call, Cancelled, Finish, Job, Model, Predict, Refused, Worker, stopping

log = logging.getLogger("sesame.serve")
PARAMETERS = {f.name: f for f in fields(GenerationConfig) if f.name != "cache"}  # /v1/generate's "parameters"
SURROGATE = re.compile("[\ud800-\udfff]")  # in a str from JSON: a \uD8xx escape without its pair


@dataclass
class Loaded:
    """A model ready to serve: a fine-tuned run's predictor (or an ONNX export's), or a language model's generator;
    ``about``: what /info says of it (:func:`sesame.run.describe`)."""

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

    def admit(self) -> float | None:
        """Count a request in flight, or refuse it (429) when ``--max-concurrent-requests`` are; its deadline (a
        :func:`time.monotonic` time, None without ``--request-timeout``). A request holds its place until its job is
        finished (:meth:`start`), or until it is refused before it has one."""
        if self.in_flight >= self.spec.max_concurrent_requests:
            raise Refused(429, f"{self.in_flight} requests are in flight, the server's --max-concurrent-requests: "
                               "retry later")
        self.in_flight += 1
        return time.monotonic() + self.spec.request_timeout if self.spec.request_timeout else None

    def release(self) -> None:
        self.in_flight -= 1

    async def body(self, request: Request, allowed: tuple[str, ...], deadline: float | None) -> dict:
        """The request's JSON object, received by ``deadline`` (408) within ``--payload-limit`` (413), well formed,
        nested at most :data:`MAX_DEPTH` levels and of characters only (400), with only ``allowed`` keys and
        ``inputs``, whose texts have at most :data:`CHARACTERS_PER_TOKEN` × ``--max-batch-tokens`` characters
        (422)."""
        try:
            raw = await asyncio.wait_for(self.received(request), None if deadline is None else
                                         deadline - time.monotonic())
        except TimeoutError:
            raise Refused(408, f"the body did not arrive within the server's --request-timeout of "
                               f"{self.spec.request_timeout:g} s") from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise Refused(400, f"the body is not JSON ({err})") from None
        except RecursionError:
            raise Refused(400, f"the body nests deeper than {MAX_DEPTH} levels; a request's JSON is nearly flat") \
                from None
        for text in strings(body):
            lone = SURROGATE.search(text)
            if lone:
                raise Refused(400, f"the body holds \\u{ord(lone.group()):04x}, half of a UTF-16 surrogate pair "
                                   "without the other half: not a character; send the text as UTF-8")
        if not isinstance(body, dict):
            raise Refused(422, 'the body must be a JSON object, {"inputs": [...]}')
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise Refused(422, f"unknown field {unknown[0]!r}; a request has {', '.join(allowed)}")
        if "inputs" not in body:
            raise Refused(422, 'no "inputs": give one input, or a list of them')
        characters, most = sum(map(len, strings(body["inputs"]))), CHARACTERS_PER_TOKEN * self.spec.max_batch_tokens
        if characters > most:
            raise Refused(422, f"the inputs have {characters} characters, more than the {most} the server reads "
                               f"per request ({CHARACTERS_PER_TOKEN} per token of its --max-batch-tokens "
                               f"{self.spec.max_batch_tokens}): send fewer or shorter inputs per request")
        return body

    async def received(self, request: Request) -> bytearray:
        """The request's body, within ``--payload-limit`` (413)."""
        limit = self.spec.payload_limit
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise Refused(413, f"the body has {declared} bytes, more than the server's --payload-limit {limit}")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise Refused(413, f"the body has more than the server's --payload-limit {limit} bytes")
        return raw

    def inputs(self, body: dict) -> list:
        """The request's inputs: a list of them, or one input (not a list)."""
        values = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
        if not values:
            raise Refused(422, '"inputs" is an empty list; give at least one input')
        if len(values) > self.spec.max_client_batch_size:
            raise Refused(422, f"{len(values)} inputs, more than the server's --max-client-batch-size "
                               f"{self.spec.max_client_batch_size}: split them over several requests")
        return values

    def start(self, request: Request, deadline: float | None, job_of: Callable[[Finish], Job],
              finished: Callable[[object], None]) -> asyncio.Task:
        """Queue the job ``job_of(finish)`` for the model's thread; ``finished(result)`` hears its result (or error)
        on the event loop, when the request's place in flight is given back. Returns the task that marks the job gone
        when the client disconnects or ``deadline`` passes, and then returns the :class:`Refused` saying which."""
        loop = asyncio.get_running_loop()

        def done(result: object) -> None:
            watch.cancel()
            self.release()
            finished(result)

        job = job_of(lambda result: loop.call_soon_threadsafe(done, result))
        watch = asyncio.create_task(self.watch(request, job, deadline))
        self.worker.submit(job)
        return watch

    async def watch(self, request: Request, job: Job, deadline: float | None) -> Refused:
        """Wait for the client to disconnect or ``deadline`` to pass; mark ``job`` gone; the refusal to answer."""
        timeout = self.spec.request_timeout
        try:
            await asyncio.wait_for(disconnected(request), None if deadline is None else deadline - time.monotonic())
            refusal = Refused(499, "the client closed the connection before its answer")
        except TimeoutError:
            refusal = Refused(504, f"the model worked on this request past the server's --request-timeout of "
                                   f"{timeout:g} s: ask for less (fewer inputs, new tokens or beams)") \
                if job.started else Refused(503, f"the request waited for the model past the server's "
                                                 f"--request-timeout of {timeout:g} s: the server is busy, retry later")
        job.gone.set()
        return refusal

    async def answer(self, request: Request, deadline: float | None, job_of: Callable[[Finish], Job]) -> object:
        """The result of the job ``job_of(finish)`` from the model's thread (its error raised here), or the refusal of
        a request whose client disconnected or whose deadline passed first (:meth:`watch`)."""
        result = asyncio.get_running_loop().create_future()
        watch = self.start(request, deadline, job_of, lambda value: result.done() or result.set_result(value))
        await asyncio.wait({result, watch}, return_when=asyncio.FIRST_COMPLETED)
        return outcome(result.result() if result.done() else Cancelled(), watch)

    # -- routes ----------------------------------------------------------------------------------------------

    async def predict(self, request: Request) -> Response:
        model = self.loaded.model
        if model is None:
            raise Refused(404, f"--model {self.spec.model} is a language model, not a fine-tuned run: use "
                               "POST /v1/generate")
        deadline = self.admit()
        try:
            values = self.inputs(await self.body(request, ("inputs",), deadline))
            examples = [model.task.example_of(value, f"inputs[{i}]") for i, value in enumerate(values)]
        except BaseException:
            self.release()
            raise
        results = await self.answer(request, deadline, lambda finish: Predict(examples=examples, finish=finish))
        return JSONResponse({"predictions": [{**example, **result} for example, result in zip(examples, results)]})

    async def generate(self, request: Request) -> Response:
        generator = self.loaded.generator
        if generator is None:
            raise Refused(404, f"--model {self.spec.model} is a fine-tuned {self.loaded.model.task.name} model, not "
                               "a language model: use POST /v1/predict")
        deadline = self.admit()
        try:
            body = await self.body(request, ("inputs", "parameters", "stream"), deadline)
            prompts = self.inputs(body)
            for i, prompt in enumerate(prompts):
                if not isinstance(prompt, str) or not prompt.strip():
                    raise Refused(422, f"inputs[{i}]: a prompt is a non-empty text")
            cfg = self.generation(body.get("parameters", {}))
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise Refused(422, '"stream" is true or false')
        except BaseException:
            self.release()
            raise
        if stream:
            events = await self.stream(request, deadline, generator, prompts, cfg)
            return StreamingResponse(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})
        gone = threading.Event()
        records = await self.answer(request, deadline, lambda finish: Call(
            run=lambda: self.generated(generator, prompts, cfg, gone), finish=finish, gone=gone))
        return JSONResponse({"generations": records})

    def generation(self, parameters: object) -> GenerationConfig:
        """The request's ``parameters`` as a :class:`GenerationConfig` (422 for unknown, mistyped or out-of-range
        ones; ``max_new_tokens`` defaults to 50, at most the server's ``--max-new-tokens``; ``beams`` at most its
        ``--max-beams``)."""
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
                raise Refused(422, f"parameters: {key} is {shown(value)}; it is {wanted}")
            values[key] = value
        for key, flag, most in (("max_new_tokens", "--max-new-tokens", self.spec.max_new_tokens),
                                ("beams", "--max-beams", self.spec.max_beams)):
            if values.get(key, 1) > most:
                raise Refused(422, f"parameters: {key} {values[key]} is more than the server's {flag} {most}")
        cfg = GenerationConfig(**values)
        cfg.validate()
        return cfg

    def generated(self, generator: LanguageModel | Transducer, prompts: list[str], cfg: GenerationConfig,
                  gone: threading.Event, on_text: Callable[[int, str], None] | None = None) -> list[dict]:
        """:func:`generate`'s records of ``prompts`` (on the model's thread), once the decoder state they need, prompts
        × beams × (the longest prompt + the new tokens), is found within ``--max-batch-tokens`` (422); the
        generation stops at its next token once ``gone`` is set (:func:`stopping`)."""
        longest = max(map(len, generator.encode(prompts)))
        tokens, most = len(prompts) * cfg.beams * (longest + cfg.max_new_tokens), self.spec.max_batch_tokens
        if tokens > most:
            raise Refused(422, f"{len(prompts)} prompts × {cfg.beams} beams × ({longest} tokens of the longest "
                               f"prompt + {cfg.max_new_tokens} new tokens) = {tokens} tokens, more than the server's "
                               f"--max-batch-tokens {most}: send fewer or shorter prompts, or ask for fewer beams or "
                               "new tokens")
        with stopping(generator.backbone.embed, gone):
            return generate(generator, prompts, cfg, batch_size=len(prompts), on_text=on_text)

    async def stream(self, request: Request, deadline: float | None, generator: LanguageModel | Transducer,
                     prompts: list[str], cfg: GenerationConfig) -> AsyncIterator[str]:
        """Server-sent events of a generation: ``token`` events ``{"index", "text"}`` as each prompt's text becomes
        final, then ``done`` with the records of a non-streamed answer, or ``error`` (a failure, the deadline). Its
        first event is awaited here, so a refused generation (a prompt too long) is answered with its status rather
        than a stream. A stream whose client has gone stops its generation at the next token."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()

        def on_text(index: int, text: str) -> None:
            if text:
                loop.call_soon_threadsafe(events.put_nowait, ("token", {"index": index, "text": text}))

        def finished(result: object) -> None:
            events.put_nowait(("error", result) if isinstance(result, BaseException)
                              else ("done", {"generations": result}))

        watch = self.start(request, deadline, lambda finish: Call(
            run=lambda: self.generated(generator, prompts, cfg, gone, on_text), finish=finish, gone=gone), finished)

        async def next_event() -> tuple[str, object]:
            """The next event, or the refusal of :meth:`watch` once the client has gone or the deadline passed."""
            get = asyncio.ensure_future(events.get())
            await asyncio.wait({get, watch}, return_when=asyncio.FIRST_COMPLETED)
            if get.done() or watch.cancelled():  # the job has finished: its last events are queued
                kind, data = await get
                return (kind, data) if not isinstance(data, Cancelled) else ("error", watch.result())
            get.cancel()
            return "error", watch.result()

        first = await next_event()
        if first[0] == "error":
            gone.set()
            raise first[1]

        async def sent() -> AsyncIterator[str]:
            kind, data = first
            try:
                while True:
                    if kind == "error":
                        if not isinstance(data, (SesameError, Refused)):
                            log.error("a streamed generation failed", exc_info=data)
                        yield _event("error", {"error": str(data) if isinstance(data, (SesameError, Refused))
                                               else "the generation failed (the server's log has the details)"})
                        return
                    yield _event(kind, data)
                    if kind == "done":
                        return
                    kind, data = await next_event()
            finally:
                gone.set()

        return sent()

    async def health(self, request: Request) -> Response:
        if not self.worker.thread.is_alive():
            return error(503, "the model's thread has stopped; restart the server")
        return JSONResponse({"status": "ok"})

    async def info(self, request: Request) -> Response:
        about, model, spec = self.loaded.about, self.loaded.model, self.spec
        limits = {"max_concurrent_requests": spec.max_concurrent_requests, "max_batch_tokens": spec.max_batch_tokens,
                  "max_client_batch_size": spec.max_client_batch_size, "payload_limit": spec.payload_limit,
                  "auto_truncate": spec.auto_truncate, "batch_wait_ms": spec.batch_wait_ms,
                  "request_timeout": spec.request_timeout}
        if model is not None:
            limits["max_input_tokens"] = model.max_length
        else:
            limits.update(max_new_tokens=spec.max_new_tokens, max_beams=spec.max_beams)
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


def strings(value: object) -> Iterator[str]:
    """The strings of a JSON value (keys too), walked without recursion; 400 deeper than :data:`MAX_DEPTH` levels."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Refused(400, f"the body nests deeper than {MAX_DEPTH} levels; a request's JSON is nearly flat")
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for pair in item.items() for v in pair)


async def disconnected(request: Request) -> None:
    """Return once the client of ``request``, whose body has been read, disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def outcome(result: object, watch: asyncio.Task) -> object:
    """A job's result, or the error it raised; for a job dropped as gone, :meth:`Server.watch`'s refusal."""
    if isinstance(result, Cancelled):
        raise watch.result()
    if isinstance(result, BaseException):
        raise result
    return result


