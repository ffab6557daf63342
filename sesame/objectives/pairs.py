"""Masked LM plus a sentence-pair task on the pooled [CLS]: BERT's next-sentence prediction
(Devlin et al. 2019, §3.1 Task #2, Appendix A.2) and ALBERT's sentence-order prediction (Lan et al.
2020, §3.1).

An example is ``[CLS] A [SEP] B [SEP]``, segment (token-type) 0 for ``[CLS] A [SEP]`` and 1 for
``B [SEP]``, then padding up to the model length. A and B come from one contiguous window of the
packed token stream, where documents are separated by the separator token:

* the window is split into its document parts (the runs between separators); one part is drawn
  with probability proportional to its length (as a uniformly drawn token would pick it) among
  the parts long enough to give A and B ``MIN_SEGMENT`` tokens each, or the longest part if none is;
* the cut between A and B is drawn uniformly so that each keeps ``MIN_SEGMENT`` tokens, then moved
  to the nearest sentence end in that range (right after a token that decodes to '.', '!' or '?'),
  if there is one;
* A and B never contain a separator; when the part is shorter than the window, the rest of the
  sequence is padding (``padding`` is True at real tokens).

The pair label is 0 for a true pair and 1 otherwise, as in BERT's and ALBERT's code (Hugging Face's
``next_sentence_label`` and ``sentence_order_label``). The forward pass returns the summed MLM and
pair losses, and the batch their counts (masked tokens, sequences), so the trainer minimises mean
MLM + mean pair loss over the global batch, as BERT's total loss.

Deviations from the papers: BERT packs whole sentences up to the target length and draws how many
go to A; here a contiguous window is cut at a sentence end (or at the drawn point when the range
holds none), so A may begin and B may end mid-sentence, and each holds ``MIN_SEGMENT`` tokens
rather than at least one sentence. BERT's 10% of shorter sequences
(``short_seq_prob``, in its code, not the paper) are not drawn. Masking is MaskedLM's (dynamic,
unless the batcher fixes the seeds).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..models import Transformer
from ..tokenizer import SpecialIds, TextTokenizer
from .mlm import MaskedLM

MIN_SEGMENT = 4  # fewest tokens in A and in B when the document part allows it
SENTENCE_ENDS = (".", "!", "?")


def sentence_end_ids(tokenizer: TextTokenizer) -> torch.Tensor:
    """Ids of the tokens that decode to '.', '!' or '?' (surrounding spaces aside)."""
    texts = tokenizer.backend.decode_batch([[i] for i in range(tokenizer.vocab_size)])
    return torch.tensor([i for i, text in enumerate(texts) if text.strip() in SENTENCE_ENDS], dtype=torch.long)


def document_parts(rows: torch.Tensor, sep: int) -> torch.Tensor:
    """Each maximal run of the last dimension of ``rows`` free of the separator ``sep``, in reading order: ``(n, 2)``
    (start, end) for one row, ``(n, 3)`` (row, start, end) for a batch."""
    edges = F.pad((rows != sep).int(), (1, 1)).diff()
    return torch.cat([(edges == 1).nonzero(), (edges == -1).nonzero()[:, -1:]], 1)


def coins(generators: Sequence[torch.Generator]) -> torch.Tensor:
    """A fair coin per row, one uniform draw of the row's generator: True below 0.5."""
    return torch.stack([torch.rand((), generator=g) for g in generators]) < 0.5


