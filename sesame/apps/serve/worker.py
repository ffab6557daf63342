"""The one thread that runs the model: prediction requests micro-batched, generation requests one at a time.

Every request's model work runs on this thread: the tokenizer's truncation is a setting of the one shared
``tokenizers`` object (:meth:`sesame.tokenizer.TextTokenizer.encodings` sets it per call), and one forward pass at a
time keeps the CPU's cores for it. A prediction job is made into features here and held to the limits
(:class:`Batching`); then the jobs waiting in the queue are gathered, for up to ``wait`` seconds after the first or
until ``max_tokens`` tokens, into one :meth:`Model.outputs` call, and each job's rows of the outputs are decoded into
its predictions (dynamic batching as text-embeddings-inference and Triton do it). A feature's outputs do not depend
on the features batched with it (padding is masked), so batched results equal one-at-a-time results up to float
rounding. A job whose inputs are refused fails alone; if a batch's forward pass fails, its jobs are run one by one,
so only the faulty one fails. A job whose request has gone (its client left, or its deadline passed) is dropped
before the model runs it; a generation that is running stops at its next token (:func:`stopping`).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import torch
from torch import nn

from ...tasks import Task

UNCUT = 1 << 30  # a max_length that cuts nothing: an input's full token count
log = logging.getLogger("sesame.serve")


class Model(Protocol):
    """What the server asks of a fine-tuned model: :class:`sesame.pipelines.Predictor` gives it, and so does an ONNX
    export's :class:`sesame.pipelines.evaluate.ExportedPredictor` (the task's features and decoding, onnxruntime's
    forward pass), so one worker micro-batches both."""

    task: Task
    labels: list[str]
    max_length: int

    def features(self, examples: list[dict], *, max_length: int | None = None) -> list[dict]: ...

    def outputs(self, features: list[dict]) -> torch.Tensor: ...

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor) -> list[dict]: ...


class Refused(Exception):
    """A request the server refuses: the HTTP status, and a message saying what to change."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Batching:
    wait: float  # seconds the first job of a batch waits for others (0: every job is a forward pass of its own)
    max_tokens: int  # tokens of one forward pass; one request may not have more
    truncate: bool  # cut inputs longer than the model reads (else refuse them: 422)


Finish = Callable[[object], None]  # receives the job's result, or the exception that ended it


class Cancelled(Exception):
    """The work of a request that has gone (its client left, or its deadline passed)."""


@dataclass(kw_only=True)
class Job:
    """One request's work, ``finish``-ed exactly once. ``gone`` is set when nobody waits for its answer any more:
    the worker then drops it (finished with :class:`Cancelled`) unless ``started``."""

    finish: Finish
    gone: threading.Event = field(default_factory=threading.Event)
    started: bool = False


@dataclass(kw_only=True)
class Predict(Job):
    """Examples to predict (from one request)."""

    examples: list[dict]
    features: list[dict] | None = None
    tokens: int = 0


@dataclass(kw_only=True)
class Call(Job):
    """Work that runs alone on the model's thread (a generation)."""

    run: Callable[[], object]


@contextmanager
def stopping(module: nn.Module, gone: threading.Event) -> Iterator[None]:
    """Within the ``with``, ``module``'s next forward pass after ``gone`` is set raises :class:`Cancelled`: given a
    generator's embeddings, which every decoding step reads, a generation stops at its next token."""

    def check(_: nn.Module, args: tuple) -> None:
        if gone.is_set():
            raise Cancelled

    hook = module.register_forward_pre_hook(check)
    try:
        yield
    finally:
        hook.remove()


