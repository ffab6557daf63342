"""CoVe's MT-LSTM: an attentional LSTM encoder-decoder for translation whose encoder becomes a feature
extractor (McCann, Bradbury, Xiong & Socher 2017, "Learned in Translation: Contextualized Word Vectors", §3).

* Encoder (§3, "MT-LSTM"): a two-layer bidirectional LSTM over word vectors, H = MT-LSTM(GloVe(w)).
  It is :class:`sesame.models.recurrent.Recurrent` with ``causal=False`` (padded rows packed, so the
  backward direction starts at each row's last real token); its embedding ``embed.tokens`` is
  initialised from GloVe by :mod:`sesame.apps.cove` and then kept fixed (``freeze_embedding``).
* Decoder (§3): a two-layer unidirectional LSTM whose input at step t is [z_{t-1}; h̃_{t-1}]
  (the previous target word's embedding and the previous context-adjusted state, "input feeding");
  attention over the source positions α_t = softmax(H(W1 s_t + b1)); h̃_t = tanh(W2 [Hᵀα_t; s_t] + b2);
  p(y_t | H, y_1..y_{t-1}) = softmax(W_out h̃_t + b_out). Attention covers real source positions only
  (padding gets weight 0) and sums to one over them.
* CoVe(w) = H, the encoder's top layer (``features``), width 2 × ``hidden_size``.

Deliberate choices where the paper is silent or that differ from it:

* the decoder's LSTM states and h̃_0 start at zero (the paper does not say how they start);
* the decoder's width (s_t, h̃_t) equals the encoder's output width 2 × ``hidden_size``;
* dropout: the encoder uses the recurrent stack's locked (variational) dropout between and after its
  layers; the decoder uses ordinary dropout on z_{t-1}, between its LSTM layers and on h̃_t before
  the softmax (the paper trains with OpenNMT's dropout, unspecified beyond that).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .padding import real_tokens
from .recurrent import Recurrent, RecurrentConfig

# (embedding size, hidden size per direction); "base" is the paper's: 300-d GloVe, 300 per direction (CoVe is 600-d)
COVE_SIZES: dict[str, tuple[int, int]] = {"tiny": (64, 64), "mini": (128, 128), "small": (256, 256),
                                          "base": (300, 300)}


@dataclass
class CoveConfig:
    vocab_size: int  # source words
    target_vocab_size: int
    arch: str = "cove"
    embedding_size: int = 300  # source and target word vectors (GloVe: 300)
    hidden_size: int = 300  # per direction of the encoder
    layers: int = 2
    pad_id: int = 0
    target_pad_id: int = 0
    dropout: float = 0.2
    freeze_embedding: bool = False  # keep the source embedding fixed (GloVe in the paper)

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"layers {self.layers}: must be at least 1")

    @property
    def causal(self) -> bool:
        """The encoder is bidirectional."""
        return False

    @property
    def hidden(self) -> int:
        """The width of CoVe(w): both directions of the encoder's top layer."""
        return 2 * self.hidden_size

    @property
    def feature_width(self) -> int:
        return self.hidden

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DecoderState:
    """What a decoding step needs per row: the decoder LSTM's (h, c) (layers, N, width), the last h̃ (N, width),
    the encoder outputs H (N, S, width) and the source mask (N, S), True at real tokens."""

    h: torch.Tensor
    c: torch.Tensor
    feed: torch.Tensor
    memory: torch.Tensor
    mask: torch.Tensor

    def select(self, index: torch.Tensor) -> "DecoderState":
        """The state of rows ``index`` (beam search reorders and repeats rows)."""
        return DecoderState(self.h[:, index], self.c[:, index], self.feed[index], self.memory[index], self.mask[index])


