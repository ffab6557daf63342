"""sesame's encoder-decoder and its transformers twin on one configuration and the same weights, and sesame's
pre-training objective of the style for random token windows, for the benchmarks that race them (``train_step.py``'s
T5 and BART training steps, ``seq2seq_generate.py``).

sesame's :class:`~sesame.models.encoder_decoder.EncoderDecoderConfig` of a style (``STYLES``: T5 v1.0 or BART) is
made first; transformers' ``T5Config`` / ``BartConfig`` is derived from it by the interop's
:func:`sesame.interop.encoder_decoder.hf_config` (the function ``sesame convert`` exports with), transformers' model
is initialised at random, and its weights are copied into sesame's model by
:func:`~sesame.interop.encoder_decoder.import_weights`, so both sides compute the same function. The token ids are
those of T5's and BART's tokenizers (:data:`SPECIALS`); the decoder starts from the family's start token.
"""
from __future__ import annotations

from dataclasses import asdict

import torch
from torch import nn

from sesame.families import get_family
from sesame.interop.encoder_decoder import TYPES, hf_config, import_weights
from sesame.models.encoder_decoder import STYLES, EncoderDecoder, EncoderDecoderConfig
from sesame.objectives import Denoising, SpanCorruption
from sesame.tokenizer import SpecialIds

# T5: <pad> 0, </s> 1, <unk> 2 (it has no [CLS] or [MASK]: 3 and 4 stand in); BART: <s> 0, <pad> 1, </s> 2, <unk> 3
SPECIALS = {"t5": SpecialIds(pad=0, sep=1, unk=2, cls=3, mask=4),
            "bart": SpecialIds(cls=0, pad=1, sep=2, unk=3, mask=4)}
# transformers' dropouts that sesame applies at ``dropout`` too, beyond the one hf_config writes (BART's attention
# weights: sesame drops them, as T5's dropout_rate does); neither drops inside the feed-forward by default
OTHER_DROPOUTS = {"t5": (), "bart": ("attention_dropout",)}
SENTINELS = 100  # T5's <extra_id_k>: the top ids of its vocabulary


def build_pair(style: str, *, vocab_size: int, hidden: int, layers: int, heads: int, intermediate: int,
               max_positions: int, dropout: float, seed: int) -> tuple[EncoderDecoder, nn.Module]:
    """sesame's ``EncoderDecoder`` of ``style`` (t5 or bart) with as many decoder as encoder layers, and transformers'
    ``T5ForConditionalGeneration`` or ``BartForConditionalGeneration`` (SDPA attention) of the configuration
    ``hf_config`` derives from it, both with transformers' random initialisation (seeded), in training mode."""
    specials = SPECIALS[style]
    ours = EncoderDecoder(EncoderDecoderConfig(
        **STYLES[style], vocab_size=vocab_size, hidden=hidden, layers=layers, decoder_layers=layers, heads=heads,
        intermediate=intermediate, max_positions=max_positions, dropout=dropout, pad_id=specials.pad,
        decoder_start_id=getattr(specials, get_family(style).decoder_start)))
    import transformers

    source = dict.fromkeys(OTHER_DROPOUTS[style], dropout)
    config = hf_config(ours.config.to_dict(), style, source=source, tokens=asdict(specials))
    torch.manual_seed(seed)
    theirs = getattr(transformers, TYPES[style].base_class)(
        transformers.AutoConfig.for_model(**config, attn_implementation="sdpa"))
    ours.load_state_dict(import_weights(style, theirs.state_dict(), ours))
    return ours.train(), theirs.train()


def span_corruption(backbone: EncoderDecoder, vocab_size: int, seed: int) -> SpanCorruption:
    """T5's objective, its sentinels the top :data:`SENTINELS` ids of the vocabulary, counting down (T5's)."""
    sentinels = torch.arange(vocab_size - 1, vocab_size - 1 - SENTINELS, -1)
    return SpanCorruption(backbone, SPECIALS["t5"], sentinels=sentinels)


def denoising(backbone: EncoderDecoder, vocab_size: int, seed: int) -> Denoising:
    """BART's objective (text infilling and sentence permutation) on random ids: a seeded draw makes 3 ids in 4 begin
    a word and 1 in 20 end a sentence (and ``</s>``), so that a window of random ids has words and sentences."""
    g = torch.Generator().manual_seed(seed)
    word_starts, final = torch.rand(vocab_size, generator=g) < 0.75, torch.rand(vocab_size, generator=g) < 0.05
    final[SPECIALS["bart"].sep] = True
    return Denoising(backbone, SPECIALS["bart"], word_starts=word_starts, sentence_final=final)


OBJECTIVES = {"t5": span_corruption, "bart": denoising}  # each style's pre-training objective, for random windows
