"""The next step's batches, built on a background thread while the model trains on this step's.

A step's batches are a function of the step alone, or of the step and the *phase* of a data schedule that the
progress decides (BERT's short then long sequences, :func:`sesame.data.windows.window_batches`): a
:class:`Phased` source says so. While step ``s`` trains, :class:`Prefetcher` builds step ``s + 1``'s batches for
the phase the progress then is expected to be in, and ready for the device (in pinned memory on CUDA); when step
``s + 1`` begins and the phase turned out otherwise (a time budget crossed the switch sooner than expected), those
batches are dropped and the right ones built. What the model trains on is therefore exactly what the source gives
for (step, phase), as without prefetching, so a run (and its resume) is the same either way.

One thread, not loader processes: the batches' work is mostly tensor operations, which release Python's lock, the
sources close over the objective (a module holding the model) and memory-mapped shards, which worker processes
would each copy, and a thread shares the one set of generators' seeds with nothing to send back and forth. One
batch ahead hides building whenever it takes less than a step; no depth hides it when it takes longer.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

Batch = dict[str, torch.Tensor]
Batches = Callable[[int, float], list[Batch]]  # the trainer's batches(step, progress)
THREAD_NAME = "sesame-batches"


@dataclass(frozen=True)
class Phased:
    """Batches that depend on the progress through a phase alone: ``build(step, phase)``, with ``phase(progress)``
    (the trainer calls it as ``batches(step, progress)``). A source that is not ``Phased`` must not depend on the
    progress at all."""
    build: Callable[[int, Hashable], list[Batch]]
    phase: Callable[[float], Hashable]

    def __call__(self, step: int, progress: float) -> list[Batch]:
        return self.build(step, self.phase(progress))


def phase_of(batches: Batches, progress: float) -> Hashable:
    """The phase ``batches`` are in at ``progress`` (None for a source that does not depend on it)."""
    return batches.phase(progress) if isinstance(batches, Phased) else None


class Prefetcher:
    """Step ``s``'s batches from ``batches``, each passed through ``stage`` (pinning for the device) on one
    background thread; :meth:`ahead` starts the next step's while this one trains, :meth:`take` waits for them (or
    builds them, when none of that step and phase were started). :meth:`close` (always, in a ``finally``) lets the
    batches being built finish and starts no more, so no thread outlives the training loop."""

    def __init__(self, batches: Batches, stage: Callable[[Batch], Batch]):
        self.batches, self.stage = batches, stage
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME)
        self._next: tuple[tuple[int, Hashable], Future] | None = None

    def _build(self, step: int, progress: float) -> list[Batch]:
        return [self.stage(batch) for batch in self.batches(step, progress)]

    def ahead(self, step: int, progress: float) -> None:
        """Start building step ``step``'s batches for the phase of ``progress`` (the progress expected then)."""
        self._next = (step, phase_of(self.batches, progress)), self._pool.submit(self._build, step, progress)

    def take(self, step: int, progress: float) -> list[Batch]:
        """Step ``step``'s batches at ``progress``: those started ahead if they are of this step and phase."""
        started, self._next = self._next, None
        if started is not None and started[0] == (step, phase_of(self.batches, progress)):
            return started[1].result()
        return self._pool.submit(self._build, step, progress).result()  # after any other, which is dropped

    def close(self) -> None:
        self._next = None
        self._pool.shutdown(wait=True, cancel_futures=True)