class MTLSTM(nn.Module):
    """The MT-LSTM encoder-decoder. As a backbone (``forward``/``features``) only the encoder runs:
    token ids (+ padding mask, True at real tokens) → CoVe vectors (batch, time, ``config.hidden``)."""

    def __init__(self, cfg: CoveConfig):
        super().__init__()
        self.config = cfg
        width = cfg.hidden
        self.encoder = Recurrent(RecurrentConfig(
            vocab_size=cfg.vocab_size, causal=False, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
            layers=cfg.layers, pad_id=cfg.pad_id, hidden_dropout=cfg.dropout, dropout=cfg.dropout))
        if cfg.freeze_embedding:
            self.encoder.embed.tokens.weight.requires_grad_(False)
        self.target_embed = nn.Embedding(cfg.target_vocab_size, cfg.embedding_size)
        self.decoder = nn.LSTM(cfg.embedding_size + width, width, num_layers=cfg.layers, batch_first=True,
                               dropout=cfg.dropout if cfg.layers > 1 else 0.0)
        self.attend = nn.Linear(width, width)  # W1, b1
        self.combine = nn.Linear(2 * width, width)  # W2, b2
        self.out = nn.Linear(width, cfg.target_vocab_size)  # W_out, b_out
        self.drop = nn.Dropout(cfg.dropout)

    @property
    def embed(self) -> nn.Module:
        """The encoder's embedding module (``embed.tokens``: the source word vectors)."""
        return self.encoder.embed

    # -- the backbone: CoVe vectors ------------------------------------------------------------------
    def features(self, ids: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """CoVe(w) = MT-LSTM(GloVe(w)): the encoder's top layer, (batch, time, ``config.feature_width``)."""
        return self.encoder(ids, padding=padding)

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None, padding: torch.Tensor | None = None,
                all_layers: bool = False) -> torch.Tensor | list[torch.Tensor]:
        """The backbone contract: the encoder's top layer, or with ``all_layers`` [embeddings, layer 1, ...]."""
        return self.encoder(ids, padding=padding, all_layers=all_layers)

    def layer_modules(self) -> list[list[nn.Module]]:
        """The encoder's layer groups, bottom to top (the decoder is not part of the backbone)."""
        return self.encoder.layer_modules()

    # -- translation ---------------------------------------------------------------------------------
    def start(self, ids: torch.Tensor, padding: torch.Tensor | None) -> DecoderState:
        """Encode a source batch and set up the decoder: zero LSTM states and h̃_0 = 0."""
        memory = self.encoder(ids, padding=padding)
        n, layers, width = ids.shape[0], self.config.layers, self.config.hidden
        zeros = memory.new_zeros(layers, n, width)
        return DecoderState(zeros, zeros.clone(), memory.new_zeros(n, width), memory, real_tokens(ids, padding))

    def attention_step(self, previous: torch.Tensor, state: DecoderState
                       ) -> tuple[torch.Tensor, DecoderState, torch.Tensor]:
        """One decoder step from the previous target ids (N,): (h̃_t (N, width), the new state, α_t (N, S))."""
        z = self.drop(self.target_embed(previous))
        s, (h, c) = self.decoder(torch.cat([z, state.feed], -1).unsqueeze(1), (state.h, state.c))
        s = s.squeeze(1)
        scores = torch.bmm(state.memory, self.attend(s).unsqueeze(2)).squeeze(2)  # H (W1 s_t + b1)
        alpha = scores.masked_fill(~state.mask, float("-inf")).softmax(-1)
        context = torch.bmm(alpha.unsqueeze(1), state.memory).squeeze(1)  # Hᵀ α_t
        feed = torch.tanh(self.combine(torch.cat([context, s], -1)))
        return feed, DecoderState(h, c, feed, state.memory, state.mask), alpha

    def step(self, previous: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        """log p(y_t | ...) over the target vocabulary (N, V) and the new state (for greedy and beam search)."""
        feed, state, _ = self.attention_step(previous, state)
        return self.out(self.drop(feed)).log_softmax(-1), state

    def teacher_forced(self, ids: torch.Tensor, padding: torch.Tensor | None, target: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: h̃_t after dropout, as W_out reads it, when step t reads the reference word
        ``target[:, t]`` (``target`` holds ``<s> y_1 .. y_n </s>``): (batch, target length − 1, width)."""
        state = self.start(ids, padding)
        feeds = []
        for t in range(target.shape[1] - 1):
            feed, state, _ = self.attention_step(target[:, t], state)
            feeds.append(feed)
        return self.drop(torch.stack(feeds, 1))
