"""Sentences given as words, on a subword tokenizer: what tagging (:mod:`.tag`) and cross-view
training (:mod:`.cvt`) both read.

A sentence is encoded from its words (``cls w1 … wn sep``), so every subword knows its word, and, as
in BERT's NER (Devlin et al. 2019, §5.3), a word is read at its first subword: a per-word target
stands there, every other position holds ``IGNORE`` and the loss skips it.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..tokenizer import TextTokenizer

DOCSTART = "-DOCSTART-"  # CoNLL's line between documents: never a word of a sentence
IGNORE = -100  # target of positions the loss skips (F.cross_entropy's ignore_index)


def word_inputs(words: Sequence[str], kind: str) -> list[str]:
    """The words as the tokenizer should see them one by one: byte-level BPE marks a word that follows
    a space by a leading space (GPT-2's ``Ġ``), so every word but the first gets one back and the
    subwords are those of the running text ``" ".join(words)``."""
    return [w if j == 0 or kind != "bpe" else " " + w for j, w in enumerate(words)]


def encode_words(sentences: Sequence[Sequence[str]], tok: TextTokenizer, max_length: int) -> list:
    """The tokenizer's encodings of pre-split sentences (``cls w1 … wn sep``), cut to ``max_length``."""
    tok.backend.enable_truncation(max_length)
    try:
        return tok.backend.encode_batch([word_inputs(words, tok.kind) for words in sentences], is_pretokenized=True)
    finally:
        tok.backend.no_truncation()


def first_subwords(word_ids: Sequence[int | None], n_words: int) -> list[int]:
    """Per word, the position of its first subword (from an Encoding's ``word_ids``), or -1 if it has none."""
    first = [-1] * n_words
    for position, word in enumerate(word_ids):
        if word is not None and first[word] < 0:
            first[word] = position
    return first


def word_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``[B, W, k]`` logits, summed over the positions with a target (≠ ``IGNORE``)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