@dataclass(frozen=True)
class Segments:
    """A segment per row i of a batch: ``tokens[i, start[i]:end[i]]``."""
    tokens: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        return self.end - self.start

    def laid(self, offset: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's segment laid from column ``offset[i]`` of a row of ``width`` columns: ``(tokens, inside)``, the
        tokens there and where they are (elsewhere ``tokens`` holds any of the row's)."""
        column = torch.arange(width) - offset[:, None]
        inside = (column >= 0) & (column < self.lengths[:, None])
        source = (self.start[:, None] + column).clamp(0, self.tokens.shape[1] - 1)
        return self.tokens.gather(1, source), inside


class SentencePairs(MaskedLM):
    """Masked LM plus a two-way classifier on BERT's pooler (dense + tanh on the first position).

    ``pooler`` is shaped as :class:`~sesame.tasks.classify.SequenceModel`'s, so fine-tuning can start from
    it. ``sentence_ends`` (ids of sentence-final tokens) is set by :meth:`build` from the tokenizer;
    left empty, cuts fall at the drawn point. Subclasses name their head ``task`` and draw the pair.
    """

    pairs = True
    task = ""

    def __init__(self, backbone: Transformer, specials: SpecialIds, **options):
        super().__init__(backbone, specials, **options)
        hidden = backbone.config.hidden
        self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        self.add_module(self.task, nn.Linear(hidden, 2))
        for layer in (self.pooler[0], self.get_submodule(self.task)):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
        self.sentence_ends = torch.empty(0, dtype=torch.long)

    @property
    def classified(self) -> tuple[str, ...]:
        return (self.task,)

    @classmethod
    def build(cls, backbone: Transformer, tokenizer: TextTokenizer, **options) -> "SentencePairs":
        objective = super().build(backbone, tokenizer, **options)
        objective.sentence_ends = sentence_end_ids(tokenizer)
        return objective

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        return seq_len - 3  # room for [CLS] and two [SEP]

    def split(self, windows: torch.Tensor, generators: Sequence[torch.Generator]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(lo, cut, hi)`` per row: A = ``windows[i, lo:cut]`` and B = ``windows[i, cut:hi]``, in one document part;
        row i draws the part and the cut from ``generators[i]``, one call each, all else done on the batch at once."""
        b, width = windows.shape
        row, lo, hi = document_parts(windows, self.specials.sep).unbind(1)
        lengths = hi - lo
        roomy = lengths >= 2 * MIN_SEGMENT
        any_roomy = torch.zeros(b, dtype=torch.long).index_add_(0, row, roomy.long()) > 0
        longest = torch.zeros(b, dtype=torch.long).scatter_reduce_(0, row, lengths, "amax")
        weights = torch.where(any_roomy[row], lengths * roomy, lengths == longest[row]).float()
        counts = torch.bincount(row, minlength=b)
        drawn = torch.cat([torch.multinomial(w, 1, generator=g)
                           for w, g in zip(weights.split(counts.tolist()), generators)])
        part = counts.cumsum(0) - counts + drawn
        lo, hi = lo[part], hi[part]
        margin = ((hi - lo) // 2).clamp(max=MIN_SEGMENT)
        first, last = lo + margin, hi - margin
        cut = torch.tensor([int(torch.randint(f, l + 1, (), generator=g))
                            for f, l, g in zip(first.tolist(), last.tolist(), generators)])
        cuts = torch.arange(1, width + 1)  # the cut right after each position: after a sentence end, when in range
        after_end = torch.isin(windows, self.sentence_ends) & (cuts >= first[:, None]) & (cuts <= last[:, None])
        distance = (cuts - cut[:, None]).abs().masked_fill(~after_end, width + 1)
        return lo, torch.where(after_end.any(1), cuts[distance.argmin(1)], cut), hi

    def pair(self, windows: torch.Tensor, partners: torch.Tensor | None, generators: Sequence[torch.Generator]
             ) -> tuple[Segments, Segments, torch.Tensor]:
        """``(first segments, second segments, labels)`` of a batch."""
        raise NotImplementedError

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``ids``, ``types``, ``padding`` (True at real tokens) of shape (batch, window + 3), MaskedLM's
        ``positions``, ``targets`` and ``masked``, and the pair ``labels``."""
        a, b, labels = self.pair(windows, partners, generators)
        n, width = windows.shape[0], windows.shape[1] + 3
        a_tokens, in_a = a.laid(torch.ones(n, dtype=torch.long), width)
        b_tokens, in_b = b.laid(a.lengths + 2, width)
        column, end = torch.arange(width), (a.lengths + b.lengths + 3)[:, None]
        padding = column < end
        ids = torch.where(in_a, a_tokens, torch.where(in_b, b_tokens, torch.where(padding, self.specials.sep,
                                                                                   self.specials.pad)))
        ids[:, 0] = self.specials.cls
        types = ((column >= (a.lengths + 2)[:, None]) & padding).long()
        batch = {**self.masked(ids, generators), "types": types, "padding": padding, "labels": labels}
        return {**batch, "counts": {"mlm": batch["masked"], self.task: n}}

    def score(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The summed MLM and pair-classification losses, and how many pair labels the classifier gets right."""
        hidden = self.backbone(batch["ids"], batch["types"], batch["padding"])
        logits = self.get_submodule(self.task)(self.pooler(hidden[:, 0]))
        losses = {"mlm": self.mlm_loss(hidden, batch),
                  self.task: F.cross_entropy(logits, batch["labels"], reduction="sum")}
        return losses, {self.task: (logits.argmax(-1) == batch["labels"]).sum()}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The summed MLM loss and the summed pair-classification loss."""
        return self.score(batch)[0]


class BertPretraining(SentencePairs):
    """BERT: masked LM + next-sentence prediction (Devlin et al. 2019, §3.1 Task #2).

    Half the time B is the true continuation of A (label 0); otherwise (label 1) B is as many
    tokens of the partner window, read from its first document part, which the batcher drew from
    another document of the same source file (:func:`sesame.data.windows.partners`), starting
    right after its first sentence end that leaves room for them, else at the part's start, so that
    a random B, like a true one, tends to begin a sentence (BERT starts it at a random sentence).
    Deviations: B is shorter, and the example more padded, when that part ends sooner; documents are
    drawn in proportion to their length (a uniform window), where BERT draws one uniformly.
    """

    name = "mlm_nsp"
    task = "nsp"
    part_names = ("mlm", "nsp")

    def pair(self, windows: torch.Tensor, partners: torch.Tensor | None, generators: Sequence[torch.Generator]
             ) -> tuple[Segments, Segments, torch.Tensor]:
        if partners is None:
            raise ValueError("next-sentence prediction needs partner windows from other documents")
        random_next = coins(generators)
        lo, cut, hi = self.split(windows, generators)
        other = self.random_next(partners, hi - cut)
        second = Segments(torch.where(random_next[:, None], partners, windows),
                          torch.where(random_next, other.start, cut), torch.where(random_next, other.end, hi))
        return Segments(windows, lo, cut), second, random_next.long()

    def random_next(self, partners: torch.Tensor, n: torch.Tensor) -> Segments:
        """``n[i]`` tokens of partner i's first document part (fewer if it ends sooner), from right after its first
        sentence end that leaves room for them, else from the part's start."""
        width = partners.shape[1]
        positions = torch.arange(width)
        lo = (partners != self.specials.sep).int().argmax(1)
        closing = (partners == self.specials.sep) & (positions >= lo[:, None])
        hi = torch.where(closing.any(1), closing.int().argmax(1), width)
        starts = positions + 1  # right after each position
        room = (torch.isin(partners, self.sentence_ends) & (positions >= lo[:, None]) & (positions < hi[:, None])
                & (starts + n[:, None] <= hi[:, None]))
        start = torch.where(room.any(1), starts[room.int().argmax(1)], lo)
        return Segments(partners, start, torch.minimum(start + n, hi))


class AlbertPretraining(SentencePairs):
    """ALBERT: masked LM + sentence-order prediction (Lan et al. 2020, §3.1).

    A and B are consecutive segments of one document: in order half the time (label 0), swapped
    (``[CLS] B [SEP] A [SEP]``, label 1) otherwise. Partner windows are not read. ALBERT's n-gram
    masking is MaskedLM's option, not this class's.
    """

    name = "mlm_sop"
    task = "sop"
    part_names = ("mlm", "sop")
    pairs = False  # both segments come from the example's own window

    def pair(self, windows: torch.Tensor, partners: torch.Tensor | None, generators: Sequence[torch.Generator]
             ) -> tuple[Segments, Segments, torch.Tensor]:
        swapped = coins(generators)
        lo, cut, hi = self.split(windows, generators)
        return (Segments(windows, torch.where(swapped, cut, lo), torch.where(swapped, hi, cut)),
                Segments(windows, torch.where(swapped, lo, cut), torch.where(swapped, cut, hi)), swapped.long())
