"""T5's span corruption (Raffel et al. 2020, §3.1.4), as a data transform: clean windows → (encoder
inputs, decoder targets), needing no model.

Of a window of L tokens, exactly round(density·L) are noise (clamped to [1, L − 1]), in
round(noise / mean span) spans (at least one). The noise tokens and the other tokens are each split at
random into that many non-empty spans, interleaved starting with kept tokens (T5's
``random_spans_noise_mask``, without ``random_roll``: a window opens with kept tokens and ends with
noise). Each noise span becomes one sentinel in the inputs; the targets are the noise spans, each after
its sentinel::

    inputs   keep₀ <X₀> keep₁ <X₁> … keep₋₁ <X₋₁> </s>
    targets  <X₀> span₀ <X₁> span₁ … <X₋₁> span₋₁ </s>

Sentinel ids count down from the top of the vocabulary (``<extra_id_0>`` = vocab − 1), as T5's
vocabulary has them (:func:`sentinel_ids`). Every window of a batch has the same length, hence the same
number of noise tokens and spans, so inputs and targets need no padding; :func:`raw_length` chooses the
window length that fills a given input length exactly (T5's ``random_spans_helper``).

Documents: sesame's windows are packed across documents with ``</s>`` closing each, so a noise span could hold
``</s>`` in mid-target, and an input a ``</s>`` before its end, which T5 never shows its model: its
``reduce_concat_tokens`` joins documents with nothing between them (``</s>`` is appended only after the split
inputs and targets). With ``separators=False``, the t5 rows' option, each window's ``</s>`` are dropped before
corruption; runs made before the option (none recorded) keep them, the option's default. Every input is still
exactly ``--seq-len`` tokens (static shapes, for ``--compile``): a window reads ``spare_tokens`` more tokens than
its T5 length (4 in the t5 rows) and drops its first separators, up to that many, then its last tokens, down to
that length (:func:`filled`). Deviations: a window holding more separators than that keeps its last ones, and a
window without separators skips its last ``spare_tokens`` tokens (4 of 151 at ``--seq-len 128``). Runs made with
``separators=false`` before ``spare_tokens`` (recorded as 0) read as they were: each batch's rows cut to the shortest
one's length (:func:`joined`), inputs a few tokens short of ``--seq-len``, a shape per batch.

Deviation: the number of spans is also capped at the number of kept tokens, so that an option with
more noise than text (density near 1) still gives non-empty kept spans; at the paper's values the cap
never binds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SesameError
from .masking import kept_first


@dataclass(frozen=True)
class SpanCorruptionOptions:
    """The paper's values (§3.1.4): 15% of the tokens are noise, in spans of 3 tokens on average."""

    noise_density: float = 0.15
    mean_span: float = 3.0
    separators: bool = True  # keep the </s> between documents in the windows (False: T5's, module docstring)
    spare_tokens: int = 0  # with separators false: tokens read past a window to stand in for its </s> (0: cut)

    def __post_init__(self) -> None:
        if not isinstance(self.separators, bool):
            raise SesameError(f"--objective-option separators={self.separators}: give true (keep the </s> between "
                              "documents) or false (T5's: documents joined with nothing between)")
        if isinstance(self.spare_tokens, bool) or not isinstance(self.spare_tokens, int) or self.spare_tokens < 0 \
                or (self.spare_tokens and self.separators):
            raise SesameError(f"--objective-option spare_tokens={self.spare_tokens}: give a whole number of tokens "
                              "from 0, with separators=false (the t5 rows: 4), read past each window to stand in for "
                              "the </s> it drops")
        if not 0 < self.noise_density < 1:
            raise SesameError(f"--objective-option noise_density={self.noise_density}: give a fraction "
                              "strictly between 0 and 1 (T5: 0.15)")
        if self.mean_span < 1:
            raise SesameError(f"--objective-option mean_span={self.mean_span}: give a mean span length of at "
                              "least 1 token (T5: 3)")

    def counts(self, length: int) -> tuple[int, int]:
        """``(noise tokens, noise spans)`` in a window of ``length`` (at least 2) tokens."""
        noise = min(max(round(length * self.noise_density), 1), length - 1)
        return noise, min(max(round(noise / self.mean_span), 1), length - noise)

    def lengths(self, length: int) -> tuple[int, int]:
        """``(inputs, targets)`` lengths from a window of ``length`` tokens, each with its sentinels and </s>."""
        noise, spans = self.counts(length)
        return length - noise + spans + 1, noise + spans + 1


def raw_length(inputs_length: int, options: SpanCorruptionOptions = SpanCorruptionOptions()) -> tuple[int, int]:
    """``(window length, targets length)``: the longest window whose inputs fit in ``inputs_length``
    (T5's ``random_spans_helper``: 568 raw tokens → 512 inputs and 114 targets)."""
    length = max(inputs_length - 1, 2)  # a window of inputs_length − 1 tokens fits: spans ≤ noise tokens
    if options.lengths(length)[0] > inputs_length:
        raise SesameError(f"an input length of {inputs_length} leaves no room for text, a sentinel and </s>: "
                          "give a longer sequence length")
    while options.lengths(length + 1)[0] <= inputs_length:
        length += 1
    return length, options.lengths(length)[1]


