"""``sesame pretrain --size auto``: the model a time budget affords, by a compute-optimal rule.

Hoffmann et al. (2022, "Training Compute-Optimal Large Language Models", §3 and Table 3) found that for a fixed
compute budget the best model is trained on about :data:`TOKENS_PER_PARAMETER` tokens per parameter, and that most
models of their day were too large for the data they saw (Kaplan et al. 2020 found a best size for each budget
too). The rule here: of the family's sizes (:data:`sesame.families.SIZES`, smallest first), each timed for a few
steps on this machine, pick the largest whose parameters × 20 fit in the tokens its measured throughput gives in
the budget; the smallest when none does. Parameters are counted without the embedding tables (Kaplan et al.'s N):
a lookup costs nothing per parameter, and at these sizes the token table would otherwise be most of the count.

This is a heuristic carried over from models of 70M to 16B parameters trained for days; at minutes on a CPU it is
to be validated by the ablations of issue 36 (benchmarks/time_to_quality.py), not taken as measured.

The batch follows the choice: the family's batch unless the budget would give fewer than :data:`MIN_STEPS`
optimizer steps of it, then halved (down to :data:`SMALLEST_BATCH`) so the warm-up and the decay, which are shares
of the budget, have steps to act on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

TOKENS_PER_PARAMETER = 20  # Hoffmann et al. 2022: compute-optimal training tokens per parameter
MIN_STEPS = 300  # optimizer steps a budget should give, else the batch is halved
SMALLEST_BATCH = 8
RULE = "Hoffmann et al. 2022: tokens >= 20 x non-embedding parameters (a heuristic, issue 36)"


@dataclass(frozen=True)
class Candidate:
    """A size of the family as measured on this machine: its non-embedding parameters and training tokens per
    second (wall clock, as the budget is)."""
    size: str
    parameters: int
    tokens_per_second: float

    def affordable(self, minutes: float) -> float:
        """The training tokens ``minutes`` give at this candidate's throughput."""
        return self.tokens_per_second * 60 * minutes

    def fits(self, minutes: float) -> bool:
        """Compute-optimal or better: the budget gives at least 20 tokens per parameter."""
        return TOKENS_PER_PARAMETER * self.parameters <= self.affordable(minutes)


@dataclass(frozen=True)
class Sizing:
    """config.json's ``sizing``: what ``--size auto`` chose, from what it measured, and by which rule. A resumed run
    reads it back and measures nothing."""
    size: str
    parameters: int
    tokens_per_second: float
    minutes: float
    affordable_tokens: int
    batch_size: int
    measured: dict[str, float]  # tokens per second of each size timed, smallest first
    rule: str = RULE

    def line(self) -> str:
        """The one line ``sesame pretrain`` prints."""
        timed = ", ".join(f"{size} {rate:,.0f}" for size, rate in self.measured.items())
        return (f"--size auto: {self.size} ({self.parameters / 1e6:.2f}M parameters without embeddings; "
                f"{self.affordable_tokens:,} tokens in {self.minutes:g} minutes at {self.tokens_per_second:,.0f} "
                f"tokens/s; {TOKENS_PER_PARAMETER} per parameter wanted; batch {self.batch_size}; measured tokens/s: "
                f"{timed})")


def choose(candidates: list[Candidate], minutes: float) -> Candidate:
    """The largest of ``candidates`` (smallest first) that :meth:`~Candidate.fits` the budget, else the smallest."""
    fitting = [c for c in candidates if c.fits(minutes)]
    return fitting[-1] if fitting else candidates[0]


def measured_candidates(sizes: Iterable[str], measure: Callable[[str], Candidate], minutes: float
                        ) -> list[Candidate]:
    """``measure`` each size, smallest first, stopping after the first that does not fit: a larger one has more
    parameters and a lower throughput, so it would not fit either, and timing it would spend the budget."""
    candidates = []
    for size in sizes:
        candidates.append(measure(size))
        if not candidates[-1].fits(minutes):
            break
    return candidates


def batch_for(tokens: float, *, batch_size: int, window: int, accumulate: int = 1) -> int:
    """``batch_size`` halved while ``tokens`` give fewer than :data:`MIN_STEPS` steps of ``window``-token examples
    (never below :data:`SMALLEST_BATCH`, and staying a multiple of ``accumulate``)."""
    while (tokens / (batch_size * window) < MIN_STEPS and batch_size // 2 >= SMALLEST_BATCH
           and (batch_size // 2) % accumulate == 0):
        batch_size //= 2
    return batch_size


def sizing(sizes: Iterable[str], measure: Callable[[str], Candidate], *, minutes: float, batch_size: int,
           window: int, accumulate: int = 1, keep_batch: bool = False) -> Sizing:
    """The choice of ``--size auto`` for a budget of ``minutes`` (the module's rule); ``keep_batch``: the user gave
    the batch."""
    candidates = measured_candidates(sizes, measure, minutes)
    chosen = choose(candidates, minutes)
    tokens = chosen.affordable(minutes)
    batch = batch_size if keep_batch else batch_for(tokens, batch_size=batch_size, window=window,
                                                    accumulate=accumulate)
    return Sizing(size=chosen.size, parameters=chosen.parameters, tokens_per_second=round(chosen.tokens_per_second, 1),
                  minutes=minutes, affordable_tokens=int(tokens), batch_size=batch,
                  measured={c.size: round(c.tokens_per_second, 1) for c in candidates})
