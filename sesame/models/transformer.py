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
  approximation GPT-2 and ALBERT were trained with, Hugging Face's ``gelu_new``); weights initialised
  N(0, 0.02); in pre-norm stacks the residual output projections use std 0.02/√(2·layers) as in GPT-2;
* ALBERT (Lan et al. 2020, §3.1): a factorised embedding (V×E, then a E×H projection) when
  ``embedding_size`` < hidden, and cross-layer parameter sharing: ``sharing`` = ``all`` (one layer's
  attention and feed-forward reused at every depth), ``attention``, ``ffn`` or ``none``. A shared
  sublayer is stored once, so checkpoints hold each tensor once.

Two additions that fine-tuning recipes switch on by recording them in the configuration (the techniques
:class:`~sesame.train.recipes.Adapters` and :class:`~sesame.train.recipes.Features`), off by default; a
run's config.json thus rebuilds them wherever it is read:

* ``adapter_size`` m: a bottleneck adapter (Houlsby et al. 2019, §2.1) on the output of every
  attention and feed-forward sublayer, before its residual connection: ``y + W_up·GELU(W_down·y)``,
  initialised near the identity;
* ``scalar_mix``: the output is ELMo's task-weighted mix of the embeddings and every layer,
  γ·Σ_j softmax(s)_j·h_j (Peters et al. 2018, eq. 1), instead of the last layer alone.

The backbone knows nothing about losses or tasks; heads live with objectives and tasks and may
tie their output matrix to ``embed.tokens.weight`` (of width ``embedding_size``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


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
    adapter_size: int | None = None  # Houlsby adapters' bottleneck width (None: no adapters)
    scalar_mix: bool = False  # output ELMo's learned mix of all layers
    activation: str = "gelu"  # feed-forward GELU: gelu (exact) | gelu_tanh (tanh approximation, GPT-2's)
    attention_window: int | None = None  # GPT-3's banded layers: odd layers see w positions (None: all dense)

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing {self.sharing!r}: choose one of {', '.join(SHARING)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if self.attention_window is not None and self.attention_window < 1:
            raise ValueError(f"attention_window {self.attention_window}: must be at least 1")

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden

    def to_dict(self) -> dict:
        return asdict(self)


SHARING = ("none", "all", "attention", "ffn")
ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}  # name → F.gelu's ``approximate``


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
              dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on (batch, heads, time, head size) tensors. With attention
    dropout (training) and no mask it goes through :func:`explicit_attention` instead: SDPA has no
    fused kernel with dropout on a CPU and computes the same steps, but with a slower dropout mask."""
    if dropout_p > 0.0 and mask is None:
        return explicit_attention(q, k, v, causal, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                          dropout_p=dropout_p)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       dropout_p: float) -> torch.Tensor:
    """dropout(softmax(q·kᵀ/√d, causally masked if ``causal``))·v, computed step by step."""
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(1.0 / math.sqrt(q.shape[-1]))
    if causal:
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
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps) if cfg.embedding_norm else nn.Identity()
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None, positions: torch.Tensor | None = None
                ) -> torch.Tensor:
        where = self.positions.weight[: ids.shape[1]] if positions is None else self.positions(positions)
        x = self.tokens(ids) + where
        if self.types is not None:
            x = x + (self.types(types) if types is not None else self.types.weight[0])
        return self.dropout(self.norm(x))


class Adapter(nn.Module):
    """Houlsby et al. (2019) bottleneck adapter: y + W_up·GELU(W_down·y), hidden → m → hidden. Its
    projections start at N(0, 10⁻³) with zero biases, so it starts as (nearly) the identity and the
    pre-trained network's function is kept at the start of fine-tuning (their §2.1)."""

    def __init__(self, hidden: int, size: int):
        super().__init__()
        self.down, self.up = nn.Linear(hidden, size), nn.Linear(size, hidden)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in (self.down, self.up):
            nn.init.normal_(layer.weight, std=1e-3)
            nn.init.zeros_(layer.bias)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y + self.up(F.gelu(self.down(y)))


class ScalarMix(nn.Module):
    """ELMo's task-specific combination of layers (Peters et al. 2018, eq. 1): γ·Σ_j softmax(s)_j·h_j,
    with s = 0 (an even mix) and γ = 1 at the start."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        weights = torch.softmax(self.scalars, dim=0)
        return self.gamma * sum(w * h for w, h in zip(weights, layers))


class SelfAttention(nn.Module):
    """Multi-head self-attention sublayer f(x), with the LayerNorm its residual connection uses."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.heads, self.causal, self.attn_dropout = cfg.heads, cfg.causal, cfg.dropout
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)
        self.adapter = Adapter(cfg.hidden, cfg.adapter_size) if cfg.adapter_size else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: "LayerCache | None" = None) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.extend(k, v)
        y = attention(q, k, v, mask, self.causal, self.attn_dropout if self.training else 0.0)
        return self.dropout(self.adapter(self.out(y.transpose(1, 2).reshape(b, t, h))))


