"""Temperature-scaled mixing (T5, Raffel et al. 2020, §3.5.2): how often each source's examples are drawn when
several train one model. Fine-tuning's text2text mixtures of tasks (:mod:`sesame.tasks.mixing`) and pre-training's
corpora (``sesame pretrain --mixing-temperature``, :func:`sesame.data.windows.window_batches`) draw this way.

Source m, with e_m examples, is drawn at the rate r_m = min(e_m, K)^(1/T) / Σ_n min(e_n, K)^(1/T): T = 1 draws in
proportion to the sources' sizes (capped at K), larger T moves the rates towards equal mixing, T → ∞ gives it.
"""
from __future__ import annotations

import math
import random
from typing import Hashable, Mapping, TypeVar

from ..errors import SesameError
from ..seeding import example_seed

Source = TypeVar("Source", bound=Hashable)


def mixing_rates(examples: Mapping[Source, int], *, cap: int, temperature: float = 1.0) -> dict[Source, float]:
    """r_m = min(e_m, K)^(1/T) / Σ_n min(e_n, K)^(1/T) for each source m of ``examples`` ({source: e_m}); ``cap`` is K,
    ``temperature`` T (``math.inf``: equal mixing). A source without examples gets rate 0."""
    if not examples or any(not isinstance(n, int) or n < 0 for n in examples.values()):
        raise SesameError(f"mixing: give each source's number of examples, whole numbers of 0 or more "
                          f"({dict(examples)})")
    if cap < 1:
        raise SesameError(f"mixing: the size limit K={cap} must be at least 1")
    if not temperature > 0:
        raise SesameError(f"mixing: the temperature T={temperature} must be above 0")
    if not any(examples.values()):
        raise SesameError("mixing: every source has 0 examples")
    weights = {source: min(n, cap) ** (1 / temperature) if n else 0.0 for source, n in examples.items()}
    total = math.fsum(weights.values())
    return {source: weight / total for source, weight in weights.items()}


def mixture_example(rates: Mapping[Source, float], sizes: Mapping[Source, int], *, seed: int, index: int
                    ) -> tuple[Source, int]:
    """Draw ``index`` of a mixture (training step s's j-th example is draw s·batch_size + j): its source, one uniform
    number read against the cumulative ``rates`` in their order, and which of the source's ``sizes[source]`` examples,
    uniform; both from one generator seeded by (seed, index) alone (:func:`~sesame.seeding.example_seed`;
    Python's Mersenne Twister, the same on every machine)."""

    draw = random.Random(example_seed(seed, index))
    u = draw.random()
    total = math.fsum(rates.values())
    cumulative, source = 0.0, None
    for name, rate in rates.items():
        cumulative += rate / total
        if u < cumulative and rate > 0:
            source = name
            break
    if source is None:  # u at the top, after rounding
        source = next(name for name, rate in reversed(list(rates.items())) if rate > 0)
    return source, draw.randrange(sizes[source])
