"""Generation from an encoder-decoder (T5, BART: :class:`~sesame.models.encoder_decoder.EncoderDecoder`): greedy,
sampled or beam-searched target tokens for source token ids, by :mod:`sesame.decoding`'s loops.

Each batch of sources is right-padded and encoded once; the encoder's :class:`~sesame.models.caches.Memory` keeps
each decoder layer's cross-attention keys and values once projected, and with the cache (the default) a
:class:`~sesame.models.caches.KVCache` keeps the decoder's self-attention keys and values, so each step feeds one
token per row. Without it each step recomputes the decoder over all its inputs (the encoder still runs once).
The decoder starts from the model's ``decoder_start_id`` (T5: ``<pad>``, BART: ``</s>``) and a hypothesis ends at
the end token ``eos``, a stop string, or after ``max_new_tokens`` tokens (the end token counts as one).

The settings are :class:`~sesame.decoding.GenerationConfig`'s, read as for a causal language model: greedy
decoding, sampling with the draws of :func:`~sesame.decoding.uniform_draws` (seeded by the seed, the input's index
among all inputs and the step, so a batch gives each input what it gets alone), CTRL's repetition penalty over the
decoder's inputs (the start token included, as transformers), and beam search with transformers' default
``early_stopping=False``, length counting the new tokens and the end token. With these, greedy decoding and beam
search give transformers' ``generate`` tokens on the same weights (``tests/test_seq2seq.py``), with one
deviation: in beam search the repetition penalty acts on the logits (CTRL's definition, and sesame's causal beam
search), where transformers' beam search applies it to the log-probabilities.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .decoding import (GenerationConfig, Hypothesis, beam_search, greedy, next_tokens, penalise_repetition,
                       stop_strings, uniform_draws)
from .errors import SesameError
from .models import position_limit
from .models.caches import KVCache, Memory
from .models.encoder_decoder import EncoderDecoder


@dataclass
class Seq2SeqState:
    """The decoding state of N rows: the encoder's memory, the decoder's self-attention cache (None without the
    cache), the decoder inputs fed so far (N, fed) and each row's source (its row in the encoded batch)."""

    memory: Memory
    cache: KVCache | None
    fed: torch.Tensor
    sources: list[int]

    def select(self, index: torch.Tensor) -> Seq2SeqState:
        """Rows ``index`` (kept, reordered, repeated): the caches in place, so this state is spent. The memory moves
        only when a row's source changes (beam search repeats each source ``beam`` times once, then reorders
        hypotheses of the same source)."""
        sources = [self.sources[i] for i in index.tolist()]
        if sources != self.sources:
            self.memory.reorder(index)
        if self.cache is not None:
            self.cache.reorder(index)
        return Seq2SeqState(self.memory, self.cache, self.fed.index_select(0, index), sources)


def start(model: EncoderDecoder, ids: torch.Tensor, padding: torch.Tensor | None, *, capacity: int,
          cache: bool = True) -> Seq2SeqState:
    """Encode a batch of sources (``padding`` True at real tokens) into the first state, with an empty
    self-attention cache for ``capacity`` decoder inputs (none when ``cache`` is False)."""
    device = ids.device
    # the keys and values are computed in autocast's type when it is on
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else \
        model.embed.tokens.weight.dtype
    rows = ids.shape[0]
    return Seq2SeqState(model.encode(ids, padding),
                        KVCache(model.decoder.config, rows, capacity, dtype, device) if cache else None,
                        ids.new_empty((rows, 0)), list(range(rows)))