def sentinel_ids(vocab_size: int, count: int = 100) -> torch.Tensor:
    """T5's sentinels ``<extra_id_0>`` … ``<extra_id_{count−1}>``: ids vocab − 1, vocab − 2, …"""
    return vocab_size - 1 - torch.arange(count)


def filled(windows: torch.Tensor, separator: int, length: int) -> torch.Tensor:
    """T5's ``reduce_concat_tokens`` on windows read longer than ``length``: each row of ``windows`` (batch, L) without
    its first ``separator`` tokens, up to L − ``length`` of them, and cut to ``length`` tokens."""
    dropped = windows == separator
    dropped &= dropped.cumsum(1) <= windows.shape[1] - length
    return kept_first(windows, ~dropped, length)


def joined(windows: torch.Tensor, separator: int) -> torch.Tensor:
    """T5's ``reduce_concat_tokens`` as runs made before ``spare_tokens`` read it: each row of ``windows`` (batch, L)
    without its ``separator`` tokens (documents joined with nothing between), every row cut to the shortest row's
    length."""
    kept = windows != separator
    return kept_first(windows, kept, int(kept.sum(1).min()))


def cuts(items: int, runs: int, generator: torch.Generator) -> torch.Tensor:
    """Where ``items`` split at random into ``runs`` non-empty runs are cut, uniformly over the ways to do so: ``runs``
    − 1 distinct offsets in 0..``items`` − 2, unsorted (one ``randperm`` draw), each the end of a run less one."""
    return torch.randperm(items - 1, generator=generator)[:runs - 1]


def run_lengths(cut: torch.Tensor, items: int) -> torch.Tensor:
    """The runs' lengths (batch, runs) of ``items`` cut at each row's ``cut`` (batch, runs − 1) of :func:`cuts`."""
    b = cut.shape[0]
    edges = torch.cat([cut.new_zeros(b, 1), cut.sort(1).values + 1, cut.new_full((b, 1), items)], 1)
    return edges.diff(dim=1)


def noise_spans(length: int, options: SpanCorruptionOptions, generators: list[torch.Generator]) -> torch.Tensor:
    """Per position of a window of each generator's row (batch, length), its span number: even for kept spans
    (0, 2, …), odd for noise (1, 3, …). Each row draws its kept tokens' split, then its noise's, from its own
    generator; the arithmetic runs on the whole batch."""
    noise, spans = options.counts(length)
    draws = [(cuts(length - noise, spans, g), cuts(noise, spans, g)) for g in generators]
    kept = run_lengths(torch.stack([d[0] for d in draws]), length - noise)
    noisy = run_lengths(torch.stack([d[1] for d in draws]), noise)
    starts = torch.stack([kept, noisy], 2).flatten(1).cumsum(1)[:, :-1]
    return torch.zeros(len(generators), length, dtype=torch.long).scatter_(1, starts, 1).cumsum(1)


def corrupt_spans(windows: torch.Tensor, generators: list[torch.Generator], *, sentinels: torch.Tensor, eos: int,
                  options: SpanCorruptionOptions = SpanCorruptionOptions()) -> tuple[torch.Tensor, torch.Tensor]:
    """Span-corrupt ``windows`` (batch, L) of clean token ids: row ``i`` draws from ``generators[i]`` only.

    Returns ``(inputs, targets)`` of shapes (batch, ``options.lengths(L)``), with ``sentinels[j]`` standing
    for the j-th noise span of a row (:func:`sentinel_ids`) and ``eos`` closing both.
    """
    b, length = windows.shape
    if length < 2:
        raise SesameError(f"span corruption needs windows of at least 2 tokens, not {length}")
    spans = options.counts(length)[1]
    if spans > len(sentinels):
        raise SesameError(f"a window of {length} tokens has {spans} noise spans but the vocabulary has "
                          f"{len(sentinels)} sentinels: use shorter windows or more sentinels")
    run = noise_spans(length, options, generators)
    noisy = run % 2 == 1
    begins = run != torch.cat([run.new_full((b, 1), -1), run[:, :-1]], 1)
    # kept run 2j and noise run 2j + 1 both map to <X_j> (index_select: a tensor index costs 30 times more)
    marker = sentinels.to(windows.dtype).index_select(0, (run // 2).flatten()).view(b, length)
    inputs_length, targets_length = options.lengths(length)
    # a noise run → its sentinel in the inputs, a kept run → the next sentinel in the targets; both closed by </s>
    inputs = kept_first(torch.where(noisy, marker, windows), ~noisy | begins, inputs_length)
    targets = kept_first(torch.where(noisy, windows, marker), noisy | begins, targets_length)
    inputs[:, -1], targets[:, -1] = eos, eos
    return inputs, targets
