"""Pre-training an encoder-decoder (:class:`~sesame.models.EncoderDecoder`) to restore corrupted text: T5's span
corruption and BART's denoising, the objectives of the ``t5`` (and ``t5v1_1``) and ``bart`` families.

Both corrupt a clean window into the encoder's input x̃ and name the decoder's targets y (the transforms of
:mod:`.span_corruption` and :mod:`.denoising`), then minimise −Σ_t log p(y_t | x̃, y_<t), summed over every target
token, by teacher forcing: the decoder reads the targets shifted right behind its start token
(:meth:`EncoderDecoder.decoder_inputs`: ``<pad>`` for T5, ``</s>`` for BART). The scores are the output layer's
(:attr:`EncoderDecoder.output_weight`: the tied token embeddings, after T5's hidden^-0.5, or T5 v1.1's own layer),
fused with the cross-entropy (:func:`.projection.linear_cross_entropy`), so the (positions × vocabulary) logits never
exist whole.
"""
from __future__ import annotations

from dataclasses import fields

import torch

from ..errors import SesameError
from ..models import EncoderDecoder, position_limit
from ..tokenizer import SpecialIds, TextTokenizer
from .base import Objective
from .denoising import DenoisingOptions, denoise
from .masking import replacement_pool
from .projection import Workspace, linear_cross_entropy
from .span_corruption import SpanCorruptionOptions, corrupt_spans, filled, joined, raw_length


class TeacherForced(Objective):
    """The loss both objectives share: batches hold the encoder's ``ids`` (with ``padding``, True at real tokens,
    when rows differ in length) and the decoder's ``targets``; the loss is summed over all the targets."""

    arch = "encoder_decoder"

    def __init__(self, backbone: EncoderDecoder, specials: SpecialIds):
        super().__init__(backbone, specials)
        if not isinstance(backbone, EncoderDecoder):
            raise ValueError(f"the {self.name} objective needs an encoder-decoder (arch 'encoder_decoder'), not "
                             f"{type(backbone).__name__}")
        self.workspace = Workspace()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        model, targets = self.backbone, batch["targets"]
        memory = model.encode(batch["ids"], batch.get("padding"))
        states = model.decode(model.decoder_inputs(targets), memory)
        return linear_cross_entropy(model.readout(states).flatten(0, 1), model.output_weight, targets.flatten(),
                                    workspace=self.workspace)


SENTINELS_FIX = "train one with them (`sesame tokenizer train --kind unigram --sentinels 100`)"


class SpanCorruption(TeacherForced):
    """T5's objective (Raffel et al. 2020, §3.1.4; :func:`.span_corruption.corrupt_spans`): 15% of a window's tokens,
    in spans of 3 on average, each span replaced by one sentinel in the inputs; the targets are the spans, each
    after its sentinel, then ``</s>``. Windows are :func:`.span_corruption.raw_length` tokens long (plus
    ``spare_tokens``, read to stand in for the separators dropped), so that every input is exactly ``seq_len`` tokens
    and no row needs padding (T5's ``random_spans_helper``). The sentinels are
    the tokenizer's ``<extra_id_k>`` (:meth:`TextTokenizer.sentinels`), counting down from the top of the vocabulary;
    a window with more spans than sentinels is refused before anything is written (:func:`require_sentinels`;
    100 sentinels cover windows of about 2000 tokens)."""

    name = "span_corruption"
    option_dataclass = SpanCorruptionOptions
    options = tuple(f.name for f in fields(SpanCorruptionOptions))

    def __init__(self, backbone: EncoderDecoder, specials: SpecialIds, *, sentinels: torch.Tensor, **options):
        super().__init__(backbone, specials)
        if not len(sentinels):
            raise SesameError(f"span corruption needs T5's sentinel tokens <extra_id_0>, ... in the tokenizer: "
                              f"{SENTINELS_FIX}")
        self.noise = SpanCorruptionOptions(**options)
        self.sentinels = sentinels  # a plain attribute: batches are made on the CPU wherever the model is

    @classmethod
    def build(cls, backbone: EncoderDecoder, tokenizer: TextTokenizer, **options) -> "SpanCorruption":
        return cls(backbone, tokenizer.specials, sentinels=tokenizer.sentinels(), **options)

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        noise = SpanCorruptionOptions(**options)
        return raw_length(seq_len, noise)[0] + noise.spare_tokens

    @staticmethod
    def sentinels_needed(seq_len: int, **options) -> int:
        noise = SpanCorruptionOptions(**options)
        return noise.counts(raw_length(seq_len, noise)[0])[1]  # one per noise span

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if self.noise.spare_tokens:
            windows = filled(windows, self.specials.sep, windows.shape[1] - self.noise.spare_tokens)
        elif not self.noise.separators:
            windows = joined(windows, self.specials.sep)
        inputs, targets = corrupt_spans(windows, generators, sentinels=self.sentinels, eos=self.specials.sep,
                                        options=self.noise)
        return {"ids": inputs, "targets": targets}


