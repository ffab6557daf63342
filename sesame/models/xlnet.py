"""XLNet's backbone (Yang et al. 2019, §2.3 and §2.4), on Transformer-XL (Dai et al. 2019, §3.2 and §3.3).

* **Relative positional encodings** (Dai et al., §3.3, eq. after "we propose"): no absolute positions; the
  score of query i on key j is (E_i W_q + u)·(E_j W_k)  [content, bias r_w = u]
  + (E_i W_q + v)·(R_{i−j} W_r)  [position, bias r_r = v], R the sinusoid of the distance i − j (Vaswani et al.
  2017, §3.5), computed for every distance once and moved into place by :func:`relative_shift`.
* **Relative segment encodings** (Yang et al., §2.5): a third term (q_i + b)·s_ij with s_ij one of two learned
  vectors per head, ``seg_embed[0]`` when i and j are in the same segment, ``seg_embed[1]`` when not (bias r_s = b).
* **Memory** (Dai et al., §3.2): each layer's input states of the previous segment, with stopped gradients, are
  extra keys and values in front of the segment's own (``memory``), visible to every position; the caller keeps
  them from one segment to the next (:meth:`XLNet.remember`).
* **Two-stream self-attention** (Yang et al., §2.3, eq. 5): a content stream h (layer 0: the token embeddings)
  and a query stream g (layer 0: the learned vector ``embed.mask``, XLNet's ``mask_emb``), both reading the
  previous layer's content states as keys and values: h_i through the content mask (it sees itself), g_i through
  the query mask (it never sees its own content). The two streams share every weight. The query stream runs only
  at the predicted positions (``targets``, indices; HF's ``target_mapping`` is their one-hot, :func:`target_mapping`).
* Post-LayerNorm residual sublayers and a GELU feed-forward of width 4·hidden, as XLNet's. The family's runs use
  GELU's tanh approximation, as XLNet's code (``modeling.py``'s ``gelu``) does; runs made before that and transformers
  checkpoints (whose ``ff_activation`` "gelu" is the exact form) keep the activation config.json records, the
  config's default, exact GELU, where it records none.
* **Bidirectional data** (Yang et al., §3.1; its code's ``relative_positional_encoding`` with ``bi_data``): a row
  that ``backward`` marks holds its text right to left and counts its relative distances the other way, R_{−(i−j)}
  (:func:`relative_encodings`), so it gets the same encodings, and the same states mirrored, as the text read left to
  right; ``clamp_len`` (> 0) clamps every distance to ±clamp_len, as the code does (−1, its default: no clamping).

Fine-tuning and encoding read the content stream with every position visible (``forward``), as XLNet does.

Parameter names map onto transformers' ``XLNetLMHeadModel`` (``transformer.`` prefix) as a table
(:mod:`sesame.interop.xlnet` converts by it):
``embed.tokens.weight`` = ``word_embedding.weight``; ``embed.mask`` = ``mask_emb`` (1, 1, H) viewed as (H,);
``attention.N.{q,k,v,r}.weight`` = ``layer.N.rel_attn.{q,k,v,r}`` (H, heads, head) viewed as (H, H) and transposed;
``attention.N.o.weight`` = ``rel_attn.o`` viewed as (H, H); ``attention.N.{r_w_bias,r_r_bias,r_s_bias,seg_embed}``
and ``attention.N.norm`` = ``rel_attn``'s of the same names (``layer_norm``); ``feed_forward.N.{inp,out,norm}`` =
``layer.N.ff.{layer_1,layer_2,layer_norm}``; the LM head's bias (:mod:`sesame.objectives.plm`) = ``lm_loss.bias``.

Deviations: a query that may see no key at all (the first target in the order with no context and no memory)
attends to nothing and gets a zero attention output, where transformers' additive −1e30 mask spreads it
uniformly over every key, its own content included; dropout is not applied inside the feed-forward after the
activation nor on the last layer's output (the other Transformers' placement); the direction is per row
(``backward``), where the code's ``bi_data`` reverses the second half of every batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .transformer import INIT_STD, Dropout, FeedForward, Transformer, TransformerConfig, dropout, make_norm

UNSUPPORTED = {"sharing": "none", "embedding_size": None, "embedding_norm": False, "attention_window": None,
               "norm": "post", "norm_kind": "layer", "bias": True, "scale_attention": True, "causal": False}


@dataclass
class XLNetConfig(TransformerConfig):
    """A :class:`TransformerConfig` (post-LN, GELU) with Transformer-XL's memory length; no position table."""

    arch: str = "xlnet"  # written to config.json with the rest (sesame.models.ARCHITECTURES)
    mem_len: int = 128  # the most states of earlier segments a layer keeps as memory (Dai et al. 2019, §3.2)
    clamp_len: int = -1  # relative distances clamped to ±clamp_len when > 0 (XLNet's code; −1: not clamped)
    type_vocab_size: int = 0  # segments are compared, not embedded
    embedding_norm: bool = False  # no LayerNorm on the embeddings

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value in UNSUPPORTED.items():
            if getattr(self, name) != value:
                raise ValueError(f"{name} {getattr(self, name)!r}: XLNet supports only {value!r}")
        if self.mem_len < 0:
            raise ValueError(f"mem_len {self.mem_len}: use 0 (no memory) or more")

    @property
    def learned_positions(self) -> bool:
        """Relative positions: any length is read."""
        return False


