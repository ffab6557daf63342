"""How a family's task models read their inputs: its :class:`InputFormat`, an object of its registry row
(:attr:`sesame.families.Family.inputs`) that fine-tuning calls once, :meth:`InputFormat.frame`. The tokenizer's own
template is :data:`PLAIN`; four read otherwise.

:data:`GPT_TOKENS`: GPT's input transformations (Radford et al. 2018, §3.3, Figure 1).

GPT pre-trains on plain text, then fine-tunes with three tokens it never saw: a start token opens
every input, a delimiter separates the two texts of a pair (or a context from a candidate answer),
and an extract token closes it; the classifier reads the extract token's final state ("last"
pooling). The tokens are new vocabulary entries with "randomly initialized start and end tokens"
(§3.3), here drawn from N(0, 0.02) like the rest of GPT's weights (§4.1). So fine-tuning a family
whose row reads :data:`GPT_TOKENS`:

* appends ``<start>``, ``<delim>`` and ``<extract>`` to the run's tokenizer (ids V, V+1, V+2 for a
  pretrained vocabulary of V) and makes them its template, ``<start> a <extract>`` for a text and
  ``<start> a <delim> b <extract>`` for a pair (:meth:`GptTokens.frame`);
* records the grown vocabulary in the run's config.json, so predict and evaluate rebuild the model
  as trained, and gives the pretrained token embedding three new rows (:func:`grow_token_embedding`).

A base that already has the tokens (a fine-tuned gpt run fine-tuned again) is left as it is.

:data:`DOCUMENTS` (ULMFiT) adds no token: its LM was trained on shards in which
every document follows the separator ``</s>`` and no ``<s>`` occurs, so its task inputs are read the same
way, ``</s> a`` and ``</s> a </s> b``, as
:meth:`sesame.language_model.LanguageModel.encode` starts a prompt, and as fastai's classifier starts each
text with the ``xxbos`` its LM saw (Howard & Ruder 2018's code), instead of the tokenizer's
``<s> a </s>``, whose ``<s>`` the LM never saw.

:data:`CLS_LAST` (XLNet) reads ``a <sep> <cls>`` (:func:`sesame.tokenizer.put_cls_last`), the class token last, as
its pre-training segments end; a pretrained run's tokenizer is given that template too
(:meth:`InputFormat.pretrained`), and ``span_qa`` puts the context first (:attr:`InputFormat.cls_last`).

:data:`WITHOUT_START` (T5, whose inputs do not start with ``<s>``) reads ``a </s>`` and ``a </s> b </s>``, as T5's own
tokenizer frames them and as its pre-training's inputs end, instead of the tokenizer's ``<s> a </s>``, whose ``<s>``
span corruption never shows the encoder.

:class:`SourceStart` is how an encoder-decoder's sources open, a row's ``source_start``: with the tokenizer's ``<s>``
(:data:`BOS_FIRST`: BART's ``<s> text </s>``, Lewis et al. 2020 §2.2, as fairseq frames them) or with the text
(:data:`TEXT_FIRST`: T5's ``text </s>``). text2text calls it for its sources and targets, with ``bos`` its recorded
option, and ``sesame generate`` for a pre-trained run's sources.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from tokenizers import processors

from .errors import SesameError
from .tokenizer import TextTokenizer, put_cls_last

if TYPE_CHECKING:
    from .models import ModelConfig
    from .tokenizer import SpecialIds

INPUT_TOKENS = ("<start>", "<delim>", "<extract>")
EMBEDDING_STD = 0.02  # GPT, §4.1: "a simple weight initialization of N(0, 0.02) was sufficient"


class InputFormat:
    """The tokenizer's own template (BERT's ``[CLS] a [SEP] b [SEP]``, RoBERTa's and BART's ``<s> a </s></s> b </s>``,
    ...): a task model reads its inputs as its tokenizer frames them."""

    cls_last = False  # the inputs end with ``<sep> <cls>`` (XLNet), which ``span_qa``'s windows keep last

    def frame(self, model: ModelConfig, tok: TextTokenizer) -> ModelConfig:
        """Give a new task model's tokenizer ``tok`` the framing of its inputs; returns its backbone config ``model``
        for that tokenizer (its vocabulary grown where the tokenizer grew)."""
        return model

    def pretrained(self, tok: TextTokenizer) -> None:
        """Give a pretrained run's tokenizer (after the shards are made) the framing fine-tuning reads."""


