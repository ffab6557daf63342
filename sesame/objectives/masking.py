"""What to mask: tokens, whole words, phrases and n-grams, or spans; and how to corrupt what was chosen.

* Tokens (BERT, Devlin et al. 2019, §3.1): :func:`mask_rows`, a batch at once, each row by its own generator
  (:func:`mask_tokens`: one generator).
* Units of whole words (BERT's whole-word masking, google-research/bert README, 2019): the non-special
  tokens of a sequence are grouped into words (:func:`word_index`) and the words into units: one word
  each, an occurrence of a given phrase (:func:`phrase_units`) or a random n-gram of words
  (:func:`ngram_units`), ERNIE's phrase- and entity-level masking (Sun et al. 2019, §3.2).
  :func:`select_units` picks units in random order until 15% of the tokens are covered; every token
  of a chosen unit is selected, so no word is ever split.
* Spans (SpanBERT, Joshi et al. 2020, §3.1): :func:`span_units`.
* Rare tokens more often (DistilBERT's released code, Sanh et al. 2019): :func:`mask_weighted_rows` with the
  weights of :func:`smoothed_weights`.

Every strategy returns ``unit``: per position, the index of the chosen unit it belongs to, or −1;
:func:`mask_units` then applies BERT's 80/10/10 once per unit.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence


def kept_first(values: torch.Tensor, keep: torch.Tensor, width: int) -> torch.Tensor:
    """Each row of ``values`` (batch, L) reduced to its entries where ``keep`` holds, in order, in the first columns of
    a (batch, ``width``) tensor (zeros after a row's last kept entry): boolean indexing without its ``nonzero``, which
    costs ten times more on two busy threads. Contiguous, as a batch's tensors are (a view would fail ``.view``)."""
    place = torch.where(keep, keep.cumsum(-1) - 1, width).clamp(max=width)
    return values.new_zeros(*values.shape[:-1], width + 1).scatter_(-1, place, values)[..., :width].contiguous()


def replacement_pool(vocab_size: int, special_ids: torch.Tensor) -> torch.Tensor:
    """The ids a random replacement is drawn from: every non-special token."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[special_ids] = False
    return allowed.nonzero().squeeze(1)


def uniforms(generators: Sequence[torch.Generator], shape: Sequence[int]) -> torch.Tensor:
    """``[len(generators), *shape]``: row i is ``torch.rand(shape, generator=generators[i])``, the draw one row of
    its own would make."""
    return torch.stack([torch.rand(shape, generator=g) for g in generators])


def replace(ids: torch.Tensor, selected: torch.Tensor, action: torch.Tensor, mask_id: int, pool: torch.Tensor,
            generator: torch.Generator, mask_frac: float = 0.8, random_frac: float = 0.1) -> torch.Tensor:
    """BERT's corruption of the ``selected`` positions of ``ids`` by their uniform draw ``action``, drawing from one
    ``generator`` (:func:`replace_rows` of one row)."""
    row = (t.reshape(1, -1) for t in (ids, selected, action))
    return replace_rows(*row, mask_id, pool, [generator], mask_frac, random_frac).view_as(ids)


def replace_rows(ids: torch.Tensor, selected: torch.Tensor, action: torch.Tensor, mask_id: int, pool: torch.Tensor,
                 generators: Sequence[torch.Generator], mask_frac: float = 0.8, random_frac: float = 0.1
                 ) -> torch.Tensor:
    """BERT's corruption of the ``selected`` positions of a batch (batch, L) by their uniform draw ``action``: [MASK]
    below ``mask_frac``, a random token of ``pool`` below ``mask_frac + random_frac``, else left unchanged. Row ``i``
    draws its random tokens from ``generators[i]``, in position order."""
    corrupted = ids.masked_fill(selected & (action < mask_frac), mask_id)
    randomize = selected & (action >= mask_frac) & (action < mask_frac + random_frac)
    picks = [torch.randint(len(pool), (int(n),), generator=g) for n, g in zip(randomize.sum(-1).tolist(), generators)]
    return corrupted.masked_scatter(randomize, pool.index_select(0, torch.cat(picks)).to(ids.dtype))


def mask_rows(ids: torch.Tensor, special_ids: torch.Tensor, mask_id: int, pool: torch.Tensor,
              generators: Sequence[torch.Generator], *, rate: float = 0.15, mask_frac: float = 0.8,
              random_frac: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level masking of a batch ``ids`` (batch, L), row i drawing from ``generators[i]`` alone: return
    ``(corrupted ids, selected)`` where ``selected`` marks the positions to predict; random tokens come from ``pool``
    (:func:`replacement_pool`). The draws are a row's own, as :func:`mask_tokens` of that row would make them;
    the comparisons and replacements are done on the whole batch at once.

    Deviation (as RoBERTa and Hugging Face): each non-special token is selected by an independent
    Bernoulli(``rate``) draw rather than exactly round(rate·n) per sequence; 80/10/10 is drawn per token.
    """
    eligible = ~torch.isin(ids, special_ids)
    selected = (uniforms(generators, ids.shape[1:]) < rate) & eligible
    action = uniforms(generators, ids.shape[1:])
    corrupted = replace_rows(ids, selected, action, mask_id, pool, generators, mask_frac=mask_frac,
                             random_frac=random_frac)
    return corrupted, selected


def mask_tokens(ids: torch.Tensor, special_ids: torch.Tensor, mask_id: int, vocab_size: int,
                generator: torch.Generator, rate: float = 0.15, mask_frac: float = 0.8,
                random_frac: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mask_rows` of ``ids`` (any shape) as one row drawn by ``generator``, replacing with any non-special
    token of the vocabulary."""
    corrupted, selected = mask_rows(ids.reshape(1, -1), special_ids, mask_id, replacement_pool(vocab_size, special_ids),
                                    [generator], rate=rate, mask_frac=mask_frac, random_frac=random_frac)
    return corrupted.view_as(ids), selected.view_as(ids)


def smoothed_weights(counts: torch.Tensor, smoothing: float, special_ids: torch.Tensor) -> torch.Tensor:
    """DistilBERT's masking weights (its ``train.py``, ``--mlm_smoothing``, 0.7 in its recipe): max(count, 1)^−smoothing
    for each vocabulary entry of its corpus ``counts``, 0 for the special tokens, so that a token is selected in
    proportion to count^−smoothing: rare tokens more often than BERT's uniform choice (smoothing 0) selects them."""
    weights = counts.clamp(min=1).double().pow(-smoothing)
    weights[special_ids] = 0.0
    return weights


def mask_weighted_rows(ids: torch.Tensor, weights: torch.Tensor, mask_id: int, pool: torch.Tensor,
                       generators: Sequence[torch.Generator], *, rate: float = 0.15
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """DistilBERT's selection (its ``distiller.py``, ``prepare_batch_mlm``) in each row of ``ids`` (``[B, L]``):
    :func:`budget` positions drawn without replacement by the row's generator, each in proportion to the ``weights``
    of its token (:func:`smoothed_weights`; 0: never), then BERT's 80/10/10 per token (:func:`replace_rows`).
    Returns ``(corrupted ids, selected)``. Deviation: the released code draws ceil(rate · tokens) positions over a
    whole batch, specials counted; here round(rate · n) of each sequence's n selectable tokens, each sequence by its
    own generator."""
    weight = weights.index_select(0, ids.flatten()).view(ids.shape)  # (not weights[ids]: slow on a busy CPU)
    width = ids.shape[1]
    picks = [torch.multinomial(w, budget(n, rate), replacement=False, generator=g) + row * width
             for row, (w, g, n) in enumerate(zip(weight, generators, (weight > 0).sum(1).tolist())) if n]
    selected = torch.zeros(ids.numel(), dtype=torch.bool)
    if picks:
        selected[torch.cat(picks)] = True
    selected = selected.view(ids.shape)
    action = uniforms(generators, ids.shape[1:])
    return replace_rows(ids, selected, action, mask_id, pool, generators), selected


def mask_units(ids: torch.Tensor, unit: torch.Tensor, n_units: Sequence[int], mask_id: int, pool: torch.Tensor,
               generators: Sequence[torch.Generator], mask_frac: float = 0.8, random_frac: float = 0.1) -> torch.Tensor:
    """80/10/10 decided once per unit, for a batch (batch, L): all tokens of a unit are masked, or all replaced by
    random tokens (each its own), or all kept. ``unit`` is the unit of each position, −1 where unselected; row ``i``
    has ``n_units[i]`` units and draws one uniform per unit from ``generators[i]``."""
    draws = [torch.rand(n, generator=g) for n, g in zip(n_units, generators)]
    per_unit = pad_sequence(draws, batch_first=True, padding_value=1.0)
    selected = unit >= 0
    action = per_unit.gather(1, unit.clamp(min=0)).masked_fill(~selected, 1.0) if per_unit.shape[1] else \
        torch.ones(ids.shape)
    return replace_rows(ids, selected, action, mask_id, pool, generators, mask_frac, random_frac)


def budget(n_tokens: int, rate: float) -> int:
    """How many tokens to select among ``n_tokens``: round(rate·n), at least one (BERT's
    create_pretraining_data)."""
    return max(1, round(rate * n_tokens)) if n_tokens else 0


def word_index(ids: torch.Tensor, special_ids: torch.Tensor, word_starts: torch.Tensor) -> torch.Tensor:
    """The word number (0, 1, ...) of each position of each sequence (the last dimension), −1 at special tokens.

    A word begins at a token ``word_starts`` marks, and also right after a special token (a window may
    begin inside a word; a byte-level BPE line begins without a space).
    """
    eligible = ~torch.isin(ids, special_ids)
    follows_special = torch.cat([eligible.new_ones(*ids.shape[:-1], 1), ~eligible[..., :-1]], -1)
    begins = eligible & (word_starts.index_select(0, ids.flatten()).view(ids.shape) | follows_special)
    return torch.where(eligible, begins.cumsum(-1) - 1, -1)


def after_special(word: torch.Tensor) -> torch.Tensor:
    """A bool per word of each sequence (batch, words): True where it begins right after a special token (or the
    sequence start), i.e. a document boundary that no n-gram or span crosses. ``word``: :func:`word_index`'s (batch,
    L); a row has as many words as the batch's longest, those past its own False."""
    n = int(word.max()) + 1
    begins = (word >= 0) & torch.cat([word.new_ones(word.shape[0], 1, dtype=torch.bool), word[:, :-1] < 0], 1)
    return marked(torch.where(begins, word, n), n)


def marked(index: torch.Tensor, width: int) -> torch.Tensor:
    """(batch, ``width``) bools, True at each row's ``index`` entries below ``width`` (the others are dropped)."""
    return torch.zeros(index.shape[0], width + 1, dtype=torch.bool).scatter_(1, index.clamp(max=width), True)[:, :width]


def word_counts(word: torch.Tensor) -> torch.Tensor:
    """How many words each row of :func:`word_index`'s (batch, L) has."""
    return word.amax(1) + 1  # (not max(1): its indices cost 100 times more on two busy threads)


def ngram_units(word: torch.Tensor, ngram: int, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """The words of each row (:func:`word_index`'s, batch × L) cut into consecutive n-grams of 1..``ngram`` words, n
    drawn with p(n) ∝ 1/n (ALBERT's n-gram masking, Lan et al. 2020, §4.1), one draw per word of the row from its own
    generator, also cut at special tokens; returns the unit of each word (batch, words)."""
    fresh = after_special(word)
    n_words = word_counts(word)
    weights = 1.0 / torch.arange(1, ngram + 1, dtype=torch.float)
    lengths = pad_sequence([torch.multinomial(weights, max(n, 1), replacement=True, generator=g) + 1
                            for n, g in zip(n_words.tolist(), generators)], batch_first=True)
    ends = lengths.cumsum(1)
    cut = marked(torch.where(ends < n_words[:, None], ends, fresh.shape[1]), fresh.shape[1])
    return (fresh | cut).long().cumsum(1) - 1


def phrase_table(phrases: Sequence[Sequence[int]]) -> dict[int, list[tuple[int, ...]]]:
    """Phrases as token-id sequences, looked up by their first token, longest first."""
    table: dict[int, list[tuple[int, ...]]] = {}
    for phrase in sorted({tuple(p) for p in phrases if p}, key=len, reverse=True):
        table.setdefault(phrase[0], []).append(phrase)
    return table


def phrase_units(ids: torch.Tensor, word: torch.Tensor, table: dict[int, list[tuple[int, ...]]]) -> torch.Tensor:
    """The unit of each word: each occurrence of a phrase of ``table`` (:func:`phrase_table`) that begins
    at the first token of a word and ends with the last token of a word is one unit (leftmost, then
    longest, non-overlapping); every other word is a unit of its own."""
    tokens, words = ids.tolist(), word.tolist()
    n = len(tokens)
    firsts = [p for p in range(n) if words[p] >= 0 and (p == 0 or words[p - 1] != words[p])]

    def occurs(p: int, phrase: tuple[int, ...]) -> bool:
        end = p + len(phrase)
        return (tuple(tokens[p:end]) == phrase and -1 not in words[p:end]
                and (end == n or words[end] != words[end - 1]))

    begins_unit = [False] * len(firsts)
    w = 0
    while w < len(firsts):
        begins_unit[w] = True
        p = firsts[w]
        length = next((len(q) for q in table.get(tokens[p], ()) if occurs(p, q)), 1)
        w = words[p + length - 1] + 1
    return torch.tensor(begins_unit, dtype=torch.long).cumsum(0) - 1


def select_units(sizes: Sequence[int], target: int, generator: torch.Generator) -> list[int]:
    """BERT's whole-word selection: go through the units in random order, taking each one that still fits
    in the budget of ``target`` tokens, until it is spent. ``sizes`` are the units' token counts; returns
    the units taken."""
    chosen, covered = [], 0
    for u in torch.randperm(len(sizes), generator=generator).tolist():
        if covered >= target:
            break
        if covered + sizes[u] <= target:
            chosen.append(u)
            covered += sizes[u]
    return chosen


def unit_sizes(unit: torch.Tensor, n_units: int) -> torch.Tensor:
    """The token count of each of the ``n_units`` units (batch, units) of the unit map ``unit`` (batch, L; −1: none)."""
    return torch.zeros(unit.shape[0], n_units + 1, dtype=torch.long).scatter_add_(
        1, torch.where(unit >= 0, unit, n_units), torch.ones_like(unit))[:, :n_units]


def select_words(word: torch.Tensor, unit_of_word: torch.Tensor, rate: float,
                 generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, list[int]]:
    """Select whole units of words (:func:`select_units`) covering ``rate`` of each row's words' tokens, row ``i``
    by ``generators[i]``; ``word`` (batch, L) as :func:`word_index` gives it, ``unit_of_word`` (batch, words).

    Returns ``(unit, n_units)``: the unit of each selected position (−1 elsewhere) and how many units each row has
    (the range of its ``unit``).
    """
    eligible = word >= 0
    if not eligible.any():
        return torch.full_like(word, -1), [0] * len(word)
    last = (word_counts(word) - 1).clamp(min=0)[:, None]
    n_units = torch.where(eligible.any(1), unit_of_word.gather(1, last).squeeze(1) + 1, 0).tolist()
    unit = torch.where(eligible, unit_of_word.gather(1, word.clamp(min=0)), -1)
    width = max(n_units)
    sizes, targets = unit_sizes(unit, width).tolist(), eligible.sum(1).tolist()
    chosen = [r * width + u for r, (n, g) in enumerate(zip(n_units, generators)) if n
              for u in select_units(sizes[r][:n], budget(targets[r], rate), g)]
    taken = marked(torch.tensor(chosen, dtype=torch.long)[None], len(word) * width).view(len(word), width)
    return torch.where(eligible & taken.gather(1, unit.clamp(min=0)), unit, -1), n_units


def geometric(p: float, max_span: int) -> torch.Tensor:
    """The weights of span lengths 1..``max_span`` under Geo(``p``), unnormalised (:func:`span_lengths`)."""
    k = torch.arange(1, max_span + 1, dtype=torch.float64)
    return p * (1 - p) ** (k - 1)


def span_lengths(uniform: torch.Tensor, p: float = 0.2, max_span: int = 10) -> torch.Tensor:
    """Span lengths ℓ ~ Geo(p) on 1..``max_span`` (SpanBERT §3.1), one per entry of ``uniform`` (draws in [0, 1)), by
    inverse transform on the cumulative weights. The paper says "clip"; its stated mean of 3.8 for p = 0.2,
    ℓ_max = 10 is that of the geometric truncated there and renormalised (min(ℓ, 10) would have mean 4.46), so that
    is what is drawn."""
    cdf = geometric(p, max_span).cumsum(0)
    return (uniform.double()[..., None] >= cdf[:-1] / cdf[-1]).sum(-1) + 1  # (not bucketize: 10 times slower)


SPAN_ATTEMPTS = 16  # the (length, start) pairs a row of span_units draws at a time


def span_attempts(n_words: torch.Tensor, drawing: torch.Tensor, generators: Sequence[torch.Generator], p: float,
                  max_span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`SPAN_ATTEMPTS` (length, start) pairs for each row where ``drawing`` holds, from two uniforms per pair
    drawn by its generator: a length (:func:`span_lengths`) and a start ⌊u·words⌋ among the row's ``n_words``; the
    other rows get length 1 at word 0, never played. Returns ``(lengths, starts)``, (batch, attempts) each."""
    rows = drawing.nonzero().squeeze(1)
    draws = torch.zeros(len(n_words), SPAN_ATTEMPTS, 2).index_copy_(
        0, rows, uniforms([generators[r] for r in rows.tolist()], (SPAN_ATTEMPTS, 2)))
    starts = (draws[..., 1].double() * n_words[:, None]).long()
    return span_lengths(draws[..., 0], p, max_span), torch.minimum(starts, (n_words[:, None] - 1).clamp(min=0))


def span_units(word: torch.Tensor, rate: float, generators: Sequence[torch.Generator], p: float = 0.2,
               max_span: int = 10) -> tuple[torch.Tensor, list[int]]:
    """SpanBERT's span masking (Joshi et al. 2020, §3.1) of each row of ``word`` (batch, L; :func:`word_index`'s),
    row ``i`` by ``generators[i]``: repeatedly draw a length ℓ in words (:func:`span_lengths`) and a start uniformly
    among the words, and select those ℓ complete words, until ``rate`` of the tokens is covered.

    Returns ``(unit, n_spans)`` as :func:`select_words`, each span one unit. Details the paper leaves open:
    a start inside an earlier span is drawn again; a span stops early at an earlier span, at a special
    token (a document boundary), at the end of the sequence, or once the budget is spent (so the last
    span may overshoot it by part of one word, never splitting a word). Adjacent spans stay distinct.

    The attempts are played for the whole batch at once, one attempt of every row per step; a row draws them
    :data:`SPAN_ATTEMPTS` at a time (:func:`span_attempts`), a further set only while its budget is unspent, so its
    spans depend on its own draws alone.
    """
    b = len(word)
    n_words = word_counts(word)
    targets = torch.tensor([budget(n, rate) for n in (word >= 0).sum(1).tolist()], dtype=torch.long)
    width = int(n_words.max()) + max_span  # room for a span from any word
    sizes = unit_sizes(word, width)
    fresh = F.pad(after_special(word), (0, max_span))
    span = torch.where(torch.arange(width) < n_words[:, None], -1, 0)  # past a row's words: taken, spans stop there
    covered, n_spans = torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long)
    lengths = starts = torch.zeros(b, 0, dtype=torch.long)
    offset = torch.arange(max_span)
    active, attempt = covered < targets, 0
    while active.any():
        if attempt == lengths.shape[1]:
            more = span_attempts(n_words, active, generators, p, max_span)
            lengths, starts = torch.cat([lengths, more[0]], 1), torch.cat([starts, more[1]], 1)
        place = starts[:, attempt, None] + offset  # the words the span may cover
        now = span.gather(1, place)
        played = active & (now[:, 0] < 0)  # a start inside an earlier span is drawn again
        free = (offset < lengths[:, attempt, None]) & (now < 0) & ~(fresh.gather(1, place) & (offset > 0))
        run = free.long().cumprod(1)  # up to the first word it may not cover
        size = sizes.gather(1, place) * run
        take = played[:, None] & run.bool() & (covered[:, None] + size.cumsum(1) - size < targets[:, None])
        span.scatter_(1, place, torch.where(take, n_spans[:, None], now))
        covered += (size * take).sum(1)
        n_spans += played
        active, attempt = covered < targets, attempt + 1
    return torch.where(word >= 0, span.gather(1, word.clamp(min=0)), -1), n_spans.tolist()
