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


def document_parts(row: torch.Tensor, sep: int) -> torch.Tensor:
    """``(n, 2)``: start and end of each maximal run of ``row`` free of the separator ``sep``."""
    edges = F.pad((row != sep).int(), (1, 1)).diff()
    return torch.stack([(edges == 1).nonzero()[:, 0], (edges == -1).nonzero()[:, 0]], 1)


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

    def split(self, window: torch.Tensor, generator: torch.Generator) -> tuple[int, int, int]:
        """``(lo, cut, hi)``: A = ``window[lo:cut]`` and B = ``window[cut:hi]``, in one document part."""
        parts = document_parts(window, self.specials.sep)
        lengths = parts[:, 1] - parts[:, 0]
        roomy = lengths >= 2 * MIN_SEGMENT
        weights = lengths * roomy if roomy.any() else (lengths == lengths.max())
        lo, hi = parts[int(torch.multinomial(weights.float(), 1, generator=generator))].tolist()
        margin = min(MIN_SEGMENT, (hi - lo) // 2)
        first, last = lo + margin, hi - margin
        cut = int(torch.randint(first, last + 1, (), generator=generator))
        ends = torch.isin(window, self.sentence_ends).nonzero()[:, 0] + 1  # cuts right after a sentence end
        ends = ends[(ends >= first) & (ends <= last)]
        if len(ends):
            cut = int(ends[(ends - cut).abs().argmin()])
        return lo, cut, hi

    def pair(self, window: torch.Tensor, partner: torch.Tensor | None, generator: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(first segment, second segment, label)`` of one example."""
        raise NotImplementedError

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``ids``, ``types``, ``padding`` (True at real tokens) of shape (batch, window + 3), MaskedLM's
        ``positions``, ``targets`` and ``masked``, and the pair ``labels``."""
        examples = [self.pair(w, None if partners is None else partners[i], g)
                    for i, (w, g) in enumerate(zip(windows, generators))]
        n, length = len(examples), windows.shape[1] + 3
        ids = torch.full((n, length), self.specials.pad, dtype=torch.long)
        types = torch.zeros(n, length, dtype=torch.long)
        padding = torch.zeros(n, length, dtype=torch.bool)
        cls, sep = torch.tensor([self.specials.cls]), torch.tensor([self.specials.sep])
        for i, (a, b, _) in enumerate(examples):
            row = torch.cat([cls, a, sep, b, sep])
            ids[i, : len(row)] = row
            types[i, len(a) + 2: len(row)] = 1
            padding[i, : len(row)] = True
        labels = torch.tensor([label for _, _, label in examples], dtype=torch.long)
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

    def pair(self, window: torch.Tensor, partner: torch.Tensor | None, generator: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor, int]:
        if partner is None:
            raise ValueError("next-sentence prediction needs partner windows from other documents")
        random_next = bool(torch.rand((), generator=generator) < 0.5)
        lo, cut, hi = self.split(window, generator)
        if not random_next:
            return window[lo:cut], window[cut:hi], 0
        return window[lo:cut], self.random_next(partner, hi - cut), 1

    def random_next(self, partner: torch.Tensor, n: int) -> torch.Tensor:
        """``n`` tokens of the partner's first document part (fewer if it ends sooner)."""
        lo, hi = document_parts(partner, self.specials.sep)[0].tolist()
        starts = torch.isin(partner[lo:hi], self.sentence_ends).nonzero()[:, 0] + lo + 1
        starts = starts[starts + n <= hi]
        start = int(starts[0]) if len(starts) else lo
        return partner[start: min(start + n, hi)]


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

    def pair(self, window: torch.Tensor, partner: torch.Tensor | None, generator: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor, int]:
        swapped = bool(torch.rand((), generator=generator) < 0.5)
        lo, cut, hi = self.split(window, generator)
        a, b = window[lo:cut], window[cut:hi]
        return (b, a, 1) if swapped else (a, b, 0)