class FeedForward(nn.Module):
    """Position-wise GELU feed-forward sublayer f(x), with the LayerNorm its residual connection uses."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.inp = nn.Linear(cfg.hidden, cfg.intermediate)
        self.out = nn.Linear(cfg.intermediate, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)
        self.adapter = Adapter(cfg.hidden, cfg.adapter_size) if cfg.adapter_size else nn.Identity()
        self.approximate = ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.adapter(self.out(F.gelu(self.inp(x), approximate=self.approximate))))


class Transformer(nn.Module):
    """Token ids (+ segment ids, + padding mask) → hidden states of shape (batch, time, hidden).

    Layer ``i`` applies ``attention[i]`` then ``feed_forward[i]`` (index 0 for every layer when that
    sublayer is shared), each inside a residual connection with its LayerNorm.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg)
        self.project = nn.Linear(cfg.embedding_width, cfg.hidden) if cfg.embedding_width != cfg.hidden else None
        n_attention = 1 if cfg.sharing in ("all", "attention") else cfg.layers
        n_ffn = 1 if cfg.sharing in ("all", "ffn") else cfg.layers
        self.attention = nn.ModuleList(SelfAttention(cfg) for _ in range(n_attention))
        self.feed_forward = nn.ModuleList(FeedForward(cfg) for _ in range(n_ffn))
        self.pre_norm = cfg.norm == "pre"
        self.final_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps) if self.pre_norm else nn.Identity()
        self.mix = ScalarMix(cfg.layers + 1) if cfg.scalar_mix else None
        self.apply(self._init)
        if self.pre_norm:
            for sublayer in (*self.attention, *self.feed_forward):
                nn.init.normal_(sublayer.out.weight, std=0.02 / math.sqrt(2 * cfg.layers))

    def layer_modules(self) -> list[list[nn.Module | None]]:
        """Layer groups bottom to top: the embeddings, then layer l's attention and feed-forward; a sublayer
        shared across layers (ALBERT), the final LayerNorm and the scalar mix belong to the top layer."""
        n = self.config.layers
        groups: list[list[nn.Module | None]] = [[self.embed, self.project]] + [[] for _ in range(n)]
        for stack in (self.attention, self.feed_forward):
            for i, sublayer in enumerate(stack):
                groups[n if len(stack) < n else i + 1].append(sublayer)
        groups[n] += [self.final_norm, self.mix]
        return groups

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, Adapter):
            module.reset_parameters()  # after its Linear children got the default below: near the identity
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def attention_mask(self, padding: torch.Tensor | None, length: int, past: int = 0,
                       window: int | None = None) -> torch.Tensor | None:
        """Boolean mask (True = may attend) of ``length`` new positions over ``past + length`` keys, from a
        (batch, keys) padding mask (True at real tokens; None: nothing padded), causal in causal models and
        banded to ``window`` positions if given. None when SDPA needs no mask (``is_causal`` covers a causal
        model's prefix). A query that may see nothing (a left pad in a causal model) sees itself, so no row of
        the softmax is empty."""
        padded = padding is not None and not bool(padding.all())
        if not padded and window is None and (past == 0 or not self.config.causal):
            return None
        device = padding.device if padding is not None else self.embed.tokens.weight.device
        query = torch.arange(past, past + length, device=device)[:, None]
        key = torch.arange(past + length, device=device)[None, :]
        mask = key <= query if self.config.causal else torch.ones(length, past + length, dtype=torch.bool,
                                                                  device=device)
        if window is not None:
            mask = mask & ((query - key).abs() < window)
        if padded:
            mask = mask & padding[:, None, None, :].bool()
            mask = mask | (~mask.any(-1, keepdim=True) & (key == query))
        return mask

    def residual(self, sublayer: nn.Module, x: torch.Tensor, *context) -> torch.Tensor:
        """Post-LN ``LN(x + f(x))`` or pre-LN ``x + f(LN(x))``; ``context``: the attention's mask and cache."""
        if self.pre_norm:
            return x + sublayer(sublayer.norm(x), *context)
        return sublayer.norm(x + sublayer(x, *context))

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None, padding: torch.Tensor | None = None,
                all_layers: bool = False, embedded: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor | list[torch.Tensor]:
        """Hidden states of the last layer (or their scalar mix with every layer's, with ``scalar_mix``),
        or of the embeddings and every layer when ``all_layers``.

        ``embedded`` replaces ``self.embed(ids, types)``: a model sharing another's embeddings (ELECTRA's
        generator reads the discriminator's) passes them in and sets its own ``embed`` to None.
        ``positions`` (batch, time) replaces 0, 1, ... (left-padded prompts count from their first real token).
        With a ``cache``, ``ids`` are the tokens after the cached ones, ``padding`` covers the cached and
        the new tokens, and the new keys and values are appended to the cache."""
        past = cache.length if cache is not None else 0
        end = past + ids.shape[1] if positions is None else int(positions.max()) + 1
        if end > self.config.max_positions:
            raise ValueError(f"sequence length {end} exceeds max_positions {self.config.max_positions}")
        if positions is None and past:
            positions = torch.arange(past, past + ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        dense = self.attention_mask(padding, ids.shape[1], past)
        window = self.config.attention_window
        banded = self.attention_mask(padding, ids.shape[1], past, window) if window is not None else dense
        x = self.embed(ids, types, positions) if embedded is None else embedded
        if self.project is not None:
            x = self.project(x)
        layers = [x]
        for i in range(self.config.layers):
            layer_cache = cache.layer(i) if cache is not None else None
            x = self.residual(self.attention[i % len(self.attention)], x, banded if i % 2 else dense, layer_cache)
            x = self.residual(self.feed_forward[i % len(self.feed_forward)], x)
            layers.append(x)
        if cache is not None:
            cache.length += ids.shape[1]
        layers[-1] = self.final_norm(x)
        if all_layers:
            return layers
        return self.mix(layers) if self.mix is not None else layers[-1]


class LayerCache:
    """One layer's view of a :class:`KVCache`."""

    def __init__(self, cache: KVCache, layer: int):
        self.cache, self.layer = cache, layer

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' keys and values (batch, heads, new, head size); return all keys and values so far."""
        start = self.cache.length
        end = start + k.shape[2]
        keys, values = self.cache.keys[self.layer], self.cache.values[self.layer]
        keys[:, :, start:end], values[:, :, start:end] = k, v
        return keys[:, :, :end], values[:, :, :end]


class KVCache:
    """Every layer's attention keys and values for the tokens seen so far, in buffers allocated once for
    ``capacity`` positions, so decoding appends in place. ``length`` counts the cached tokens. The buffers live
    on the model's ``device``, in the ``dtype`` its keys and values are computed in (bfloat16 under bf16
    autocast); :meth:`sesame.language_model.LanguageModel.cache` makes one so."""

    def __init__(self, cfg: TransformerConfig, batch: int, capacity: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        shape = (batch, cfg.heads, capacity, cfg.hidden // cfg.heads)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.length = 0

    def layer(self, i: int) -> LayerCache:
        return LayerCache(self, i)

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep the batch rows ``rows``, in that order (beam search's surviving hypotheses); ``rows`` may be on
        any device."""
        rows = rows.to(self.keys[0].device) if self.keys else rows
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
