"""BART's denoising (Lewis et al. 2020, §2.2), as a data transform: clean windows → (encoder inputs,
decoder targets), needing no model.

The noising functions, applied in this order, each on when its option is above 0
(:class:`DenoisingOptions`; the defaults are the paper's best, text infilling + sentence permutation):

* sentence permutation: ⌈ratio·n⌉ of a window's n sentences change places at random (all at ratio 1).
  The sentences' ends are given per window, recorded before packing, so permutation works on packed text.
* text infilling: round(0.3·words) whole words masked in spans whose lengths in words are drawn from
  Poisson(λ = 3); each span collapses to one ``<mask>``, or, for 10% of the spans, one random token; a
  span of length 0 inserts a ``<mask>`` between two words.
* token masking: round(ratio·n) of the n tokens become ``<mask>``.
* token deletion: round(ratio·n) of the n tokens are deleted.
* document rotation: with probability ``rotate_ratio`` the window is rotated to begin at a token chosen
  uniformly.

Words begin where ``word_starts`` (a bool per vocabulary entry, :meth:`TextTokenizer.word_starts`: for
byte-level BPE a token beginning with ``Ġ``) says, and after a special token (:func:`.masking.word_index`).
Special tokens (the separator between packed documents, masks already placed) are never masked,
deleted or counted. Inputs are ``<s> noised </s>``, padded on the right to the longest row; targets are the
clean ``<s> window </s>``, as in fairseq's BART, whose decoder reads the targets shifted right behind ``</s>``.

Deviations from fairseq's ``DenoisingDataset`` (the paper's code):

* Spans never overlap: the spans, the zero-length spans and the unmasked words are laid out in a random
  order, so exactly round(0.3·words) words are masked (fairseq draws span starts independently among the
  words; overlapping spans merge and mask fewer). Counts are rounded (fairseq takes the ceiling), as
  :func:`.masking.budget`, at least one.
* A zero-length span's ``<mask>`` goes between words (fairseq: between any two tokens) and becomes a random
  token as often as any span; a random token is never a special one (fairseq: any id but 0).
* A span across a special token leaves it in place, one ``<mask>`` on each side of it.
* Token masking and deletion are options of their own that compose with infilling (fairseq picks one of
  them as its masking mode); token masking writes ``<mask>`` only, never a random token.
* Sentence ends are given (fairseq finds them at full stops, which packing into blocks loses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from ..errors import SesameError
from ..tokenizer import SpecialIds
from .masking import budget, kept_first, word_index


@dataclass(frozen=True)
class DenoisingOptions:
    """Every ratio is a fraction; 0 turns its noising off. The paper gives no rate for token masking,
    deletion or rotation alone (§4 compares each one by one), so they are off by default."""

    mask_ratio: float = 0.3  # text infilling: the fraction of words masked (§5.1: "30% of tokens")
    poisson_lambda: float = 3.0  # the mean span length, in words
    random_ratio: float = 0.1  # the fraction of spans that become a random token instead of <mask>
    permute_ratio: float = 1.0  # sentence permutation: the fraction of sentences shuffled ("all sentences")
    token_mask_ratio: float = 0.0
    delete_ratio: float = 0.0
    rotate_ratio: float = 0.0  # document rotation: the probability that a window is rotated

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name != "poisson_lambda" and not 0 <= value <= 1:
                raise SesameError(f"--objective-option {field.name}={value}: give a fraction from 0 to 1 "
                                  f"(BART: {field.default})")
        if self.poisson_lambda <= 0:
            raise SesameError(f"--objective-option poisson_lambda={self.poisson_lambda}: give a mean span length "
                              "above 0 (BART: 3)")


def sentence_places(ends: Sequence[int], length: int, ratio: float, generator: torch.Generator) -> list[int]:
    """The new place of each sentence of one window when ⌈ratio·n⌉ of its n sentences are shuffled among their
    places (fairseq's rule); ``ends`` are the sentences' end offsets in the window of ``length`` tokens, increasing
    (a last sentence runs to the window's end)."""
    ends = [e for e in ends if e != length] + [length]
    if any(b <= a for a, b in zip([0] + ends, ends)):
        raise ValueError(f"sentence ends {ends} are not increasing offsets inside a window of {length} tokens")
    n = len(ends)
    chosen = torch.randperm(n, generator=generator)[:math.ceil(n * ratio)].tolist()
    place = list(range(n))
    for moved, to in zip(torch.randperm(len(chosen), generator=generator).tolist(), chosen):
        place[chosen[moved]] = to  # sentence → its new place
    return place


def permute_sentences(windows: torch.Tensor, ends: Sequence[Sequence[int]], ratio: float,
                      generators: Sequence[torch.Generator]) -> torch.Tensor:
    """Each window of ``windows`` (batch, L) with its sentences shuffled (:func:`sentence_places`, row ``i`` by
    ``generators[i]``), the tokens moved for the whole batch at once."""
    b, length = windows.shape
    places = [sentence_places(e, length, ratio, g) for e, g in zip(ends, generators)]
    cuts = [i * length + e for i, row in enumerate(ends) for e in row if e != length]
    sentence = torch.zeros(b * length, dtype=torch.long).index_fill_(0, torch.tensor(cuts, dtype=torch.long), 1)
    place = pad_sequence([torch.tensor(p, dtype=torch.long) for p in places], batch_first=True)
    order = (place.gather(1, sentence.view(b, length).cumsum(1)) * length + torch.arange(length)).argsort(1)
    return windows.gather(1, order)


def infill_draws(n_words: Sequence[int], options: DenoisingOptions, *, mask: int, pool: torch.Tensor,
                 generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, ...]:
    """Each row's draws for text infilling of its ``n_words[i]`` words, from ``generators[i]`` in the order one row
    alone made them (a row without words makes none): span lengths ~ Poisson(λ) until they cover round(ratio·words),
    the last cut to fit exactly (some may be 0); a random order of the spans and the unmasked words; which spans
    become a random token, and which. Returns, for the rows' items end to end, each in its order: its size in words
    (a span's length, 1 for an unmasked word), its span, numbered in the batch (−1: an unmasked word), and its row;
    and the token each span collapses to."""
    rows = [(i, n, budget(n, options.mask_ratio), g) for i, (n, g) in enumerate(zip(n_words, generators)) if n]
    if not rows:
        return (torch.zeros(0, dtype=torch.long),) * 4
    rates = torch.full((max(m for _, _, m, _ in rows),), options.poisson_lambda)
    drawn = []
    for _, _, masked, g in rows:
        lengths = torch.poisson(rates[:masked], generator=g)
        while lengths.sum() < masked:
            lengths = torch.cat([lengths, torch.poisson(rates[:masked], generator=g)])
        drawn.append(lengths)
    drawn = pad_sequence(drawn, batch_first=True)
    covered, masked = drawn.cumsum(1), torch.tensor([m for _, _, m, _ in rows])
    last = (covered < masked[:, None]).sum(1)  # the first span reaching the total
    column = torch.arange(drawn.shape[1])
    cut = torch.where(column == last[:, None], masked[:, None] - (covered - drawn), drawn)
    span_length = cut.masked_select(column <= last[:, None]).long()
    spans = last + 1
    orders, randoms, picks = [], [], []
    for (_, n, m, g), s in zip(rows, spans.tolist()):
        orders.append(torch.randperm(s + n - m, generator=g))  # the spans, then the unmasked words, shuffled
        randoms.append(torch.rand(s, generator=g))
        picks.append(torch.randint(len(pool), (s,), generator=g))
    # (index_select and masked_select, not t[index] and t[mask]: on busy cores those cost 10-100 times more)
    order = torch.cat(orders)
    item = row_of_items([len(o) for o in orders])  # its row among ``rows``
    span = torch.where(order < spans.index_select(0, item), order + (spans.cumsum(0) - spans).index_select(0, item), -1)
    sizes = torch.where(span >= 0, span_length.index_select(0, span.clamp(min=0)), 1)
    token = torch.where(torch.cat(randoms) < options.random_ratio, pool.index_select(0, torch.cat(picks)), mask)
    return sizes, span, torch.tensor([i for i, _, _, _ in rows]).index_select(0, item), token


def row_of_items(counts: Sequence[int]) -> torch.Tensor:
    """``i`` repeated ``counts[i]`` times (each count above 0), as a cumulative sum of row starts."""
    starts = torch.tensor(counts[:-1], dtype=torch.long).cumsum(0)  # long also when there is one row
    return torch.zeros(sum(counts), dtype=torch.long).index_fill_(0, starts, 1).cumsum(0)


def infill(ids: torch.Tensor, word: torch.Tensor, options: DenoisingOptions, *, mask: int, pool: torch.Tensor,
           generators: Sequence[torch.Generator], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Text infilling of a batch ``ids`` (batch, L) whose words are ``word`` (:func:`.masking.word_index`, −1 at
    specials), row ``i`` drawing from ``generators[i]`` alone (:func:`infill_draws`), the spans laid out on the whole
    batch at once. Returns ``(rows, lengths)``: the infilled rows, padded with ``pad`` on the right, and their
    lengths."""
    b, length = ids.shape
    n_words = word.amax(1) + 1  # 0 for a row without words
    if not n_words.any():
        return ids, torch.full((b,), length)
    sizes, owner, item_row, token = infill_draws(n_words.tolist(), options, mask=mask, pool=pool,
                                                 generators=generators)
    token = token.to(ids.dtype)
    # the items of all rows end to end: row i's words are numbered from first_word[i] on
    first_word = n_words.cumsum(0) - n_words
    ends = sizes.cumsum(0)
    inside = word >= 0
    batch_word = torch.where(inside, word + first_word[:, None], 0)
    total = int(n_words.sum())  # the item of each word: how many items end at or before it (not searchsorted: slow)
    span_of_word = owner.index_select(0, torch.bincount(ends, minlength=total + 1)[:total].cumsum(0))
    span = torch.where(inside, span_of_word.index_select(0, batch_word.flatten()).view(b, length), -1)
    first = (span >= 0) & (span != F.pad(span[:, :-1], (1, 0), value=-1))
    keep = (span < 0) | first
    positions = torch.arange(length).expand(b, length)
    # a zero-length span before word w goes before w's first token; one after a row's last word, after its last token
    begins = torch.full_like(span_of_word, length).scatter_reduce(0, batch_word.masked_select(inside),
                                                                  positions.masked_select(inside), "amin")
    after_last = torch.where(inside, positions, -1).amax(1) + 1
    inserts = (sizes == 0) & (owner >= 0)
    at = (ends - sizes).masked_select(inserts)  # the word the insert goes before, numbered in the batch
    row = item_row.masked_select(inserts)
    before = torch.where(at < (first_word + n_words).index_select(0, row), begins.index_select(0, at.clamp(
        max=len(begins) - 1)), after_last.index_select(0, row))
    collapsed = token.index_select(0, span.clamp(min=0).flatten()).view(b, length)
    values = torch.cat([torch.where(first, collapsed, ids).masked_select(keep),
                        token.index_select(0, owner.masked_select(inserts))])
    rows = torch.cat([torch.arange(b)[:, None].expand(b, length).masked_select(keep), row])
    keys = torch.cat([2 * positions.masked_select(keep) + 1, 2 * before])  # an insert goes first
    order = (rows * (2 * length + 2) + keys).sort(stable=True).indices
    lengths = keep.sum(1) + torch.bincount(row, minlength=b)
    width = int(lengths.max())
    rows = rows.index_select(0, order)
    places = rows * width + torch.arange(len(rows)) - (lengths.cumsum(0) - lengths).index_select(0, rows)
    return ids.new_full((b * width,), pad).index_copy_(0, places, values.index_select(0, order)).view(b, width), lengths


def chosen_tokens(rows: torch.Tensor, lengths: torch.Tensor, special_ids: torch.Tensor, ratio: float,
                  generators: Sequence[torch.Generator]) -> torch.Tensor:
    """A bool per position of ``rows`` (batch, L), of which row ``i`` holds ``lengths[i]`` tokens: round(ratio·n) of
    its n non-special tokens, chosen uniformly, as ``randperm(n)`` of ``generators[i]`` orders them."""
    eligible = ~torch.isin(rows, special_ids) & (torch.arange(rows.shape[1]) < lengths[:, None])
    counts = eligible.sum(1).tolist()
    picks = [torch.randperm(n, generator=g)[:budget(n, ratio)] for n, g in zip(counts, generators)]
    width = max(counts)  # a column past every row's candidates, where the padding of ``picks`` lands
    chosen = torch.zeros(len(rows), width + 1, dtype=torch.bool).scatter_(
        1, pad_sequence(picks, batch_first=True, padding_value=width), True)
    return eligible & chosen.gather(1, (eligible.cumsum(1) - 1).clamp(min=0))  # a candidate's rank among its row's


def noise_tokens(rows: torch.Tensor, lengths: torch.Tensor, options: DenoisingOptions, *, mask: int,
                 special_ids: torch.Tensor, generators: Sequence[torch.Generator], pad: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token masking, token deletion and rotation (without ``<s>`` and ``</s>``), after infilling, of a batch ``rows``
    (batch, L) whose row ``i`` holds ``lengths[i]`` tokens then ``pad``, row ``i`` drawing from ``generators[i]`` what
    it drew alone (:func:`chosen_tokens`; for rotation a uniform, then a start if it is below ``rotate_ratio``).
    Returns ``(rows, lengths)``, padded to the longest row."""
    positions = torch.arange(rows.shape[1])
    if options.token_mask_ratio:
        rows = rows.masked_fill(chosen_tokens(rows, lengths, special_ids, options.token_mask_ratio, generators), mask)
    if options.delete_ratio:
        kept = ~chosen_tokens(rows, lengths, special_ids, options.delete_ratio, generators) & \
            (positions < lengths[:, None])
        rows, lengths = kept_first(rows, kept, rows.shape[1]), kept.sum(1)
    if options.rotate_ratio:
        rotated = [float(torch.rand(1, generator=g)) < options.rotate_ratio for g in generators]
        starts = torch.tensor([int(torch.randint(max(n, 1), (1,), generator=g)) if r else 0  # (an emptied row: 0)
                               for r, n, g in zip(rotated, lengths.tolist(), generators)], dtype=torch.long)
        rows = rows.gather(1, (positions + starts[:, None]) % lengths.clamp(min=1)[:, None])
    inside = positions < lengths[:, None]
    return rows.masked_fill(~inside, pad)[:, :int(lengths.max())], lengths


def denoise(windows: torch.Tensor, generators: list[torch.Generator], *,
            sentence_ends: Sequence[Sequence[int]] | None, specials: SpecialIds, word_starts: torch.Tensor,
            pool: torch.Tensor, options: DenoisingOptions = DenoisingOptions()) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise ``windows`` (batch, L) of clean token ids, row ``i`` drawing from ``generators[i]`` only, in the order one
    row alone drew: sentence permutation, text infilling, token masking, deletion and rotation (the last three off by
    default), each laid out for the whole batch at once.

    ``sentence_ends[i]``: the end offsets of window ``i``'s sentences (needed for sentence permutation);
    ``specials``: ``cls`` and ``sep`` are BART's ``<s>`` and ``</s>``; ``pool``: the tokens a random
    replacement is drawn from (:func:`.masking.replacement_pool`). Returns ``(inputs, targets)``: inputs
    padded with ``specials.pad`` to the longest row (mostly shorter than L + 2, though inserted masks may
    make a row longer), targets (batch, L + 2).
    """
    b = len(windows)
    bos, eos = windows.new_full((b, 1), specials.cls), windows.new_full((b, 1), specials.sep)
    special_ids = torch.tensor(specials.all)
    permuted = windows
    if options.permute_ratio:
        if sentence_ends is None:
            raise ValueError("sentence permutation needs the windows' sentence ends (or permute_ratio=0)")
        permuted = permute_sentences(windows, sentence_ends, options.permute_ratio, generators)
    rows, lengths = permuted, torch.full((b,), permuted.shape[1])
    if options.mask_ratio:
        rows, lengths = infill(permuted, word_index(permuted, special_ids, word_starts), options, mask=specials.mask,
                               pool=pool, generators=generators, pad=specials.pad)
    if options.token_mask_ratio or options.delete_ratio or options.rotate_ratio:
        rows, lengths = noise_tokens(rows, lengths, options, mask=specials.mask, special_ids=special_ids,
                                     generators=generators, pad=specials.pad)
    inputs = F.pad(rows, (1, 1), value=specials.pad)
    inputs[:, 0] = specials.cls
    inputs[torch.arange(b), lengths + 1] = specials.sep
    return inputs, torch.cat([bos, windows, eos], 1)
