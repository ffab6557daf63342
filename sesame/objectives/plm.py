"""Permutation language modelling (XLNet, Yang et al. 2019, §2.2–2.4): maximise
E_z [Σ_{t>c} log p(x_{z_t} | x_{z<t})] over factorisation orders z of each sequence, with partial prediction.

* **Factorisation order** (§2.2): sampled per sequence, within blocks of ``perm_size`` text positions (XLNet's
  ``perm_size``): blocks follow one another, each in a random order of its own (:func:`factorisation_order`).
  The inputs are never masked or changed: the order lives only in the attention masks.
* **Partial prediction** (§2.3, eq. 5's target set z>c): only the last 1/K of each block's order is predicted
  (K = ``k``, 6 by default; the paper uses 6–7), about 1/K of the sequence (:func:`select_targets`). The
  non-targets are visible to every position; a target's content stream sees the non-targets, the targets before
  it in the order and itself, its query stream the same without itself (:func:`permutation_masks`). Choosing the
  last 1/K per block rather than of the whole order is the order "all non-targets first, then each block's
  targets in order", which is a factorisation order whose last 1/K is predicted.
* **Span-based targets** (§3.1: "we first sample a length L ∈ [1, · · · , 5], and then randomly select a consecutive
  span of L tokens as prediction targets within a context of (KL) tokens"), with ``max_span`` = 5
  (:func:`span_targets`): contexts of K·L tokens follow one another along the segment, each holding one span at a
  uniform place; L is drawn with p(L) ∝ 1/L, as the code's ``_sample_mask`` draws it. As the code's ``num_predict``,
  each segment predicts exactly round(n/K) tokens: the spans in order up to that count (the last cut short), then,
  where the contexts ran out first, single tokens drawn uniformly from the rest. The targets take their places in
  the factorisation order last, in the sampled order among themselves. The ``xlnet`` family's row sets 5: the paper
  pre-trains so and the released models learned so, at the same number of predictions (compute) as the order's last
  1/K. The objective's own default stays 0 (the last 1/K of the order, §2.3's definition), so a run made before the
  option, whose config.json records only the options it was given, resumes as it began. (The code's loop advances by
  L + ``mask_alpha``·L per span, 1/7 of the tokens, and reaches 1/6 by its top-up; the paper's K·L is followed here.)
* **Bidirectional data** (§3.1: "each of the forward and backward directions takes half of the batch size"), with
  ``bi_data``: an example is read right to left with probability 1/2 (drawn from its own generator): its whole
  window reversed, then cut into segments, each still ending with ``<sep> <cls>`` (the code reverses the token stream
  before building segments), and the backbone counts its relative distances the other way
  (:func:`sesame.models.xlnet.relative_encodings`). The row sets it too (the paper's pre-training); the objective's
  default, off, keeps earlier runs as they were.
* **Two streams** (§2.3): the LM head (the tied word embedding plus a bias, XLNet's ``lm_loss``) reads the
  query stream at the predicted positions only, batch × P rows, P = the predicted count per segment.
* **Memory** (§2.4, Transformer-XL recurrence): an example is ``segments`` consecutive segments of the text;
  segment s reads the states of the segments before it (up to the model's ``mem_len``) as memory, with stopped
  gradients, and each segment's loss counts. The memory holds only text (XLNet's ``reuse_len``): each segment
  ends with ``<sep> <cls>`` (XLNet's input ends with them; segment id 2 for ``<cls>``, XLNet's ``SEG_ID_CLS``),
  which stay out of the order (never predicted, visible to all as non-targets) and out of the memory.

Evaluation (:meth:`PermutationLM.token_losses`, ``sesame evaluate``) reads a long text left to right instead: the
identity order with every token predicted, segment after segment with the memory carried, so the losses sum to
−log p(text) (perplexity, bits per byte).

Every random draw (the orders) comes from the example's own generator; the masks are built from the ranks in
batched tensor operations on the model's device.

Deviations: one text part per segment (XLNet's pre-training input is ``A <sep> B <sep> <cls>``, B sometimes from
another document, with no loss on it); a span starts anywhere, where the code moves it to the next word's first
piece; each example draws its direction, where the code reverses exactly the second half of each batch; XLNet's
code applies one within-block order to every block and lets ``<sep>``/``<cls>`` take places in the order, here each
block draws its own and the two are plain context; memory is carried across the segments of one example, not
across training steps (examples are shuffled windows, so a step's memory would come from unrelated text).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import SesameError
from ..models.xlnet import Streams, XLNet
from ..tokenizer import SpecialIds
from .base import Objective
from .masking import kept_first
from .projection import Workspace, linear_cross_entropy

CLS_SEGMENT = 2  # XLNet's segment id of the final <cls> (SEG_ID_CLS); text and <sep> are segment 0
ENDING = 2  # <sep> <cls> end each segment


def check_options(*, k: int = 6, perm_size: int | None = None, segments: int = 2, max_span: int = 0,
                  bi_data: bool = False) -> None:
    """Refuse options the objective cannot use, naming the flag."""
    for name, value, least in (("k", k, 1), ("perm_size", perm_size, 1), ("segments", segments, 1),
                               ("max_span", max_span, 0)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise SesameError(f"--objective-option {name}={value}: give a whole number of at least {least} (k: 1/k of "
                              "each order is predicted, XLNet's 6; perm_size: positions per permuted block, default "
                              "the whole segment; segments: consecutive segments per example, read with memory; "
                              "max_span: the longest target span, XLNet's 5, 0 for none)")
    if not isinstance(bi_data, bool):
        raise SesameError(f"--objective-option bi_data={bi_data}: give true (half the examples read right to left, "
                          "XLNet's pre-training) or false")


def factorisation_order(keys: torch.Tensor, perm_size: int) -> torch.Tensor:
    """The rank of each position in its factorisation order (…, n), from uniform draws ``keys`` in [0, 1): blocks
    of ``perm_size`` positions in turn, each in the order of its keys."""
    n = keys.shape[-1]
    block = torch.arange(n, device=keys.device) // perm_size
    return torch.argsort(torch.argsort(keys + block, dim=-1), dim=-1)


def select_targets(rank: torch.Tensor, perm_size: int, k: int) -> torch.Tensor:
    """Whether each position (…, n) is predicted: the last 1/K of its block's order (``rank``, as
    :func:`factorisation_order` gives it), 1/K of the block's size rounded, at least one."""
    n = rank.shape[-1]
    start = torch.arange(n, device=rank.device) // perm_size * perm_size
    size = (n - start).clamp(max=perm_size)
    return rank - start >= size - (size / k).round().clamp(min=1).long()


