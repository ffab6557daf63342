"""A causal language model as the library's decoders and scorers use it: a causal backbone whose output
layer is its tied input embedding, with its tokenizer (:class:`LanguageModel`), loaded from a run or a
transformers directory, and the log-probabilities it gives continuations of prompts
(:func:`continuation_logprobs`). Generation (:mod:`sesame.generation`) and in-context classification
(:mod:`sesame.apps.prompting`) are built on it.

The model lives on its :class:`sesame.runtime.Placement`'s device and computes under its autocast; its callers
build token ids on the CPU and move them with :meth:`LanguageModel.to_device`; logits and scores come back in
float32 (scores on the CPU).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence, TypeVar

import torch

from .errors import SesameError
from .interop import resolve
from .models import Transformer
from .models.transformer import KVCache
from .models.vocabulary import vocabulary_scores
from .run import RunConfig, load_backbone, load_tokenizer, read_config
from .runtime import Placement, Runtime, to_device
from .tasks.base import pad
from .tokenizer import TextTokenizer

T = TypeVar("T")
BATCH_TOKENS = 8192  # token positions per forward pass of continuation_logprobs (rows × padded width)


class LanguageModel:
    """A causal backbone whose output layer is its tied input embedding, with its tokenizer.

    A checkpoint imported from transformers may carry *aliases*: rows appended for sesame's special
    roles, copies of the checkpoint's own tokens (GPT-2's ``</s>`` copies ``<|endoftext|>``,
    :mod:`sesame.interop.hf_tokenizer`). They are left out of the output distribution (``output``), so
    probabilities are the checkpoint's, and the document separator is the checkpoint's own (``end``).
    ``placement``: where it runs (default: the CPU in float32)."""

    def __init__(self, backbone: Transformer, tokenizer: TextTokenizer, config: RunConfig | None = None, *,
                 placement: Placement | None = None):
        if not backbone.config.causal:
            raise SesameError("--model: generation and prompting need a causal language model (gpt, gpt2)")
        self.placement = placement or Placement.cpu()
        self.backbone, self.tokenizer, self.config = self.placement.model(backbone).eval(), tokenizer, config
        aliases = ((config.hf if config else None) or {}).get("tokenizer", {}).get("aliases", {})
        sep = tokenizer.backend.id_to_token(tokenizer.specials.sep)
        self.end = tokenizer.backend.token_to_id(aliases.get(sep, sep))  # ends a document, and a generation
        self.vocab = backbone.config.vocab_size - len(aliases)  # the aliases are the last rows

    @classmethod
    def load(cls, run: str | Path, flag: str = "--model", *, placement: Placement | None = None) -> LanguageModel:
        """A pre-trained causal run (for transformers directories, see :func:`load_language_model`)."""
        config = read_config(run, flag, ("pretrained",))
        if not config.causal:
            raise SesameError(f"{flag} {run}: a bidirectional {config.family} model; generation and prompting "
                              "need a causal language model (family gpt or gpt2)")
        return cls(load_backbone(run, flag), load_tokenizer(run, flag), config, placement=placement)

    @property
    def device(self) -> torch.device:
        return self.placement.device

    def to_device(self, tensors: T) -> T:
        """A tensor, or a tuple of them, made on the CPU, on the model's device."""
        return to_device(tensors, self.device)

    def cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KV cache for ``batch`` rows of up to ``capacity`` tokens, on the model's device, in the type its
        keys and values are computed in."""
        return KVCache(self.backbone.config, batch, capacity, dtype=self.placement.dtype, device=self.device)

    @property
    def output(self) -> torch.Tensor:
        """The output projection: the token embedding's rows, aliases left out."""
        return self.backbone.embed.tokens.weight[: self.vocab]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text as the start of a document: the separator, then its tokens (no other special tokens)."""
        return [[self.end, *ids] for ids in self.tokenizer.encode(list(texts), special=False)]

    def logits(self, ids: torch.Tensor, *, padding: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """Next-token logits at the last position of each row: (batch, vocabulary), in float32 on the model's device
        (the inputs must be there)."""
        with self.placement.autocast():
            hidden = self.backbone(ids, padding=padding, positions=positions, cache=cache)
            return vocabulary_scores(hidden[:, -1], self.output).float()


def load_language_model(model: str, *, runtime: Runtime | None = None) -> LanguageModel:
    """A run directory or a transformers directory with a causal LM head (``GPT2LMHeadModel``), loaded onto
    ``runtime``'s device (default :class:`Runtime`'s: ``auto``)."""
    placement = (runtime or Runtime()).place()
    with resolve(model, "--model") as run:
        return LanguageModel.load(run, placement=placement)


def _shared_rows(continuations: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The rows to append to a prompt so that every continuation can be scored, and each one's row.

    Continuation ``c`` of L tokens is read off positions P−1 … P+L−2 of a row (P: the prompt's length)
    whose appended tokens begin with ``c[:-1]``; continuations share rows where they can (all
    single-token verbalisers share the prompt alone)."""
    rows: list[tuple[int, ...]] = []
    row_of = [0] * len(continuations)
    for c in sorted(range(len(continuations)), key=lambda c: -len(continuations[c])):
        head = tuple(continuations[c][:-1])
        match = next((r for r, row in enumerate(rows) if row[:len(head)] == head), None)
        if match is None:
            rows.append(head)
            match = len(rows) - 1
        row_of[c] = match
    return rows, row_of