def sinusoids(distances: torch.Tensor, width: int) -> torch.Tensor:
    """R: [sin(d·f), cos(d·f)] for each distance d, f_k = 10000^(−2k/width) (Vaswani et al. 2017, §3.5; XLNet's
    ``positional_embedding``)."""
    inv_freq = 1.0 / torch.pow(10000.0, torch.arange(0, width, 2, device=distances.device).float() / width)
    angles = distances.float()[:, None] * inv_freq
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def distances(length: int, keys: int, device: torch.device) -> torch.Tensor:
    """The query − key distances of ``length`` queries after ``keys − length`` memory keys, largest first:
    keys − 1, …, −(length − 1) (``keys + length − 1`` of them; the order :func:`relative_shift` reads)."""
    return torch.arange(keys - 1, -length, -1, device=device)


def relative_encodings(length: int, keys: int, width: int, *, clamp_len: int = -1,
                       backward: torch.Tensor | None = None, device: torch.device | None = None) -> torch.Tensor:
    """The sinusoids R of :func:`distances` (clamped to ±``clamp_len`` when it is above 0), (1, R, width); with
    ``backward`` (batch,), one row per example, R_{−d} for the rows it marks (read right to left: XLNet's ``bi_data``
    counts their distances the other way, ``bwd_pos_seq = −fwd_pos_seq``, clamped alike)."""
    d = distances(length, keys, device)
    if clamp_len > 0:
        d = d.clamp(-clamp_len, clamp_len)
    if backward is None:
        return sinusoids(d, width)[None]
    return torch.stack([sinusoids(d, width), sinusoids(-d, width)])[backward.long()]


def relative_shift(scores: torch.Tensor, positions: torch.Tensor, keys: int) -> torch.Tensor:
    """Scores per distance (batch, heads, queries, R), R = keys + length − 1 in :func:`distances`' order, → scores
    per key (batch, heads, queries, keys): query at segment position p (``positions``: (batch or 1, queries)) and
    key k (memory first) are ``memory + p − k`` apart, which is entry ``length − 1 − p + k``. Transformer-XL's
    shift (Dai et al. 2019, App. B) as a gather, so the query stream's rows (target positions) use it too."""
    length = scores.shape[-1] - keys + 1
    index = (length - 1 - positions)[:, :, None] + torch.arange(keys, device=scores.device)
    return scores.gather(-1, index[:, None].expand(scores.shape[0], scores.shape[1], -1, -1))


def target_mapping(targets: torch.Tensor, length: int) -> torch.Tensor:
    """transformers' ``target_mapping`` (batch, predicted, length): the one-hot of each predicted position."""
    return torch.nn.functional.one_hot(targets, length).float()


