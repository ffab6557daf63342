"""One configurable Transformer stack (Vaswani et al. 2017) that is BERT, GPT, GPT-2 or ALBERT by configuration.

* bidirectional (BERT, Devlin et al. 2019) or causal (GPT, Radford et al. 2018) self-attention through
  ``torch.nn.functional.scaled_dot_product_attention``, or computed step by step when attention
  dropout is on (SDPA cannot fuse it either), so the dropout mask can be drawn cheaply;
* learned absolute position embeddings and optional token-type (segment) embeddings;
* post-LayerNorm (BERT, GPT: ``x = LN(x + f(x))``) or pre-LayerNorm with a final LayerNorm
  (GPT-2: ``x = x + f(LN(x))``);
* optional locally banded sparse attention (GPT-3, Brown et al. 2020, §2.1, after the Sparse
  Transformer's local pattern, Child et al. 2019): with ``attention_window`` w, odd layers (1, 3, ...)
  let each position see only the w positions up to itself (|i − j| < w when bidirectional), even
  layers stay dense. Deviation: the band is applied as a mask on dense attention, so it changes what
  a position sees but not the cost;
* a key/value cache for decoding (:class:`KVCache`): given the keys and values of the tokens seen so
  far, a forward over the new tokens costs O(context) per token instead of recomputing the prefix;
* GELU feed-forward of width 4·hidden (exact GELU, or with ``activation="gelu_tanh"`` the tanh
  approximation GPT-2 and ALBERT were trained with, Hugging Face's ``gelu_new``), or ReLU (T5); weights
  initialised N(0, 0.02), the token table N(0, ``embedding_std``) (0.02 unless set; T5's 1); in pre-norm stacks
  the residual output projections use std 0.02/√(2·layers) as in GPT-2;
* T5's choices (Raffel et al. 2020): RMSNorm (``norm_kind="rms"``), no biases, unscaled attention scores (the
  query projection's initial weights take the 1/√(head size) instead), and the parts of an encoder-decoder's
  stacks (``encoder_decoder.py``): a position bias on every layer's scores, a decoder's cross-attention;
* ALBERT (Lan et al. 2020, §3.1): a factorised embedding (V×E, then a E×H projection) when
  ``embedding_size`` < hidden, and cross-layer parameter sharing: ``sharing`` = ``all`` (one layer's
  attention and feed-forward reused at every depth), ``attention``, ``ffn`` or ``none``. A shared
  sublayer is stored once, so checkpoints hold each tensor once.

Every attention and feed-forward sublayer has a place for a bottleneck ``adapter`` on its output, before its
residual connection (the identity), and the stack a place for a scalar ``mix`` of its layers as its output (None):
fine-tuning recipes insert them into a built stack (:mod:`sesame.models.additions`); the stack's config knows
nothing of them.

The backbone knows nothing about losses or tasks; heads live with objectives and tasks and may
tie their output matrix to ``embed.tokens.weight`` (of width ``embedding_size``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .caches import KVCache, LayerCache
from .padding import is_padded

if TYPE_CHECKING:
    from .caches import Memory


INIT_STD = 0.02  # every weight's initial standard deviation (BERT's initializer_range), unless said otherwise


@dataclass
class TransformerConfig:
    vocab_size: int
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    max_positions: int = 512
    type_vocab_size: int = 2
    causal: bool = False
    norm: str = "post"
    embedding_norm: bool = True
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    pad_id: int = 0
    embedding_size: int | None = None  # E; None = hidden (no factorisation)
    sharing: str = "none"  # cross-layer sharing: none | all | attention | ffn
    activation: str = "gelu"  # feed-forward GELU: gelu (exact) | gelu_tanh (tanh approximation, GPT-2's)
    attention_window: int | None = None  # GPT-3's banded layers: odd layers see w positions (None: all dense)
    norm_kind: str = "layer"  # layer (LayerNorm) | rms (T5's RMSNorm: no mean subtraction, no bias)
    bias: bool = True  # biases in the attention and feed-forward projections (T5: none)
    scale_attention: bool = True  # scores · 1/√(head size) (T5: unscaled)
    embedding_std: float = INIT_STD  # the token embeddings' initial standard deviation (T5: 1)

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing {self.sharing!r}: choose one of {', '.join(SHARING)}")
        if self.activation not in (*ACTIVATIONS, "relu"):
            raise ValueError(f"activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}, relu")
        if self.norm_kind not in ("layer", "rms"):
            raise ValueError(f"norm_kind {self.norm_kind!r}: choose layer or rms")
        if self.attention_window is not None and self.attention_window < 1:
            raise ValueError(f"attention_window {self.attention_window}: must be at least 1")

    @property
    def arch(self) -> str:
        """Its name in :data:`sesame.models.ARCHITECTURES`; not written to config.json, where a model config without
        ``arch`` is a Transformer's (the subclasses' is a field, written)."""
        return "transformer"

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden

    @property
    def learned_positions(self) -> bool:
        """Whether positions index a learned table, so no sequence may be longer than ``max_positions``."""
        return True

    def to_dict(self) -> dict:
        return asdict(self)


SHARING = ("none", "all", "attention", "ffn")
ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}  # name → F.gelu's ``approximate``


def activation(name: str) -> nn.Module:
    """The feed-forward's nonlinearity: GELU (exact or tanh-approximated) or T5's ReLU."""
    return nn.ReLU() if name == "relu" else nn.GELU(approximate=ACTIVATIONS[name])


def make_norm(cfg: TransformerConfig, width: int | None = None) -> nn.Module:
    """The configured normalisation over ``width`` (default hidden): LayerNorm, or RMSNorm."""
    norm = nn.RMSNorm if cfg.norm_kind == "rms" else nn.LayerNorm
    return norm(width or cfg.hidden, eps=cfg.layer_norm_eps)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, as ``F.dropout``: each element is kept with probability 1 − p and scaled by
    1 / (1 − p). The mask is drawn as uniform 31-bit integers compared with p·2³¹ (exact to within
    2⁻³¹), several times cheaper on a CPU than ``F.dropout``'s Bernoulli sampling. Under ``torch.compile`` it is
    ``F.dropout``, which the compiler fuses, where the in-place integer draw would break the graph at every call."""
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    if torch.compiler.is_compiling():
        return F.dropout(x, p, True)
    with torch.no_grad():
        bits = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
        mask = torch.ge(bits, round(p * 2 ** 31), out=torch.empty_like(x)).mul_(1.0 / (1.0 - p))
    return x * mask


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its mask with :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              dropout_p: float, scale: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on (batch, heads, time, head size) tensors; ``mask``: boolean (True = may
    attend; ``causal`` is then ignored, the mask says it), or added to the scores; ``scale``: the scores' factor
    (None: 1/√d). With attention dropout (training) it goes through :func:`explicit_attention` instead: SDPA has no
    fused kernel with dropout on a CPU and computes the same steps, but with a slower dropout mask."""
    if dropout_p > 0.0:
        return explicit_attention(q, k, v, mask, causal, dropout_p, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                          dropout_p=dropout_p, scale=scale)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                       dropout_p: float, scale: float | None = None) -> torch.Tensor:
    """dropout(softmax(q·kᵀ·scale (1/√d by default) + mask))·v, computed step by step: a boolean ``mask`` sets the
    scores it hides (False) to −inf, another is added; without one, the scores are causally masked if ``causal``."""
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else scores.add_(mask)
    elif causal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu_(1)
        scores.masked_fill_(future, float("-inf"))
    return dropout(torch.softmax(scores, dim=-1), dropout_p, True) @ v


class Embeddings(nn.Module):
    """Token + position (+ segment) embeddings of width E, normalised (BERT) and dropped out."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        width = cfg.embedding_width
        self.tokens = nn.Embedding(cfg.vocab_size, width)
        self.positions = nn.Embedding(cfg.max_positions, width)
        self.types = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.norm = make_norm(cfg, width) if cfg.embedding_norm else nn.Identity()
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None, positions: torch.Tensor | None = None
                ) -> torch.Tensor:
        where = self.positions.weight[: ids.shape[1]] if positions is None else self.positions(positions)
        x = self.tokens(ids) + where
        if self.types is not None:
            x = x + (self.types(types) if types is not None else self.types.weight[0])
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention sublayer f(x), with the norm its residual connection uses."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.heads, self.causal, self.attn_dropout = cfg.heads, cfg.causal, cfg.dropout
        self.scale = None if cfg.scale_attention else 1.0
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=cfg.bias)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.adapter: nn.Module = nn.Identity()  # Houlsby's adapter, where one is inserted (models.additions)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: LayerCache | None = None) -> torch.Tensor:
        q, k, v = self.split(self.qkv(x), 3)
        if cache is not None:
            k, v = cache.extend(k, v)
        # one query (a decoding step) sees every key, itself last: SDPA's is_causal would hide all but the first
        return self.attend(q, k, v, mask, self.causal and q.shape[2] > 1)

    def split(self, y: torch.Tensor, n: int) -> torch.Tensor:
        """(batch, time, n·hidden) projections → (n, batch, heads, time, head size)."""
        b, t, _ = y.shape
        return y.view(b, t, n, self.heads, -1).permute(2, 0, 3, 1, 4)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               causal: bool) -> torch.Tensor:
        """The attention of queries over keys and values (batch, heads, time, head size), projected out."""
        y = attention(q, k, v, mask, causal, self.attn_dropout if self.training else 0.0, self.scale)
        b, _, t, _ = q.shape
        return self.dropout(self.adapter(self.out(y.transpose(1, 2).reshape(b, t, -1))))