def continuation_logprobs(lm: LanguageModel, prompts: Sequence[Sequence[int]],
                          continuations: Sequence[Sequence[int]], *,
                          done: Callable[[int], object] | None = None) -> torch.Tensor:
    """``[len(prompts), len(continuations)]``: log P(continuation | prompt), summed over its tokens, from the
    causal language model ``lm`` (GPT, GPT-2).

    Prompts of similar length are batched together, up to ``BATCH_TOKENS`` positions per forward pass;
    rows are right-padded, which a causal model needs no mask for (no real position sees a later one).
    Only the positions predicting a continuation token are projected onto the vocabulary.
    ``done(n)`` hears each batch of n prompts finished."""
    backbone, pad_id = lm.backbone, lm.tokenizer.specials.pad
    rows, row_of = _shared_rows(continuations)
    widest = max(map(len, rows))

    def width(i: int) -> int:  # of prompt i's rows, the widest of its batch when prompts go by length
        return len(prompts[i]) + widest

    out = torch.empty(len(prompts), len(continuations))
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    output = lm.output
    start = 0
    with torch.no_grad():
        while start < len(order):
            end = start + 1
            while end < len(order) and (end + 1 - start) * width(order[end]) * len(rows) <= BATCH_TOKENS:
                end += 1
            chunk = order[start:end]
            with lm.placement.autocast():
                hidden = backbone(lm.to_device(pad([[*prompts[i], *row] for i in chunk for row in rows], pad_id)))
            where, targets, owner = [], [], []
            for q, i in enumerate(chunk):
                length = len(prompts[i])
                for c, tokens in enumerate(continuations):
                    row = q * len(rows) + row_of[c]
                    where += [(row, length - 1 + t) for t in range(len(tokens))]
                    targets += tokens
                    owner += [q * len(continuations) + c] * len(tokens)
            rows_at, positions = lm.to_device(torch.tensor(where).T)
            logits = hidden[rows_at, positions].float() @ output.float().T
            picked = logits.gather(1, lm.to_device(torch.tensor(targets))[:, None])[:, 0] - logits.logsumexp(1)
            sums = torch.zeros(len(chunk) * len(continuations)).index_add_(0, torch.tensor(owner), picked.cpu())
            out[chunk] = sums.view(len(chunk), len(continuations))
            if done is not None:
                done(len(chunk))
            start = end
    return out