def stepper(model: EncoderDecoder, repetition_penalty: float = 1.0
            ) -> Callable[[torch.Tensor, Seq2SeqState], tuple[torch.Tensor, Seq2SeqState]]:
    """The step function of :mod:`sesame.decoding` for ``model``: the previous tokens (N,) → the next token's
    log-probabilities (N, V) in float32, after the repetition penalty over the decoder's inputs."""
    def step(previous: torch.Tensor, state: Seq2SeqState) -> tuple[torch.Tensor, Seq2SeqState]:
        fed = torch.cat([state.fed, previous[:, None]], 1)
        if state.cache is not None:
            hidden = model.decode(previous[:, None], state.memory, cache=state.cache)
        else:
            hidden = model.decode(fed, state.memory)
        logits = penalise_repetition(model.logits(hidden[:, -1]).float(), fed, repetition_penalty)
        return logits.log_softmax(-1), Seq2SeqState(state.memory, state.cache, fed, state.sources)

    return step


def right_pad(sources: Sequence[Sequence[int]], pad: int, device: torch.device | str = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources as one (batch, longest) tensor of ids padded with ``pad`` on the right, and its padding mask (True at
    real tokens), on ``device``."""
    width = max(map(len, sources))
    ids = torch.tensor([[*source, *[pad] * (width - len(source))] for source in sources], device=device)
    padding = torch.tensor([[True] * len(source) + [False] * (width - len(source)) for source in sources],
                           device=device)
    return ids, padding


@torch.no_grad()
def generate_seq2seq(model: EncoderDecoder, inputs: Sequence[Sequence[int]], config: GenerationConfig | None = None,
                     *, eos: int | None, text: Callable[[list[int]], str] | None = None, first: int = 0,
                     batch_size: int = 8) -> list[Hypothesis]:
    """The target of each source in ``inputs`` (token ids, the end token included as the tokenizer adds it), decoded
    by ``config`` (default: greedy, 50 new tokens, with the cache) in batches of ``batch_size`` sources (one uniform
    draw per input and step when sampling, so the batches change nothing). ``eos``: the end token (None: only the
    length and stop strings end a hypothesis). ``text``: the tokenizer's decoding of target ids, which stop strings
    (``config.stop``) need. ``first``: the index of ``inputs[0]`` among all inputs of a job given in parts (its
    sampling draws). Per input a :class:`~sesame.decoding.Hypothesis`: ``tokens`` without the end token (with the
    stop string's), ``finish`` end, stop or length. ``model`` should be in eval mode; tensors are made on its
    device, under whatever autocast the caller set."""
    cfg = config or GenerationConfig()
    cfg.validate()
    if cfg.stop and text is None:
        raise ValueError("stop strings need text=, the tokenizer's decoding of token ids")
    cfg.check_room(model.config.max_positions)  # T5's too, whose sources are any length
    room = position_limit(model.config)  # None: any length (T5's relative positions)
    for i, source in enumerate(inputs):
        if not source:
            raise SesameError(f"input {first + i + 1} is empty: give the encoder at least one token")
        if room is not None and len(source) > room:
            raise SesameError(f"input {first + i + 1} has {len(source)} tokens, more than the model's {room} "
                              "positions: shorten it")
    if batch_size < 1:
        raise SesameError(f"--batch-size {batch_size}: must be at least 1")
    device = model.embed.tokens.weight.device
    step = stepper(model, cfg.repetition_penalty)
    stopped = stop_strings(cfg.stop, text) if text is not None else None
    results: list[Hypothesis] = []
    for at in range(0, len(inputs), batch_size):
        batch = inputs[at: at + batch_size]
        ids, padding = right_pad(batch, model.config.pad_id, device)
        state = start(model, ids, padding, capacity=cfg.max_new_tokens, cache=cfg.cache)
        begin = torch.full((len(batch),), model.config.decoder_start_id, dtype=torch.long, device=device)
        if cfg.beams > 1:
            results += beam_search(step, state, begin, cfg, eos=eos, stopped=stopped)
            continue
        indices = range(first + at, first + at + len(batch))
        choose = (lambda log_probs, t: next_tokens(log_probs, cfg, uniform_draws(cfg.seed, indices, t))) \
            if cfg.sample else None
        results += greedy(step, state, begin, eos=eos, max_len=cfg.max_new_tokens, choose=choose, stopped=stopped)
    return results