class FeedForward(nn.Module):
    """Position-wise feed-forward sublayer f(x), with the norm its residual connection uses."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.inp = nn.Linear(cfg.hidden, cfg.intermediate, bias=cfg.bias)
        self.out = nn.Linear(cfg.intermediate, cfg.hidden, bias=cfg.bias)
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.adapter: nn.Module = nn.Identity()  # Houlsby's adapter, where one is inserted (models.additions)
        self.activation = activation(cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.adapter(self.out(self.activation(self.inp(x)))))


class Transformer(nn.Module):
    """Token ids (+ segment ids, + padding mask) → hidden states of shape (batch, time, hidden).

    Layer ``i`` applies ``attention[i]``, then (in a decoder) ``cross_attention[i]``, then ``feed_forward[i]``
    (index 0 for every layer when that sublayer is shared), each inside a residual connection with its norm.

    An encoder-decoder's stacks have no ``embeddings`` (``forward`` gets its shared ones as ``embedded``), a
    ``position_bias`` ((length, past) → (1, heads, length, past + length) added to the scores) and, in the decoder,
    ``cross_attention`` (a sublayer per layer, ``f(x, memory, i)``), and may give its ``feed_forward`` sublayer
    class (T5 v1.1's gated one).
    """

    def __init__(self, cfg: TransformerConfig, *, embeddings: bool = True, position_bias: nn.Module | None = None,
                 cross_attention: nn.ModuleList | None = None, feed_forward: type[FeedForward] | None = None):
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg) if embeddings else None
        self.project = nn.Linear(cfg.embedding_width, cfg.hidden) if cfg.embedding_width != cfg.hidden else None
        self.position_bias = position_bias
        n_attention = 1 if cfg.sharing in ("all", "attention") else cfg.layers
        n_ffn = 1 if cfg.sharing in ("all", "ffn") else cfg.layers
        self.attention = nn.ModuleList(SelfAttention(cfg) for _ in range(n_attention))
        self.cross_attention = cross_attention
        self.feed_forward = nn.ModuleList((feed_forward or FeedForward)(cfg) for _ in range(n_ffn))
        self.pre_norm = cfg.norm == "pre"
        self.final_norm = make_norm(cfg) if self.pre_norm else nn.Identity()
        self.mix: nn.Module | None = None  # ELMo's scalar mix of every layer, where one is inserted (models.additions)
        self.apply(self._init)
        if self.embed is not None:  # N(0, embedding_std): the N(0, INIT_STD) draw rescaled, so no other draw moves
            with torch.no_grad():
                self.embed.tokens.weight.mul_(cfg.embedding_std / INIT_STD)
        if self.pre_norm:
            for sublayer in (*self.attention, *self.feed_forward):
                nn.init.normal_(sublayer.out.weight, std=0.02 / math.sqrt(2 * cfg.layers))
        if not cfg.scale_attention:  # start as a scaled stack would: the queries absorb 1/√(head size)
            with torch.no_grad():
                for sublayer in (*self.attention, *(cross_attention or ())):
                    sublayer.qkv.weight[: cfg.hidden].mul_((cfg.hidden // cfg.heads) ** -0.5)

    def layer_modules(self) -> list[list[nn.Module | None]]:
        """Layer groups bottom to top: the embeddings, then layer l's attention and feed-forward; a sublayer
        shared across layers (ALBERT), the final LayerNorm and the scalar mix belong to the top layer."""
        n = self.config.layers
        groups: list[list[nn.Module | None]] = [[self.embed, self.project, self.position_bias]] + [[] for _ in range(n)]
        for stack in (self.attention, self.cross_attention or [], self.feed_forward):
            for i, sublayer in enumerate(stack):
                groups[n if len(stack) < n else i + 1].append(sublayer)
        groups[n] += [self.final_norm, self.mix]
        return groups

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.RMSNorm):
            nn.init.ones_(module.weight)

    def attention_mask(self, padding: torch.Tensor | None, length: int, past: int = 0,
                       window: int | None = None, bias: torch.Tensor | None = None) -> torch.Tensor | None:
        """Boolean mask (True = may attend) of ``length`` new positions over ``past + length`` keys, from a
        (batch, keys) padding mask (True at real tokens; None: nothing padded), causal in causal models and
        banded to ``window`` positions if given. None when SDPA needs no mask (``is_causal`` covers a causal
        model's prefix; one new query, a decoding step's, may see every key). A query that may see nothing (a left
        pad in a causal model) sees itself, so no row of the softmax is empty. With a position ``bias`` (1,
        heads, length, keys): the bias where the mask is True, −inf elsewhere (the bias alone where all is True).
        Whether ``padding`` pads anything is asked only on the CPU, where it costs no wait; under export and on an
        accelerator a mask given is applied, so pass None when nothing is padded (:func:`~.padding.is_padded`:
        asking there would make the host wait for the device at every forward pass)."""
        padded = is_padded(padding)
        causal = self.config.causal and length > 1  # a single query is the last position: every key is before it
        if not padded and window is None and (not causal or past == 0 and bias is None):
            return bias
        device = self.attention[0].qkv.weight.device
        query = torch.arange(past, past + length, device=device)[:, None]
        key = torch.arange(past + length, device=device)[None, :]
        mask = key <= query if causal else torch.ones(length, past + length, dtype=torch.bool, device=device)
        if window is not None:
            mask = mask & ((query - key).abs() < window)
        if padded:
            mask = mask & padding[:, None, None, :].bool()
            mask = mask | (~mask.any(-1, keepdim=True) & (key == query))
        return mask if bias is None else torch.where(mask, bias, float("-inf"))

    def residual(self, sublayer: nn.Module, x: torch.Tensor, *context) -> torch.Tensor:
        """Post-LN ``LN(x + f(x))`` or pre-LN ``x + f(LN(x))``; ``context``: the attention's mask and cache, or
        the cross-attention's memory and layer."""
        if self.pre_norm:
            return x + sublayer(sublayer.norm(x), *context)
        return sublayer.norm(x + sublayer(x, *context))

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None, padding: torch.Tensor | None = None,
                all_layers: bool = False, embedded: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, memory: Memory | None = None) -> torch.Tensor | list[torch.Tensor]:
        """Hidden states of the last layer (or, with a scalar ``mix`` inserted, their mix with every layer's),
        or of the embeddings and every layer when ``all_layers``.

        ``embedded`` replaces ``self.embed(ids, types)``: a model sharing another's embeddings (ELECTRA's
        generator reads the discriminator's) passes them in and sets its own ``embed`` to None.
        ``positions`` (batch, time) replaces 0, 1, ... (left-padded prompts count from their first real token).
        With a ``cache``, ``ids`` are the tokens after the cached ones, ``padding`` covers the cached and
        the new tokens, and the new keys and values are appended to the cache. A decoder reads the encoder's
        states from ``memory`` (:class:`~sesame.models.caches.Memory`)."""
        past = cache.length if cache is not None else 0
        end = past + ids.shape[1] if positions is None else int(positions.max()) + 1
        if self.config.learned_positions and end > self.config.max_positions:
            raise ValueError(f"sequence length {end} exceeds max_positions {self.config.max_positions}")
        if positions is None and past and embedded is None:
            positions = torch.arange(past, past + ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        bias = self.position_bias(ids.shape[1], past) if self.position_bias is not None else None
        dense = self.attention_mask(padding, ids.shape[1], past, bias=bias)
        window = self.config.attention_window
        banded = self.attention_mask(padding, ids.shape[1], past, window, bias) if window is not None else dense
        x = self.embed(ids, types, positions) if embedded is None else embedded
        if self.project is not None:
            x = self.project(x)
        layers = [x]
        for i in range(self.config.layers):
            layer_cache = cache.layer(i) if cache is not None else None
            x = self.residual(self.attention[i % len(self.attention)], x, banded if i % 2 else dense, layer_cache)
            if memory is not None:
                x = self.residual(self.cross_attention[i], x, memory, i)
            x = self.residual(self.feed_forward[i % len(self.feed_forward)], x)
            layers.append(x)
        if cache is not None:
            cache.length += ids.shape[1]
        layers[-1] = self.final_norm(x)
        if all_layers:
            return layers
        return self.mix(layers) if self.mix is not None else layers[-1]