class GptTokens(InputFormat):
    """GPT's ``<start> a <extract>`` and ``<start> a <delim> b <extract>``, its three tokens new (module docstring)."""

    def frame(self, model: ModelConfig, tok: TextTokenizer) -> ModelConfig:
        """Add the tokens and their template, unless ``tok`` has them (a fine-tuned gpt run fine-tuned again)."""
        if tok.backend.token_to_id(INPUT_TOKENS[0]) is not None:
            return model
        old = tok.vocab_size
        tok.backend.add_special_tokens(list(INPUT_TOKENS))
        ids = [tok.backend.token_to_id(t) for t in INPUT_TOKENS]
        if ids != list(range(old, old + len(INPUT_TOKENS))):
            raise SesameError(f"--from/--tokenizer: the tokenizer already holds some of {', '.join(INPUT_TOKENS)} as "
                              "ordinary tokens; use one trained by `sesame tokenizer train`")
        start, delim, extract = INPUT_TOKENS
        tok.backend.post_processor = processors.TemplateProcessing(
            single=f"{start} $A {extract}", pair=f"{start} $A {delim} $B:1 {extract}:1",
            special_tokens=list(zip(INPUT_TOKENS, ids)))
        return replace(model, vocab_size=tok.vocab_size)


class AroundSeparator(InputFormat):
    """A template of the separator alone (``{sep}`` in ``single`` and ``pair``), no other special token:
    :data:`DOCUMENTS` and :data:`WITHOUT_START` (module docstring)."""

    def __init__(self, single: str, pair: str):
        self.single, self.pair = single, pair

    def frame(self, model: ModelConfig, tok: TextTokenizer) -> ModelConfig:
        sep = tok.backend.id_to_token(tok.specials.sep)
        tok.backend.post_processor = processors.TemplateProcessing(
            single=self.single.format(sep=sep), pair=self.pair.format(sep=sep),
            special_tokens=[(sep, tok.specials.sep)])
        return model


class ClsLast(InputFormat):
    """XLNet's ``a <sep> <cls>`` and ``a <sep> b <sep> <cls>`` (:func:`sesame.tokenizer.put_cls_last`)."""

    cls_last = True

    def frame(self, model: ModelConfig, tok: TextTokenizer) -> ModelConfig:
        put_cls_last(tok)
        return model

    def pretrained(self, tok: TextTokenizer) -> None:
        put_cls_last(tok)


PLAIN, GPT_TOKENS, CLS_LAST = InputFormat(), GptTokens(), ClsLast()
DOCUMENTS = AroundSeparator("{sep} $A", "{sep} $A {sep} $B:1")  # ULMFiT: a text as its LM read a document
WITHOUT_START = AroundSeparator("$A {sep}", "$A {sep} $B:1 {sep}:1")  # T5: no <s>


class SourceStart:
    """The tokens an encoder-decoder's source (and text2text's target) starts with, before its pieces and ``</s>``
    (module docstring); ``bos`` is the value text2text records as its ``bos`` option."""

    def __init__(self, *, bos: bool):
        self.bos = bos

    def tokens(self, specials: SpecialIds) -> list[int]:
        """``[<s>]`` or none, as ids of the tokenizer whose roles are ``specials``."""
        return [specials.cls] if self.bos else []


BOS_FIRST, TEXT_FIRST = SourceStart(bos=True), SourceStart(bos=False)


def source_start(bos: bool) -> SourceStart:
    """The :class:`SourceStart` of a recorded ``bos`` option."""
    return BOS_FIRST if bos else TEXT_FIRST


def grow_token_embedding(weights: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """Backbone ``weights`` whose token embedding is ``len(INPUT_TOKENS)`` rows short of ``vocab_size``,
    with those rows appended from N(0, 0.02); any other weights are returned as they are."""
    name = "embed.tokens.weight"
    table = weights.get(name)
    if table is None or vocab_size - table.shape[0] != len(INPUT_TOKENS):
        return weights
    rows = torch.empty(len(INPUT_TOKENS), table.shape[1], dtype=table.dtype).normal_(0.0, EMBEDDING_STD)
    return {**weights, name: torch.cat([table, rows])}
