"""Multi-task mixing (T5, Raffel et al. 2020, §3.5.2): how often each task's examples are drawn when several
text-to-text tasks train one model.

Examples-proportional mixing with an artificial data set size limit K and a temperature T: task m, with e_m
examples, is drawn at the rate

    r_m = min(e_m, K)^(1/T) / Σ_n min(e_n, K)^(1/T).

T = 1 is examples-proportional mixing capped at K (the cap keeps a huge task from crowding out the others);
larger T moves the rates towards equal mixing, T → ∞ gives it exactly. Which task a draw comes from is a function
of (seed, step) alone (:func:`mixture_task`), so a resumed run draws as the uninterrupted one did.
"""
from __future__ import annotations

import math
import random
from typing import Mapping

from ..data.windows import example_seed
from ..errors import SesameError


def mixing_rates(examples: Mapping[str, int], *, cap: int, temperature: float = 1.0) -> dict[str, float]:
    """r_m = min(e_m, K)^(1/T) / Σ_n min(e_n, K)^(1/T) for each task m of ``examples`` ({task: e_m}); ``cap`` is K,
    ``temperature`` T (``math.inf``: equal mixing). A task without examples gets rate 0."""
    if not examples or any(not isinstance(n, int) or n < 0 for n in examples.values()):
        raise SesameError(f"mixing: give each task's number of examples, whole numbers of 0 or more ({dict(examples)})")
    if cap < 1:
        raise SesameError(f"mixing: the size limit K={cap} must be at least 1")
    if not temperature > 0:
        raise SesameError(f"mixing: the temperature T={temperature} must be above 0")
    if not any(examples.values()):
        raise SesameError("mixing: every task has 0 examples")
    weights = {task: min(n, cap) ** (1 / temperature) if n else 0.0 for task, n in examples.items()}
    total = math.fsum(weights.values())
    return {task: weight / total for task, weight in weights.items()}


def mixture_task(rates: Mapping[str, float], *, seed: int, step: int) -> str:
    """The task draw ``step`` (an example's or a batch's index) comes from: one uniform number from a generator seeded
    by (seed, step) alone (:func:`~sesame.data.windows.example_seed`; Python's Mersenne Twister, the same on every
    machine), read against the cumulative rates in the order of ``rates``."""
    u = random.Random(example_seed(seed, step)).random()
    total = math.fsum(rates.values())
    cumulative = 0.0
    for task, rate in rates.items():
        cumulative += rate / total
        if u < cumulative and rate > 0:
            return task
    return next(task for task, rate in reversed(list(rates.items())) if rate > 0)  # u at the top, after rounding
