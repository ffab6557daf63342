"""An encoder-decoder Transformer (Vaswani et al. 2017) that is T5 or BART by configuration: two stacks of the
one :class:`~sesame.models.transformer.Transformer`, an encoder and a causal decoder whose layers also attend to
the encoder's states, reading one shared token embedding, which is also the (tied) output layer unless the
configuration gives the output layer its own weights (T5 v1.1).

* **t5** (Raffel et al. 2020, §2.1; ``STYLES["t5"]``): pre-norm with RMSNorm (no mean subtraction, no bias) and
  a final norm in each stack, no biases, ReLU feed-forward (T5 v1.0), unscaled attention scores, no position
  embeddings but a relative position bias: per head a learned scalar for each of 32 buckets of the offset key −
  query, bidirectional in the encoder (16 buckets per direction: one per offset below 8, log-spaced up to 128,
  the last for all beyond) and causal in the decoder (32 buckets of past offsets; later keys share bucket 0);
  computed once per stack and added to every layer's self-attention, none in cross-attention. The tied output
  layer reads the decoder's states times hidden^-0.5. The decoder starts from ``<pad>``.
* **t5v1_1** (T5 v1.1, the checkpoints released after the paper; ``STYLES["t5v1_1"]``): T5 with a gated-GELU
  feed-forward, GEGLU(x) = GELU(x·W) ⊙ (x·V), then ·W_o (Shazeer 2020, "GLU Variants Improve Transformer", §2;
  transformers' ``feed_forward_proj="gated-gelu"``, whose GELU is the tanh form, ``gelu_new``), and an output
  layer of its own, untied from the token table (``tied=False``), which reads the states unscaled. Its row
  (:mod:`sesame.families`) narrows the feed-forward to 8/3·hidden, as Shazeer's GLU variants keep the parameter
  count (T5 v1.1-base: d_ff 2048 for d_model 768), and pre-trains without dropout, as v1.1 was.
* **bart** (Lewis et al. 2020, §2.1; ``STYLES["bart"]``): post-LayerNorm, GELU, scaled attention, learned
  positions for each stack and a LayerNorm on each stack's embeddings. The decoder starts from ``</s>``.

The decoder start token is the tokenizer's, so a family row sets ``decoder_start_id``. For decoding the encoder
runs once (:meth:`EncoderDecoder.encode` → a :class:`~sesame.models.caches.Memory`, which also keeps each layer's
cross-attention keys and values once projected), and the decoder keeps its self-attention keys and values in a
:class:`~sesame.models.caches.KVCache` made for ``decoder.config``.

Deliberate deviations, none of which changes what a converted checkpoint computes in evaluation:

* dropout follows the other Transformers: on the embeddings, the attention weights and each sublayer's output,
  not inside the feed-forward (T5's and BART's ``activation_dropout``) nor after T5's final norm;
* weights start as the other Transformers' do, N(0, 0.02) (T5 draws them with std 1/√fan-in): with unscaled
  scores the query projection's start is divided by √(head size), which is what T5's initialisation does. T5's
  token embeddings start as T5's, N(0, 1) (``embedding_std``; Mesh TensorFlow's default, which the hidden^-0.5
  of the tied output layer assumes: from N(0, 0.02) its scores would start near zero; a one-off comparison on a
  tiny T5, not kept in the repo, learned slower from 0.02);
* ``weight_init="xavier"`` (not T5's nor BART's) draws every linear weight of the two stacks from Glorot &
  Bengio's (2010) uniform distribution, as ``torch.nn.Transformer`` does (a fused query/key/value weight as one
  matrix, as its ``in_proj_weight``), for short runs of small models: from N(0, 0.02) a 2 + 2-layer, 128-wide
  BART's attention starts almost uniform and it never learns to copy random tokens; from xavier it does
  (``benchmarks/copy_task.py --weight-init``), though 200 steps of BART pre-training still collapse its encoder
  (docs/results/encoder-decoders.md). In a pre-norm stack it replaces the residual projections' GPT-2 start (std 0.02/√(2·layers))
  too, as ``torch.nn.Transformer(norm_first=True)`` draws them; T5's unscaled scores refuse it;
* T5 v1.1's untied output layer starts N(0, hidden^-0.5), so its first scores have the scale of v1.0's tied
  layer (N(0, 1) embeddings read times hidden^-0.5); transformers draws it N(0, 1);
* BART's position table has no two unused leading rows (Hugging Face's offset of 2: import drops them, export
  puts them back, as for RoBERTa), no ``final_logits_bias`` (zero in BART's checkpoints) and no embedding scale
  (off in BART's configurations).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .caches import KVCache, Memory
from .transformer import Dropout, FeedForward, SelfAttention, Transformer, TransformerConfig, make_norm
from .vocabulary import vocabulary_scores

SIDES = ("encoder", "decoder")

# the fields that make an EncoderDecoderConfig T5, T5 v1.1 or BART (sizes, dropout and token ids are the run's)
T5 = {"norm": "pre", "norm_kind": "rms", "bias": False, "scale_attention": False, "activation": "relu",
      "embedding_norm": False, "layer_norm_eps": 1e-6, "relative_buckets": 32, "relative_max_distance": 128,
      "scale_logits": True, "embedding_std": 1.0, "gated": False, "tied": True}
STYLES: dict[str, dict] = {
    "t5": T5,
    "t5v1_1": {**T5, "activation": "gelu_tanh", "gated": True, "tied": False, "scale_logits": False},
    "bart": {"norm": "post", "norm_kind": "layer", "activation": "gelu", "embedding_norm": True,
             "layer_norm_eps": 1e-5},
}


WEIGHT_INITS = ("normal", "xavier")


@dataclass
class EncoderDecoderConfig(TransformerConfig):
    """A :class:`TransformerConfig` for both stacks (``layers`` is the encoder's), and what the pair adds."""

    type_vocab_size: int = 0
    arch: str = "encoder_decoder"  # written to config.json with the rest (sesame.models.ARCHITECTURES)
    decoder_layers: int | None = None  # None: as many as the encoder
    decoder_start_id: int = 0  # the decoder's first input (T5: <pad>, BART: </s>)
    relative_buckets: int = 0  # T5's relative position bias with this many buckets (0: learned positions)
    relative_max_distance: int = 128  # offsets this far or farther share the last bucket
    scale_logits: bool = False  # the tied output layer reads the states times hidden^-0.5 (T5)
    gated: bool = False  # T5 v1.1's gated feed-forward, activation(x·W) ⊙ x·V (GatedFeedForward)
    tied: bool = True  # the output layer is the token table (False: a layer of its own, T5 v1.1's lm_head)
    weight_init: str = "normal"  # the stacks' linear weights: N(0, 0.02), or "xavier" (module docstring)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embedding_width != self.hidden:
            raise ValueError(f"embedding_size {self.embedding_size}: an encoder-decoder's tied embeddings have the "
                             f"hidden width {self.hidden}")
        if self.weight_init not in WEIGHT_INITS:
            raise ValueError(f"weight_init {self.weight_init!r}: use one of {', '.join(WEIGHT_INITS)}")
        if self.weight_init == "xavier" and not self.scale_attention:
            raise ValueError("weight_init 'xavier': only for stacks with scaled scores (BART's); an unscaled (T5) "
                             "stack divides its query projection's start by √(head size), which xavier would undo")
        if self.relative_buckets and (self.relative_buckets < 4 or self.relative_buckets % 2):
            raise ValueError(f"relative_buckets {self.relative_buckets}: use 0 (learned positions) or an even "
                             "number from 4 (T5: 32)")
        if self.relative_buckets and self.relative_max_distance <= self.relative_buckets // 2:
            raise ValueError(f"relative_max_distance {self.relative_max_distance}: must exceed half the "
                             f"{self.relative_buckets} buckets (T5: 128)")

    @property
    def learned_positions(self) -> bool:
        """Learned position tables (BART) cap sequences at ``max_positions``; T5's relative bias has no cap."""
        return not self.relative_buckets

    def stack(self, side: str) -> EncoderDecoderConfig:
        """The configuration of the ``encoder`` or the (causal) ``decoder`` stack."""
        decoder = side == "decoder"
        return replace(self, causal=decoder, layers=(self.decoder_layers or self.layers) if decoder else self.layers)


def relative_buckets(offsets: torch.Tensor, *, buckets: int, max_distance: int, bidirectional: bool
                     ) -> torch.Tensor:
    """T5's bucket of each offset (key position − query position; Mesh TensorFlow's ``_relative_position_bucket``,
    in the same float operations, so the same buckets). Bidirectional: half the buckets for each direction, later
    keys from ``buckets/2`` on; causal: all buckets for earlier keys, later ones in bucket 0. In a direction,
    distances below half its buckets get one each, longer ones log-spaced buckets up to ``max_distance``, and
    farther ones the last."""
    if bidirectional:
        buckets //= 2
        base = (offsets > 0).long() * buckets
        distance = offsets.abs()
    else:
        base = torch.zeros_like(offsets)
        distance = (-offsets).clamp(min=0)
    exact = buckets // 2
    far = exact + (torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
                   * (buckets - exact)).long()
    return base + torch.where(distance < exact, distance, far.clamp(max=buckets - 1))


class RelativePositionBias(nn.Module):
    """T5's position bias of one stack: a learned scalar per bucket (:func:`relative_buckets`) and head.

    The buckets depend on the offset alone, and every offset at least ``max_distance`` away shares its direction's
    last bucket, so they are computed once, for the offsets −max_distance … +max_distance (``offset_buckets``, not
    saved), and a forward pass clamps its offsets into that range and looks them up: the same buckets as
    :func:`relative_buckets` of the offsets themselves, in two operations instead of a dozen over every (query, key)
    pair, which a decoding step would pay for each new token."""

    def __init__(self, cfg: EncoderDecoderConfig, *, bidirectional: bool):
        super().__init__()
        self.max_distance = cfg.relative_max_distance
        self.table = nn.Embedding(cfg.relative_buckets, cfg.heads)
        offsets = torch.arange(-self.max_distance, self.max_distance + 1)
        self.register_buffer("offset_buckets", relative_buckets(
            offsets, buckets=cfg.relative_buckets, max_distance=self.max_distance, bidirectional=bidirectional),
            persistent=False)

    def forward(self, length: int, past: int = 0) -> torch.Tensor:
        """(1, heads, length, past + length): the bias of query ``past + i`` on key ``j`` (four dimensions, so that
        SDPA may take its fused CPU kernel, which it refuses a three-dimensional mask)."""
        keys = torch.arange(past + length, device=self.offset_buckets.device)
        offsets = (keys[None, :] - keys[past:, None]).clamp_(-self.max_distance, self.max_distance)  # key − query
        return self.table(self.offset_buckets[offsets + self.max_distance]).permute(2, 0, 1)[None]


class CrossAttention(SelfAttention):
    """The decoder's attention over the encoder's states (Vaswani et al. 2017, §3.2.3): queries from the decoder,
    keys and values from the :class:`Memory`, through the self-attention sublayer's parts (``qkv``'s first third
    makes the queries, the rest the keys and values); no position bias, only the source's padding masked."""

    def forward(self, x: torch.Tensor, memory: Memory, layer: int) -> torch.Tensor:
        h = x.shape[-1]
        q = self.split(self.project(x, slice(0, h)), 1)[0]
        k, v = memory.layer(layer, lambda states: tuple(self.split(self.project(states, slice(h, None)), 2)))
        return self.attend(q, k, v, memory.mask, causal=False)

    def project(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """``x`` through the ``rows`` of ``qkv`` (the queries', or the keys' and values')."""
        bias = self.qkv.bias
        return F.linear(x, self.qkv.weight[rows], None if bias is None else bias[rows])


class GatedFeedForward(FeedForward):
    """T5 v1.1's feed-forward sublayer: (activation(x·W) ⊙ x·V)·W_o (Shazeer 2020, §2: GEGLU with the tanh GELU):
    ``inp`` is W (transformers' ``wi_0``), ``linear`` V (``wi_1``), ``out`` W_o (``wo``)."""

    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__(cfg)
        self.linear = nn.Linear(cfg.hidden, cfg.intermediate, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.adapter(self.out(self.activation(self.inp(x)) * self.linear(x))))


class SharedEmbeddings(nn.Module):
    """The token table both stacks read and the output layer reuses, with each stack's learned positions (none
    with a relative position bias) and embedding norm, then dropout."""

    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.positions = None if cfg.relative_buckets else nn.ModuleDict(
            {side: nn.Embedding(cfg.max_positions, cfg.hidden) for side in SIDES})
        self.norm = nn.ModuleDict({side: make_norm(cfg) for side in SIDES}) if cfg.embedding_norm else None
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, side: str, past: int = 0) -> torch.Tensor:
        """The ``side`` stack's input vectors of ``ids`` at positions ``past``, ``past + 1``, ..."""
        x = self.tokens(ids)
        if self.positions is not None:
            table, end = self.positions[side].weight, past + ids.shape[1]
            if end > len(table):  # as the stack would say, before a slice too short fails to broadcast
                raise ValueError(f"sequence length {end} exceeds max_positions {len(table)}")
            x = x + table[past:end]
        if self.norm is not None:
            x = self.norm[side](x)
        return self.dropout(x)


def _draw_xavier(module: nn.Module) -> None:
    """Every linear weight below ``module`` drawn from Glorot & Bengio's (2010) uniform distribution."""
    for child in module.modules():
        if isinstance(child, nn.Linear):
            nn.init.xavier_uniform_(child.weight)


class EncoderDecoder(nn.Module):
    """Source ids (+ padding) and decoder input ids → scores over the vocabulary at every decoder position."""

    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        self.config = cfg
        self.embed = SharedEmbeddings(cfg)
        self.encoder, self.decoder = (self._stack(cfg.stack(side)) for side in SIDES)
        if cfg.weight_init == "xavier":
            for stack in (self.encoder, self.decoder):
                _draw_xavier(stack)
        # T5 v1.1's output layer of its own (transformers' lm_head), drawn so its first scores are scaled as a
        # tied layer's (module docstring)
        self.head = None if cfg.tied else nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.embed.apply(Transformer._init)
        nn.init.normal_(self.embed.tokens.weight, std=cfg.embedding_std)
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=cfg.hidden ** -0.5)

    @staticmethod
    def _stack(cfg: EncoderDecoderConfig) -> Transformer:
        bias = RelativePositionBias(cfg, bidirectional=not cfg.causal) if cfg.relative_buckets else None
        cross = nn.ModuleList(CrossAttention(cfg) for _ in range(cfg.layers)) if cfg.causal else None
        return Transformer(cfg, embeddings=False, position_bias=bias, cross_attention=cross,
                           feed_forward=GatedFeedForward if cfg.gated else FeedForward)

    def encode(self, ids: torch.Tensor, padding: torch.Tensor | None = None) -> Memory:
        """The encoder's states of source ``ids`` (batch, source; ``padding`` True at real tokens)."""
        return Memory(self.encoder(ids, padding=padding, embedded=self.embed(ids, "encoder")), padding)

    def encoder_layers(self, ids: torch.Tensor, padding: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The encoder's states of source ``ids`` after the embeddings and after each layer (a stack's
        ``all_layers``): what reads an encoder-decoder's contextual vectors."""
        return self.encoder(ids, padding=padding, embedded=self.embed(ids, "encoder"), all_layers=True)

    def decode(self, ids: torch.Tensor, memory: Memory, *, padding: torch.Tensor | None = None,
               cache: KVCache | None = None) -> torch.Tensor:
        """The decoder's last states (batch, time, hidden) of its inputs ``ids``, each seeing the inputs up to
        itself and the whole source. With a ``cache`` (a :class:`KVCache` for ``decoder.config``), ``ids`` follow
        the cached tokens and ``padding`` covers both."""
        past = cache.length if cache is not None else 0
        return self.decoder(ids, padding=padding, embedded=self.embed(ids, "decoder", past), cache=cache,
                            memory=memory)

    def readout(self, states: torch.Tensor) -> torch.Tensor:
        """Decoder states as the output layer reads them: times hidden^-0.5 for T5 v1.0 (``scale_logits``)."""
        return states * self.config.hidden ** -0.5 if self.config.scale_logits else states

    @property
    def output_weight(self) -> torch.Tensor:
        """The output layer's (vocabulary, hidden) matrix: the tied token table, or T5 v1.1's own ``head``."""
        return self.embed.tokens.weight if self.head is None else self.head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores over the vocabulary from decoder states: the output layer's (after :meth:`readout`)."""
        return vocabulary_scores(self.readout(hidden), self.output_weight)

    def forward(self, ids: torch.Tensor, *, decoder_ids: torch.Tensor, padding: torch.Tensor | None = None,
                decoder_padding: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced scores (batch, decoder time, vocabulary) of ``decoder_ids`` given the source ``ids``."""
        return self.logits(self.decode(decoder_ids, self.encode(ids, padding), padding=decoder_padding))

    def decoder_inputs(self, targets: torch.Tensor) -> torch.Tensor:
        """Teacher forcing's decoder inputs for ``targets`` (batch, time): the start token, then the targets but
        the last."""
        start = targets.new_full((targets.shape[0], 1), self.config.decoder_start_id)
        return torch.cat([start, targets[:, :-1]], 1)

    def layer_modules(self) -> list[list[nn.Module | None]]:
        """Layer groups bottom to top: the shared embeddings with the encoder's, the encoder's layers, then the
        decoder's groups (:meth:`Transformer.layer_modules`); an untied output layer is in the top one."""
        encoder, decoder = self.encoder.layer_modules(), self.decoder.layer_modules()
        decoder[-1].append(self.head)
        return [[self.embed, *encoder[0]], *encoder[1:], *decoder]
