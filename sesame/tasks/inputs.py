"""GPT's input transformations, added when a ``gpt`` run is fine-tuned (Radford et al. 2018, §3.3, Figure 1).

GPT pre-trains on plain text, then fine-tunes with three tokens it never saw: a start token opens
every input, a delimiter separates the two texts of a pair (or a context from a candidate answer),
and an extract token closes it; the classifier reads the extract token's final state ("last"
pooling). The tokens are new vocabulary entries with "randomly initialized start and end tokens"
(§3.3), here drawn from N(0, 0.02) like the rest of GPT's weights (§4.1). So fine-tuning a family
whose row sets ``input_tokens``:

* appends ``<start>``, ``<delim>`` and ``<extract>`` to the run's tokenizer (ids V, V+1, V+2 for a
  pretrained vocabulary of V) and makes them its template, ``<start> a <extract>`` for a text and
  ``<start> a <delim> b <extract>`` for a pair (:func:`add_input_tokens`);
* records the grown vocabulary in the run's config.json, so predict and evaluate rebuild the model
  as trained, and gives the pretrained token embedding three new rows (:func:`grow_token_embedding`).

A base that already has the tokens (a fine-tuned gpt run fine-tuned again) is left as it is.

A family whose row sets ``document_inputs`` (ULMFiT) adds no token: its LM was trained on shards in which
every document follows the separator ``</s>`` and no ``<s>`` occurs, so its task inputs are read the same
way, ``</s> a`` and ``</s> a </s> b`` (:func:`read_as_documents`), as
:meth:`sesame.language_model.LanguageModel.encode` starts a prompt, and as fastai's classifier starts each
text with the ``xxbos`` its LM saw (Howard & Ruder 2018's code), instead of the tokenizer's
``<s> a </s>``, whose ``<s>`` the LM never saw.

A family whose row sets ``cls_last`` (XLNet) reads ``a <sep> <cls>`` (:func:`read_cls_last`), the class token last,
as its pre-training segments end.

An encoder-decoder whose inputs do not start with ``<s>`` (T5: its row's ``source_bos`` is off) reads ``a </s>`` and
``a </s> b </s>`` (:func:`read_without_start`), as T5's own tokenizer frames them and as its pre-training's inputs
end, instead of the tokenizer's ``<s> a </s>``, whose ``<s>`` span corruption never shows the encoder.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tokenizers import processors

from ..errors import SesameError
from ..families import get_family
from ..tokenizer import TextTokenizer, put_cls_last

if TYPE_CHECKING:
    from ..run import RunConfig

INPUT_TOKENS = ("<start>", "<delim>", "<extract>")
EMBEDDING_STD = 0.02  # GPT, §4.1: "a simple weight initialization of N(0, 0.02) was sufficient"


def add_input_tokens(config: RunConfig, tok: TextTokenizer) -> bool:
    """Give ``tok`` the input tokens and template, and ``config.model`` the grown vocabulary, when
    ``config.family`` uses them and ``tok`` lacks them; whether it did."""
    if not get_family(config.family).input_tokens or tok.backend.token_to_id(INPUT_TOKENS[0]) is not None:
        return False
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
    config.model["vocab_size"] = tok.vocab_size
    return True


def grow_token_embedding(weights: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """Backbone ``weights`` whose token embedding is ``len(INPUT_TOKENS)`` rows short of ``vocab_size``,
    with those rows appended from N(0, 0.02); any other weights are returned as they are."""
    name = "embed.tokens.weight"
    table = weights.get(name)
    if table is None or vocab_size - table.shape[0] != len(INPUT_TOKENS):
        return weights
    rows = torch.empty(len(INPUT_TOKENS), table.shape[1], dtype=table.dtype).normal_(0.0, EMBEDDING_STD)
    return {**weights, name: torch.cat([table, rows])}


def read_as_documents(config: RunConfig, tok: TextTokenizer) -> bool:
    """Give ``tok`` the template ``</s> $A`` (pairs ``</s> $A </s> $B``) when ``config.family``'s row sets
    ``document_inputs``; whether it did."""
    if not get_family(config.family).document_inputs:
        return False
    sep = tok.backend.id_to_token(tok.specials.sep)
    tok.backend.post_processor = processors.TemplateProcessing(
        single=f"{sep} $A", pair=f"{sep} $A {sep} $B:1", special_tokens=[(sep, tok.specials.sep)])
    return True


def read_without_start(config: RunConfig, tok: TextTokenizer) -> bool:
    """Give ``tok`` the template ``$A </s>`` (pairs ``$A </s> $B </s>``) when ``config.family``'s row is an
    encoder-decoder whose inputs do not start with ``<s>`` (``source_bos`` off: T5); whether it did."""
    family = get_family(config.family)
    if family.arch != "encoder_decoder" or family.source_bos:
        return False
    sep = tok.backend.id_to_token(tok.specials.sep)
    tok.backend.post_processor = processors.TemplateProcessing(
        single=f"$A {sep}", pair=f"$A {sep} $B:1 {sep}:1", special_tokens=[(sep, tok.specials.sep)])
    return True


def read_cls_last(config: RunConfig, tok: TextTokenizer) -> bool:
    """Give ``tok`` XLNet's template, ``a <sep> <cls>`` (:func:`sesame.tokenizer.put_cls_last`), when
    ``config.family``'s row sets ``cls_last``; whether it did."""
    if not get_family(config.family).cls_last:
        return False
    put_cls_last(tok)
    return True