def require_sentinels(objective: type[Objective], seq_len: int, flag: str, options: dict, *, have: int, source: str,
                      fix: str = "", none: str = SENTINELS_FIX) -> None:
    """Refuse an ``objective`` whose examples of ``seq_len`` positions (given as ``flag``) need more sentinel tokens
    than the ``have`` of the tokenizer ``source`` names, with the longest ``flag`` that fits and any other ``fix``;
    a tokenizer with none (``--family bart --objective span_corruption``), with what to do instead, ``none``. Called
    before a run is written, so nothing is (:class:`SpanCorruption` refuses such a tokenizer too, later)."""
    needed = objective.sentinels_needed(seq_len, **options)
    if needed <= have:
        return
    if not have:
        raise SesameError(f"--objective {objective.name}: replaces each noise span with a sentinel token "
                          f"(<extra_id_k>), and {source} has none: {none}")
    fits, over = 8, seq_len  # 8 positions: one noise span, which any sentinel covers
    while over - fits > 1:  # the spans grow with the length: the longest that fits, by bisection
        middle = (fits + over) // 2
        fits, over = (middle, over) if objective.sentinels_needed(middle, **options) <= have else (fits, middle)
    raise SesameError(f"{flag} {seq_len}: each {objective.name} example of that length has {needed} noise spans, "
                      f"one sentinel token (<extra_id_k>) each, and {source} has {have}; use {flag} {fits} or "
                      f"less{fix}")


def sentence_ends(ids: torch.Tensor, final: torch.Tensor) -> list[int]:
    """The end offsets of the sentences of one window (:func:`batch_sentence_ends` of one row)."""
    return batch_sentence_ends(ids[None], final)[0]


def batch_sentence_ends(windows: torch.Tensor, final: torch.Tensor) -> list[list[int]]:
    """The end offsets of the sentences of each window of ``windows`` (batch, L): after each run of sentence-final
    tokens (``final``, a bool per vocabulary entry, :meth:`TextTokenizer.sentence_ends`), as fairseq's BART ends a
    sentence at a full stop that the next token does not continue."""
    here = final.index_select(0, windows.flatten()).view(windows.shape)
    last = here & ~torch.cat([here[:, 1:], here.new_zeros(len(here), 1)], 1)
    return [[p + 1 for p, end in enumerate(row) if end] for row in last.tolist()]


class Denoising(TeacherForced):
    """BART's objective (Lewis et al. 2020, §2.2; :func:`.denoising.denoise`), by default the paper's best: text
    infilling (30% of the words masked in Poisson(3)-long spans, each span one ``<mask>``) and sentence permutation.
    The encoder reads ``<s> noised </s>`` (rows padded to the longest), the decoder restores ``<s> window </s>``,
    so windows are ``seq_len − 2`` tokens.

    Sentences: the shards hold only token ids, so a window's sentences end where the tokens say
    (:func:`sentence_ends`): after a full stop, question or exclamation mark (with any closing quotes) and after the
    separator that closes each document; this is fairseq's rule (a sentence ends at GPT-2's full-stop token), which
    the paper's code applies. Headings and other lines without a full stop join the sentence after them.

    Deviation: an input longer than the model's learned positions (zero-length spans insert more masks than the
    others remove, which only windows of a few words can suffer) loses its last noised tokens before ``</s>``.
    """

    name = "denoising"
    option_dataclass = DenoisingOptions
    options = tuple(f.name for f in fields(DenoisingOptions))

    def __init__(self, backbone: EncoderDecoder, specials: SpecialIds, *, word_starts: torch.Tensor,
                 sentence_final: torch.Tensor, **options):
        super().__init__(backbone, specials)
        self.noise = DenoisingOptions(**options)
        # plain attributes, not buffers: batches are made on the CPU wherever the model is
        self.word_starts, self.sentence_final = word_starts, sentence_final
        self.pool = replacement_pool(backbone.config.vocab_size, torch.tensor(specials.all))

    @classmethod
    def build(cls, backbone: EncoderDecoder, tokenizer: TextTokenizer, **options) -> "Denoising":
        return cls(backbone, tokenizer.specials, word_starts=tokenizer.word_starts(),
                   sentence_final=tokenizer.sentence_ends(), **options)

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        DenoisingOptions(**options)  # refused here, before a run is written
        return seq_len - 2  # room for <s> and </s>

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        ends = batch_sentence_ends(windows, self.sentence_final)
        inputs, targets = denoise(windows, generators, sentence_ends=ends, specials=self.specials,
                                  word_starts=self.word_starts, pool=self.pool, options=self.noise)
        inputs = self.within_positions(inputs)
        return {"ids": inputs, "padding": inputs != self.specials.pad, "targets": targets}

    def within_positions(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` cut to the model's learned positions, a cut row ending with ``</s>`` (see the deviation); T5's
        relative positions (``--family t5 --objective denoising``) read them whole."""
        limit = position_limit(self.backbone.config)
        if limit is None or inputs.shape[1] <= limit:
            return inputs
        cut = inputs[:, :limit].clone()
        cut[:, -1] = torch.where(cut[:, -1] == self.specials.pad, self.specials.pad, self.specials.sep)
        return cut