@dataclass
class Worker:
    """The model's thread; ``submit`` queues a job (``None`` stops the thread after the jobs before it).
    ``on_batch(features, tokens)`` hears of every forward pass of predictions."""

    model: Model | None
    batching: Batching
    on_batch: Callable[[int, int], None] = lambda features, tokens: None
    queue: queue.Queue = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="sesame-serve-model", daemon=True)
        self.thread.start()

    def submit(self, job: Job | None) -> None:
        self.queue.put(job)

    def depth(self) -> int:
        """Jobs waiting for the model."""
        return self.queue.qsize()

    def close(self) -> None:
        self.submit(None)
        self.thread.join()

    def _loop(self) -> None:
        carry: Job | None = None
        while True:
            job = carry if carry is not None else self.queue.get()
            carry = None
            if job is None:
                return
            if isinstance(job, Call):
                if not _dropped(job):
                    job.started = True
                    _settle(job.finish, job.run)
                continue
            batch = [job] if self._prepare(job) else []
            carry = self._gather(batch)
            if batch:
                self._run(batch)

    def _gather(self, batch: list[Predict]) -> Job | None:
        """Add the jobs that arrive within the wait to ``batch`` while they fit; returns the job that ended the
        gathering without joining it (to run next), or None. ``None`` in the queue (stop) is put back."""
        deadline = time.monotonic() + self.batching.wait
        tokens = sum(job.tokens for job in batch)
        while tokens < self.batching.max_tokens:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                job = self.queue.get(timeout=left)
            except queue.Empty:
                break
            if job is None:
                self.queue.put(None)
                break
            if isinstance(job, Call):
                return job
            if not self._prepare(job):
                continue
            if tokens + job.tokens > self.batching.max_tokens:
                return job
            batch.append(job)
            tokens += job.tokens
        return None

    def _prepare(self, job: Predict) -> bool:
        """Make the job's features (once) and hold them to the limits; a refused job is finished with the error, a
        job whose request has gone is dropped."""
        if _dropped(job):
            return False
        if job.features is None:
            try:
                job.features = self.features(job.examples)
            except Exception as err:  # the error goes to its request; the thread goes on
                _answer(job.finish, err)
                return False
            job.tokens = sum(self.model.task.length(f) for f in job.features)
        return True

    def features(self, examples: list[dict]) -> list[dict]:
        """The model's features for one request's examples, held to the limits: an input longer than the model
        reads is refused (422) unless ``truncate`` (a task that reads long inputs in windows cuts nothing), and
        a request's tokens may not exceed ``max_tokens`` (422)."""
        model, limits = self.model, self.batching
        if model.task.windows:
            features = model.features(examples)
        else:
            features = model.features(examples, max_length=UNCUT)
            long = [f for f in features if model.task.length(f) > model.max_length]
            if long and not limits.truncate:
                raise Refused(422, f"inputs[{long[0]['example']}] has {model.task.length(long[0])} tokens, more than "
                                   f"the {model.max_length} the model reads (the --max-length it was fine-tuned "
                                   "with): shorten it, or start the server with --auto-truncate")
            if long:
                features = model.features(examples)
        tokens = sum(model.task.length(f) for f in features)
        if tokens > limits.max_tokens:
            raise Refused(422, f"the inputs have {tokens} tokens, more than the server's --max-batch-tokens "
                               f"{limits.max_tokens}: send fewer or shorter inputs per request")
        return features

    def _run(self, batch: list[Predict]) -> None:
        """One forward pass over the batch's features, each job decoded from its own rows."""
        batch = [job for job in batch if not _dropped(job)]
        if not batch:
            return
        for job in batch:
            job.started = True
        features = [f for job in batch for f in job.features]
        try:
            outputs = self.model.outputs(features)
        except Exception as err:  # a faulty input, or the machine (out of memory)
            if len(batch) == 1:
                _answer(batch[0].finish, err)
            else:  # find the job at fault: each alone
                for job in batch:
                    self._run([job])
            return
        self.on_batch(len(features), sum(job.tokens for job in batch))
        start = 0
        for job in batch:
            rows = outputs[start: start + len(job.features)]
            start += len(job.features)
            _settle(job.finish, lambda: self.model.predictions(job.examples, job.features, rows))


def _dropped(job: Job) -> bool:
    """Whether ``job``'s request has gone; if so it is finished with :class:`Cancelled`, unrun."""
    if job.gone.is_set():
        _answer(job.finish, Cancelled())
        return True
    return False


def _settle(finish: Finish, work: Callable[[], object]) -> None:
    """``finish`` with what ``work`` returns or raises."""
    try:
        result = work()
    except Exception as err:  # the error goes to its request; the thread goes on
        result = err
    _answer(finish, result)


def _answer(finish: Finish, result: object) -> None:
    """``finish(result)``; nothing escapes to stop the thread."""
    try:
        finish(result)
    except Exception:
        log.exception("a finished job could not be answered")