def span_draws(n: int, k: int, max_span: int, rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One example's span draws for ``rows`` segments of ``n`` tokens, (rows, S) each (:func:`placed_spans`): lengths
    L ∈ 1..``max_span`` with p ∝ 1/L, and a uniform place in [0, 1) for each span."""
    spans = n // k + 1  # no more contexts of ≥ K tokens fit
    lengths = torch.multinomial((1.0 / torch.arange(1, max_span + 1)).expand(rows, -1), spans, replacement=True,
                                generator=generator) + 1
    return lengths, torch.rand(rows, spans, generator=generator)


def placed_spans(lengths: torch.Tensor, place: torch.Tensor, n: int, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The spans of segments of ``n`` tokens from their draws (:func:`span_draws`; any leading dimensions): their
    contexts' starts, and the spans' starts and lengths. Each context is K·L tokens, contexts follow one another, and
    a span sits at its ``place`` inside its context. Lengths are cut so that the spans hold at most round(n/K) tokens
    (the first that would pass it is cut short, later ones get 0), and a span past the end gets 0."""
    goal = max(1, round(n / k))
    contexts = k * lengths
    begins = contexts.cumsum(-1) - contexts
    starts = begins + (place * (contexts - lengths + 1)).long()  # [0, KL − L]
    kept = (goal - (lengths.cumsum(-1) - lengths)).clamp(min=0).minimum(lengths)
    return begins, starts, torch.where(starts + kept <= n, kept, 0)


def sample_spans(n: int, k: int, max_span: int, rows: int, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The spans of ``rows`` segments of ``n`` tokens, (rows, S) each, drawn from ``generator`` (:func:`span_draws`,
    :func:`placed_spans`)."""
    return placed_spans(*span_draws(n, k, max_span, rows, generator), n, k)


def topped_up(starts: torch.Tensor, lengths: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """Whether each position (…, n) is predicted: the tokens of the spans ``starts`` and ``lengths`` (…, S), topped
    up with single tokens taken from the rest in the order of their uniform ``keys`` (…, n) to exactly round(n/K) (at
    least 1), as the code tops up to ``num_predict``."""
    n = keys.shape[-1]
    ones = torch.ones_like(starts)  # +1 where a span begins, −1 where it ends: inside while the running sum is positive
    edges = starts.new_zeros(*keys.shape[:-1], n + 1).scatter_add_(-1, starts.clamp(max=n), ones)
    covered = edges.scatter_add_(-1, (starts + lengths).clamp(max=n), -ones).cumsum(-1)[..., :n] > 0
    order = keys.masked_fill(covered, 2.0).argsort(-1).argsort(-1)  # the rest, in a random order
    return covered | (order < (max(1, round(n / k)) - covered.sum(-1, keepdim=True)))


def span_targets(n: int, k: int, max_span: int, rows: int, generator: torch.Generator) -> torch.Tensor:
    """Whether each of ``rows`` segments' ``n`` positions is predicted (rows, n): :func:`sample_spans`' spans, then
    :func:`topped_up` by a draw of keys from the same ``generator``."""
    _, starts, lengths = sample_spans(n, k, max_span, rows, generator)
    return topped_up(starts, lengths, torch.rand(rows, n, generator=generator), k)


def permutation_masks(rank: torch.Tensor, targets: torch.Tensor, past: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The content and query masks (True: may attend) of one segment from ``rank`` (batch, length): a target's rank
    in the order, −1 for every non-target (they come first, all visible to each other), and the predicted positions
    ``targets`` (batch, P). Content (batch, length, past + length): position i sees j when rank_j ≤ rank_i; query
    (batch, P, past + length): target i sees j when rank_j < rank_i; both see the ``past`` memory keys."""
    content = rank[:, None, :] <= rank[:, :, None]
    query = rank[:, None, :] < rank.gather(1, targets)[:, :, None]
    if past:
        content, query = (torch.cat([m.new_ones(*m.shape[:2], past), m], -1) for m in (content, query))
    return content, query


class PermutationLM(Objective):
    """XLNet's permutation LM over an :class:`~sesame.models.xlnet.XLNet` backbone."""

    name = "plm"
    arch = "xlnet"
    reads_text = True
    options = ("k", "perm_size", "segments", "max_span", "bi_data")

    def __init__(self, backbone: XLNet, specials: SpecialIds, k: int = 6, perm_size: int | None = None,
                 segments: int = 2, max_span: int = 0, bi_data: bool = False):
        super().__init__(backbone, specials)
        check_options(k=k, perm_size=perm_size, segments=segments, max_span=max_span, bi_data=bi_data)
        self.k, self.perm_size, self.segments, self.max_span, self.bi_data = k, perm_size, segments, max_span, bi_data
        self.bias = torch.nn.Parameter(torch.zeros(backbone.config.vocab_size))
        self.workspace = Workspace()

    @staticmethod
    def window_length(seq_len: int, segments: int = 2, **options) -> int:
        check_options(segments=segments, **options)  # refused here, before a run is written
        if seq_len <= ENDING:
            raise SesameError(f"--seq-len {seq_len}: a segment needs room for text and <sep> <cls>; use 3 or more")
        return segments * (seq_len - ENDING)

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``ids`` (batch, segments, length): each segment's text then <sep> <cls>; ``rank`` (same shape): a target's
        place in its segment's order, −1 elsewhere; ``predict`` (batch, segments, P): the predicted positions, in
        position order; ``targets``: their tokens; with ``bi_data``, ``backward`` (batch,): the examples whose window
        is read right to left."""
        b, n = windows.shape[0], windows.shape[1] // self.segments
        keys, *draws = (torch.stack(d) for d in zip(*(self.example_draws(n, g) for g in generators)))
        rank = factorisation_order(keys, self.perm_size or n)
        if self.max_span:
            lengths, place, top_up, *draws = draws
            _, starts, lengths = placed_spans(lengths, place, n, self.k)
            target = topped_up(starts, lengths, top_up, self.k)
        else:
            target = select_targets(rank, self.perm_size or n, self.k)
        extra = {}
        if self.bi_data:
            extra["backward"] = draws[0]
            windows = torch.where(extra["backward"][:, None], windows.flip(-1), windows)
        text = windows.view(b, self.segments, n)
        ending = torch.tensor([self.specials.sep, self.specials.cls], dtype=windows.dtype).expand(b, self.segments, -1)
        predicted = int(target[0, 0].sum())  # the same count in every segment
        predict = kept_first(torch.arange(n).expand(b, self.segments, n), target, predicted)
        rank = torch.cat([torch.where(target, rank, -1), torch.full((b, self.segments, ENDING), -1)], -1)
        return {"ids": torch.cat([text, ending], -1), "rank": rank, "predict": predict,
                "targets": text.gather(-1, predict), **extra}

    def example_draws(self, n: int, generator: torch.Generator) -> list[torch.Tensor]:
        """Every draw of one example with segments of ``n`` tokens, in the order it makes them: its orders' keys; with
        ``max_span``, its spans (:func:`span_draws`) and their top-up's keys (:func:`topped_up`); with ``bi_data``,
        whether it is read right to left."""
        draws = [torch.rand(self.segments, n, generator=generator)]
        if self.max_span:
            draws += [*span_draws(n, self.k, self.max_span, self.segments, generator),
                      torch.rand(self.segments, n, generator=generator)]
        if self.bi_data:
            draws.append(torch.rand((), generator=generator) < 0.5)
        return draws

    def segment(self, ids: torch.Tensor, rank: torch.Tensor, predict: torch.Tensor,
                memory: list[torch.Tensor] | None, backward: torch.Tensor | None = None) -> Streams:
        """Both streams over one segment ``ids`` (batch, length: text then <sep> <cls>) after ``memory``, under the
        masks of the ranks ``rank`` and the predicted positions ``predict`` (:func:`permutation_masks`), the rows
        ``backward`` marks read right to left."""
        b, length = ids.shape
        types = torch.zeros(length, dtype=torch.long, device=ids.device)
        types[-1] = CLS_SEGMENT
        content, query = permutation_masks(rank, predict, memory[0].shape[1] if memory else 0)
        return self.backbone.streams(ids, types=types.expand(b, -1), memory=memory, content_mask=content,
                                     query_mask=query, targets=predict, backward=backward)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The summed loss of every segment's targets, each segment after the memory of those before it."""
        ids, rank, predict = batch["ids"], batch["rank"], batch["predict"]
        segments, length = ids.shape[1:]
        memory, total = None, ids.new_zeros((), dtype=torch.float)
        for s in range(segments):
            out = self.segment(ids[:, s], rank[:, s], predict[:, s], memory, batch.get("backward"))
            total = total + linear_cross_entropy(out.query.flatten(0, 1), self.backbone.embed.tokens.weight,
                                                 batch["targets"][:, s].flatten(), self.bias, workspace=self.workspace)
            if s + 1 < segments:
                memory = self.backbone.remember(memory, out.layers, length - ENDING)
        return total

    def token_losses(self, text: torch.Tensor, seq_len: int) -> torch.Tensor:
        """−log p of each token of ``text`` (batch, T), read left to right as a language model: consecutive segments
        of ``seq_len`` − 2 tokens (the last may be shorter), each followed by <sep> <cls> as in pre-training, every
        token a target in the identity order (z = 1 … T, one of the factorisation orders the objective averages over,
        §2.2), each segment after the memory of those before it, up to the backbone's ``mem_len`` (0: none): how
        Transformer-XL evaluates (Dai et al. 2019, §3.2). Token t reads only the tokens before it, so the sum over a
        row is −log p(row) by the chain rule: perplexity and bits per byte."""
        b, n = text.shape[0], seq_len - ENDING
        ending = torch.tensor([self.specials.sep, self.specials.cls], device=text.device).expand(b, -1)
        memory, losses = None, []
        for start in range(0, text.shape[1], n):
            piece = text[:, start:start + n]
            order = torch.arange(piece.shape[1], device=text.device).expand(b, -1)
            rank = torch.cat([order, order.new_full((b, ENDING), -1)], 1)  # <sep> <cls>: context, never predicted
            out = self.segment(torch.cat([piece, ending], 1), rank, order, memory)
            logits = (self.tied_logits(out.query) + self.bias).float()
            losses.append(F.cross_entropy(logits.flatten(0, 1), piece.flatten(), reduction="none").view(piece.shape))
            memory = self.backbone.remember(memory, out.layers, piece.shape[1])
        return torch.cat(losses, 1)
