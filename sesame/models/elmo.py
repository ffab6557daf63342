"""ELMo's bidirectional language model (Peters et al. 2018, "Deep contextualized word representations").

The biLM (§3.1, §3.4):

* a context-independent token representation x_k from the word's characters (Kim et al. 2016's
  character CNN, as the released model): character embeddings → 1-D convolutions of several widths,
  max-pooled over the word and passed through a ReLU → highway layers (Srivastava et al. 2015) →
  a linear projection to ``projection`` dimensions;
* a forward LM and a backward LM, each ``layers`` LSTM layers of ``cell`` memory units with a linear
  projection to ``projection`` (``nn.LSTM``'s ``proj_size``), a residual connection from each layer
  to the next (§3.4: "a residual connection from the first to second layer"), sharing x_k;
* every layer's representation is [forward; backward] (2 × ``projection``); for layer 0 the token
  representation is duplicated, [x_k; x_k], as the paper does to give all layers one width;
* ``scalar_mix``: the output is eq. (1)'s γ·Σ_j s_j·h_j (:class:`~sesame.models.additions.ScalarMix`)
  over the three, which is what a task model reads through :meth:`Elmo.features`.

Characters come from a persistent ``chars`` buffer, one row of character codes per vocabulary entry
(see :meth:`Elmo.set_vocabulary`), so the table is saved in model.safetensors with the weights.

Deviations from the paper and its released code:

* words come from the run's word tokenizer: a word outside its vocabulary is ``<unk>`` (the original
  reads the raw characters of any word, so it has no out-of-vocabulary inputs);
* a word longer than ``max_chars`` − 2 UTF-8 bytes is truncated (as the original does), and a cut
  multi-byte character keeps its leading bytes;
* each filter is max-pooled over the windows inside the word rather than over all ``max_chars``
  positions (the released model pools every window, padding included), so a batch's codes can be cut to
  its longest word (on the CPU); and on the CPU the character CNN runs once per distinct word id of the batch;
* no cell or projection clipping of the LSTM states, and plain (not variational) dropout on the token
  representation and on each layer's output;
* the sizes below ``base`` (:meth:`ElmoConfig.sized`) are scaled down for a CPU; the paper's model
  (``base``) has 2048 filters, 4096 cells and 512-dimensional projections.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch
from torch import nn

from .additions import ScalarMix
from .padding import host_can_read, is_padded

# Character codes: 0 pads a word to max_chars, byte b is b + 1, then begin and end of word, then one
# code per special token of the tokenizer (its pad, unk, cls, sep and mask), so no text can spell one.
CHAR_PAD, BOW, EOW = 0, 257, 258
FIRST_SPECIAL, MAX_SPECIALS = 259, 8
CHAR_VOCAB = FIRST_SPECIAL + MAX_SPECIALS

# The paper's (and released model's) filters: (width, count), 2048 in all.
PAPER_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]

# size → (filters, projection, cell). ``base`` is the paper's model (§3.4: 2048 character n-gram
# filters, 4096 cells, 512-dimensional projections); the smaller ones have 4 cells per projected
# dimension (2 at ``tiny``) rather than 8, as the cells' recurrence would otherwise dominate a CPU step.
SIZES: dict[str, tuple[list[list[int]], int, int]] = {
    "tiny": ([[1, 8], [2, 8], [3, 16], [4, 32]], 32, 64),
    "mini": ([[1, 16], [2, 16], [3, 32], [4, 64], [5, 128]], 128, 512),
    "small": ([[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512]], 256, 1024),
    "medium": (PAPER_FILTERS, 512, 2048),
    "base": (PAPER_FILTERS, 512, 4096),
}


@dataclass
class ElmoConfig:
    vocab_size: int
    arch: str = "elmo"
    pad_id: int = 0
    max_chars: int = 50  # per word, begin- and end-of-word codes included
    char_embedding: int = 16
    filters: list[list[int]] = field(default_factory=lambda: [list(f) for f in PAPER_FILTERS])  # [width, count]
    highways: int = 2
    projection: int = 512  # the token representation and each LSTM layer's output, per direction
    cell: int = 4096  # LSTM memory cells per layer and direction
    layers: int = 2
    dropout: float = 0.1
    scalar_mix: bool = False  # output eq. (1)'s mix of the token layer and every LSTM layer

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"layers {self.layers}: must be at least 1")
        if self.max_chars < 3:
            raise ValueError(f"max_chars {self.max_chars}: needs room for begin, one byte and end of word")
        if not self.filters or any(len(f) != 2 or f[0] < 1 or f[1] < 1 or f[0] > self.max_chars for f in self.filters):
            raise ValueError(f"filters {self.filters}: give [width, count] pairs, widths 1 to max_chars")

    @classmethod
    def sized(cls, size: str, vocab_size: int, pad_id: int, dropout: float = 0.1) -> "ElmoConfig":
        """The configuration of ``size`` (:data:`SIZES`: tiny, mini, small scaled for a CPU; base the paper's)."""
        if size not in SIZES:
            raise ValueError(f"ELMo size {size!r}: choose one of {', '.join(SIZES)}")
        filters, projection, cell = SIZES[size]
        return cls(vocab_size=vocab_size, pad_id=pad_id, filters=[list(f) for f in filters], projection=projection,
                   cell=cell, dropout=dropout)

    @property
    def hidden(self) -> int:
        """The width of every layer's output: [forward; backward]."""
        return 2 * self.projection

    @property
    def feature_width(self) -> int:
        return self.hidden

    @property
    def causal(self) -> bool:
        return False

    def to_dict(self) -> dict:
        return asdict(self)


def word_chars(word: str, max_chars: int) -> list[int]:
    """A word's character codes: begin of word, its UTF-8 bytes (truncated to fit), end of word, padding."""
    codes = [b + 1 for b in word.encode("utf-8")[: max_chars - 2]]
    return [BOW, *codes, EOW] + [CHAR_PAD] * (max_chars - 2 - len(codes))


class Highway(nn.Module):
    """Highway layers (Srivastava et al. 2015): y = t·ReLU(W_h x) + (1 − t)·x with the transform gate
    t = σ(W_t x); the gate's bias starts at −2 so each layer first mostly carries its input (Kim et al. 2016)."""

    def __init__(self, width: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(layers))
        for layer in self.layers:
            nn.init.constant_(layer.bias[width:], -2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h, t = layer(x).chunk(2, dim=-1)
            t = torch.sigmoid(t)
            x = t * torch.relu(h) + (1 - t) * x
        return x


class CharCNN(nn.Module):
    """Character codes (words, max_chars) → token representations (words, projection): embeddings,
    convolutions max-pooled over the word, ReLU, highway layers and a linear projection (§3.4)."""

    def __init__(self, cfg: ElmoConfig):
        super().__init__()
        self.chars = nn.Embedding(CHAR_VOCAB, cfg.char_embedding, padding_idx=CHAR_PAD)
        self.convs = nn.ModuleList(nn.Conv1d(cfg.char_embedding, count, width) for width, count in cfg.filters)
        width = sum(count for _, count in cfg.filters)
        self.highway = Highway(width, cfg.highways)
        self.project = nn.Linear(width, cfg.projection)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Each filter is max-pooled over the windows inside the word (begin to end of word; the first
        window only when the word is shorter than the filter), so trailing padding changes nothing. On the
        CPU the codes are cut to the longest word of the batch (or the widest filter) before convolving; on an
        accelerator they keep all ``max_chars`` columns, as measuring the longest word would make the host wait."""
        n = (codes != CHAR_PAD).sum(1)  # characters per word, begin and end included
        if host_can_read(codes):
            widest = max(conv.kernel_size[0] for conv in self.convs)
            codes = codes[:, : max(int(n.max()), widest)]
        x = self.chars(codes).transpose(1, 2)  # (words, char_embedding, chars)
        pooled = []
        for conv in self.convs:
            y = conv(x)  # (words, count, positions)
            start = torch.arange(y.shape[-1], device=y.device)
            outside = (start[None, :] + conv.kernel_size[0] > n[:, None]) & (start[None, :] > 0)
            pooled.append(y.masked_fill(outside[:, None, :], float("-inf")).amax(dim=-1))
        return self.project(self.highway(torch.relu(torch.cat(pooled, dim=-1))))


def reverse_rows(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Each row's first ``lengths[i]`` positions in reverse order (the rest stay in place); its own inverse."""
    if lengths is None:
        return x.flip(1)
    t = torch.arange(x.shape[1], device=x.device)
    index = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return x.gather(1, index[:, :, None].expand_as(x))


class Elmo(nn.Module):
    """Token ids (+ padding mask) → ELMo representations (batch, time, ``config.hidden``).

    ``forward`` returns the top layer [forward; backward], the scalar mix with ``scalar_mix``, or with
    ``all_layers`` the list [x; x], layer 1, ..., layer L. ``padding`` is True at real tokens (rows
    right-padded): the forward LM never sees a pad before a real token, and the backward LM reads each
    row reversed from its last real token, so a padded row's real states equal those of the row alone.
    ``types`` are accepted and ignored, as the task heads pass segment ids to every backbone.
    """

    def __init__(self, cfg: ElmoConfig):
        super().__init__()
        self.config = cfg
        self.register_buffer("chars", torch.zeros(cfg.vocab_size, cfg.max_chars, dtype=torch.long))
        self.embed = CharCNN(cfg)
        p = cfg.projection
        self.forward_layers = nn.ModuleList(nn.LSTM(p, cfg.cell, batch_first=True, proj_size=p)
                                            for _ in range(cfg.layers))
        self.backward_layers = nn.ModuleList(nn.LSTM(p, cfg.cell, batch_first=True, proj_size=p)
                                             for _ in range(cfg.layers))
        self.dropout = nn.Dropout(cfg.dropout)
        self.mix = ScalarMix(cfg.layers + 1) if cfg.scalar_mix else None

    def set_vocabulary(self, words: Sequence[str], specials: Sequence[int] = ()) -> None:
        """Fill the character table from the tokenizer's vocabulary (``words[i]`` is id i's string);
        the ids in ``specials`` (pad, unk, cls, sep, mask) get a reserved code each instead of their spelling."""
        cfg = self.config
        if len(words) != cfg.vocab_size:
            raise ValueError(f"set_vocabulary: {len(words)} words for a vocabulary of {cfg.vocab_size}")
        if len(set(specials)) > MAX_SPECIALS:
            raise ValueError(f"set_vocabulary: at most {MAX_SPECIALS} special tokens, got {len(set(specials))}")
        rows = [word_chars(w, cfg.max_chars) for w in words]
        for k, i in enumerate(sorted(set(specials))):
            rows[i] = [BOW, FIRST_SPECIAL + k, EOW] + [CHAR_PAD] * (cfg.max_chars - 3)
        self.chars.copy_(torch.tensor(rows, dtype=torch.long))

    def tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """x_k: the context-independent token representations (…, projection): on the CPU computed once per
        distinct id; on an accelerator once per position, as finding the distinct ids would make the host wait."""
        if not host_can_read(ids):
            return self.embed(self.chars[ids.flatten()]).unflatten(0, ids.shape)
        unique, inverse = torch.unique(ids, return_inverse=True)
        return self.embed(self.chars[unique])[inverse]

    def layer_modules(self) -> list[list[nn.Module]]:
        """Layer groups, bottom to top: the character CNN, then one group per biLSTM layer (both
        directions); the scalar mix joins the top group."""
        groups = [[self.embed]] + [[f, b] for f, b in zip(self.forward_layers, self.backward_layers)]
        if self.mix is not None:
            groups[-1].append(self.mix)
        return groups

    def _run(self, ids: torch.Tensor, padding: torch.Tensor | None
             ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(x, forward layers, backward layers), the backward ones back in reading order."""
        lengths = padding.sum(1) if is_padded(padding) else None
        x = self.dropout(self.tokens(ids))
        directions = []
        for layers, reverse in ((self.forward_layers, False), (self.backward_layers, True)):
            h = reverse_rows(x, lengths) if reverse else x
            states = []
            for i, lstm in enumerate(layers):
                out = self.dropout(lstm(h)[0])
                h = out + h if i > 0 else out  # the residual connection between layers
                states.append(reverse_rows(h, lengths) if reverse else h)
            directions.append(states)
        return x, directions[0], directions[1]

    def directions(self, ids: torch.Tensor, padding: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The top layer's forward and backward states (batch, time, projection), before concatenation:
        position t of the first has read tokens ≤ t, of the second tokens ≥ t (the biLM's softmax inputs)."""
        _, forward, backward = self._run(ids, padding)
        return forward[-1], backward[-1]

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None, padding: torch.Tensor | None = None,
                all_layers: bool = False) -> torch.Tensor | list[torch.Tensor]:
        x, forward, backward = self._run(ids, padding)
        layers = [torch.cat([x, x], -1)] + [torch.cat(pair, -1) for pair in zip(forward, backward)]
        if all_layers:
            return layers
        return self.mix(layers) if self.mix is not None else layers[-1]

    def features(self, ids: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """ELMo_k^task (eq. 1): the scalar mix of all layers, (batch, time, ``config.feature_width``)."""
        if self.mix is None:
            raise ValueError("Elmo.features needs the scalar mix: build the ELMo config with scalar_mix=True")
        return self.forward(ids, padding=padding)