class Embeddings(nn.Module):
    """XLNet's word embedding, the query stream's start (``mask``) and their dropout; no positions."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.mask = nn.Parameter(torch.empty(cfg.hidden).normal_(std=0.02))
        self.dropout = Dropout(cfg.dropout)


class RelativeAttention(nn.Module):
    """One layer's relative multi-head attention (XLNet's ``rel_attn``), serving both streams."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.heads, self.head_size, self.attn_dropout = cfg.heads, cfg.hidden // cfg.heads, cfg.dropout
        for name in ("q", "k", "v", "o", "r"):
            setattr(self, name, nn.Linear(cfg.hidden, cfg.hidden, bias=False))
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
            setattr(self, name, nn.Parameter(torch.empty(cfg.heads, self.head_size).normal_(std=0.02)))
        self.seg_embed = nn.Parameter(torch.empty(2, cfg.heads, self.head_size).normal_(std=0.02))
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.adapter: nn.Module = nn.Identity()  # Houlsby's adapter, where one is inserted (models.additions)

    def split(self, y: torch.Tensor) -> torch.Tensor:
        """(batch, time, hidden) → (batch, heads, time, head size)."""
        return y.view(*y.shape[:2], self.heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor, keys: tuple[torch.Tensor, torch.Tensor, torch.Tensor], positions: torch.Tensor,
                different: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        """The stream ``x`` (batch, queries, hidden) at segment ``positions`` after attending over ``keys`` (the
        content keys, values and position keys of :meth:`keys_of`): LN(x + dropout(o(attention))). ``different``
        (batch, queries, keys): whether query and key lie in different segments (None: all the same); ``mask``
        (batch, queries, keys): True where the query may attend."""
        k, v, kr = keys
        q = self.split(self.q(x))
        scale = 1.0 / math.sqrt(self.head_size)
        scores = (q + self.r_w_bias[:, None]) @ k.transpose(-2, -1)
        scores = scores + relative_shift((q + self.r_r_bias[:, None]) @ kr.transpose(-2, -1), positions, k.shape[-2])
        if different is not None:
            seg = (q + self.r_s_bias[:, None]) @ self.seg_embed.permute(1, 2, 0)  # (batch, heads, queries, 2)
            scores = scores + torch.where(different[:, None], seg[..., 1:], seg[..., :1])
        mask = mask[:, None]
        probs = torch.softmax((scores * scale).masked_fill(~mask, torch.finfo(scores.dtype).min), -1)
        probs = dropout(probs.masked_fill(~mask, 0.0), self.attn_dropout, self.training)  # a row seeing nothing: 0
        y = (probs @ v).transpose(1, 2).flatten(2)
        return self.norm(x + self.dropout(self.adapter(self.o(y))))

    def keys_of(self, context: torch.Tensor, relative: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The content keys and values of ``context`` (memory then segment) and the position keys of the
        sinusoids ``relative`` (1 or batch, R, hidden), (1 or batch, heads, R, head size)."""
        return self.split(self.k(context)), self.split(self.v(context)), self.split(self.r(relative))


class XLNet(nn.Module):
    """Token ids → content states (batch, time, hidden) with every position visible (``forward``, the backbone
    contract), or both streams under permutation masks (:meth:`streams`, the PLM objective's)."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg)
        self.attention = nn.ModuleList(RelativeAttention(cfg) for _ in range(cfg.layers))
        self.feed_forward = nn.ModuleList(FeedForward(cfg) for _ in range(cfg.layers))
        self.pos_dropout = Dropout(cfg.dropout)
        self.mix: nn.Module | None = None  # ELMo's scalar mix of every layer, where one is inserted (models.additions)
        for module in (self.embed.tokens, *self.attention, *self.feed_forward):
            module.apply(Transformer._init)
        with torch.no_grad():  # N(0, embedding_std), as a Transformer's table (drawn, then rescaled)
            self.embed.tokens.weight.mul_(cfg.embedding_std / INIT_STD)

    def layer_modules(self) -> list[list[nn.Module | None]]:
        """The embeddings, then each layer's attention and feed-forward; the scalar mix with the top layer."""
        layers = [[a, f] for a, f in zip(self.attention, self.feed_forward)]
        layers[-1].append(self.mix)
        return [[self.embed, self.pos_dropout], *layers]

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None, padding: torch.Tensor | None = None,
                all_layers: bool = False) -> torch.Tensor | list[torch.Tensor]:
        """Content states of the last layer (or their scalar mix), or of the embeddings and every layer when
        ``all_layers``; every real position sees every real position (``padding``: True at real tokens)."""
        keys = ids.shape[1]
        mask = torch.ones(ids.shape[0], keys, keys, dtype=torch.bool, device=ids.device)
        if padding is not None:
            mask = mask & padding[:, None, :].bool()
        layers = self.streams(ids, types=types, content_mask=mask).layers
        if all_layers:
            return layers
        return self.mix(layers) if self.mix is not None else layers[-1]

    def streams(self, ids: torch.Tensor, *, content_mask: torch.Tensor, types: torch.Tensor | None = None,
                memory: list[torch.Tensor] | None = None, query_mask: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, backward: torch.Tensor | None = None) -> Streams:
        """Both streams over one segment ``ids`` (batch, length) after ``memory`` (per layer, (batch, M, hidden):
        that layer's input states of earlier segments; memory counts as segment 0 and is visible wherever the
        masks say). ``content_mask`` (batch, length, M + length) and ``query_mask`` (batch, P, M + length): True
        where the content stream of a position, or the query stream of predicted position ``targets`` (batch, P),
        may attend. Without ``targets`` only the content stream runs. ``backward`` (batch,): True for the rows that
        hold their text right to left (:func:`relative_encodings`)."""
        b, length = ids.shape
        past = memory[0].shape[1] if memory else 0
        device = ids.device
        relative = relative_encodings(length, past + length, self.config.hidden, device=device,
                                      clamp_len=self.config.clamp_len, backward=backward)
        relative = self.pos_dropout(relative.to(self.embed.tokens.weight.dtype))  # the module's dtype, as h's
        different = different_g = None
        if types is not None:
            keys = torch.cat([types.new_zeros(b, past), types], 1)
            different = types[:, :, None] != keys[:, None, :]
            if targets is not None:
                different_g = different.gather(1, targets[:, :, None].expand(-1, -1, keys.shape[1]))
        h = self.embed.dropout(self.embed.tokens(ids))
        g = None if targets is None else self.embed.dropout(self.embed.mask.expand(b, targets.shape[1], -1))
        here = torch.arange(length, device=device)[None]
        layers = [h]
        for i, (attention, feed_forward) in enumerate(zip(self.attention, self.feed_forward)):
            keys = attention.keys_of(h if not past else torch.cat([memory[i], h], 1), relative)
            if g is not None:
                g = attention(g, keys, targets, different_g, query_mask)
                g = feed_forward.norm(g + feed_forward(g))
            h = attention(h, keys, here, different, content_mask)
            h = feed_forward.norm(h + feed_forward(h))
            layers.append(h)
        return Streams(layers, g)

    def remember(self, memory: list[torch.Tensor] | None, layers: list[torch.Tensor], keep: int | None = None
                 ) -> list[torch.Tensor]:
        """The next segment's memory: per layer, the last ``mem_len`` of the old memory followed by this
        segment's input states to that layer (its first ``keep`` positions: XLNet's ``reuse_len``, which leaves
        out the separator and class tokens that end a pre-training segment), with stopped gradients."""
        keep = layers[0].shape[1] if keep is None else keep
        new = [x[:, :keep] if memory is None else torch.cat([m, x[:, :keep]], 1)
               for m, x in zip(memory or [None] * self.config.layers, layers)]
        return [x[:, max(0, x.shape[1] - self.config.mem_len):].detach() for x in new]


@dataclass
class Streams:
    """What :meth:`XLNet.streams` computed: the content stream's input to every layer and its output (``layers``,
    embeddings first), and the query stream's last states at the predicted positions (``query``, or None)."""

    layers: list[torch.Tensor]
    query: torch.Tensor | None
