"""``sesame vectors``: train GloVe on a corpus, and look up a word's nearest neighbours in a vectors file.

GloVe (Pennington, Socher & Manning 2014): count how often word j appears near word i, X_ij, within a
symmetric window, each co-occurrence weighted by 1/d for words d apart (§4.2); then fit
w_iᵀw̃_j + b_i + b̃_j ≈ log X_ij by weighted least squares over the nonzero X_ij,
J = Σ f(X_ij)(w_iᵀw̃_j + b_i + b̃_j − log X_ij)² with f(x) = (x/x_max)^α capped at 1, α = 0.75,
x_max = 100 (eq. 8-9), trained with AdaGrad from a learning rate of 0.05; the word vectors are
W + W̃ (§4.2).

Deviations from the paper and its tool, all deliberate:

* AdaGrad runs in torch over shuffled mini-batches of nonzero pairs (the summed loss of a batch),
  not Hogwild per-pair updates; the accumulators start at 1, as the GloVe tool's do.
* Windows do not cross line ends (as the tool's ``cooccur``); words outside the vocabulary keep their
  place (distances count them) but their pairs are not counted (the tool drops them from the stream).
* Words are tokens of :func:`sesame.data.vectors.words`: runs of letters/digits (with inner ' and -),
  runs of punctuation, and ``<...>`` markers such as WikiText's ``<unk>``.

The vectors are written in GloVe text format; reading GloVe/word2vec files and turning vectors into
embedding rows is the library's (:mod:`sesame.data.vectors`). docs/wordvectors.md shows training on
WikiText-2 and its nearest neighbours.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data.corpus import iter_texts, resolve_sources
from ..data.ppmi import cooccurrence_counts
from ..data.vectors import PAD, UNK, WordVectors, words
from ..errors import SesameError
from ..options import option
from ..outputs import new_file


@dataclass(kw_only=True)
class GloveSpec:
    """``sesame vectors train``: the corpus, the vocabulary and window of the counts, and GloVe's training."""
    corpus: list[str] = option(help="text files, folders or .jsonl files")
    out: str = option(help="the vectors, in GloVe text format")
    dim: int = option(100, help="vector dimensions")
    window: int = option(10, help="co-occurrence window (words each side; weight 1/d)")
    epochs: int = option(15, help="passes over the nonzero counts")
    min_count: int = option(1, help="keep words seen this often")
    max_size: int | None = option(None, help="keep the most frequent words only")
    lower: bool = option(False, help="lower-case the text")
    lr: float = option(0.05, help="AdaGrad's learning rate")
    x_max: float = option(100.0, help="f(x) = (x/x_max)^alpha, capped at 1")
    alpha: float = option(0.75, help="the weighting's exponent")
    batch_size: int = option(4096, help="co-occurrence pairs per AdaGrad step")
    seed: int = option(0, help="seed of the initial vectors and the order of pairs")
    text_field: str = option("text", help="the text field of .jsonl records")
    progress: bool = option(True, cli=False, help="show progress bars")


@dataclass
class Vocabulary:
    """Words by id: ``<pad>`` is 0, ``<unk>`` is 1, then corpus words by falling count (ties by first sight)."""

    words: list[str]
    lower: bool = False
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        """The ids of a text's words; unknown words are ``<unk>`` (1)."""
        return [self.index.get(w, 1) for w in words(text, self.lower)]


def build_vocabulary(files: Sequence[Path], lower: bool = False, min_count: int = 1, max_size: int | None = None,
                     text_field: str = "text") -> Vocabulary:
    """The vocabulary of a corpus (files from ``resolve_sources``): words seen ``min_count`` times or more,
    the ``max_size`` most frequent (specials included in the size)."""
    if min_count < 1:
        raise SesameError(f"--min-count {min_count}: must be 1 or more")
    if max_size is not None and max_size < 3:
        raise SesameError(f"--max-size {max_size}: must be 3 or more (two specials and a word)")
    counts: Counter[str] = Counter()
    for text in iter_texts(files, text_field):
        counts.update(words(text, lower))
    counts.pop(PAD, None)
    counts.pop(UNK, None)
    kept = [w for w, c in counts.most_common() if c >= min_count]
    if max_size is not None:
        kept = kept[: max_size - 2]
    if not kept:
        raise SesameError(f"--corpus {files[0]}: no word occurs {min_count} times; lower --min-count or add text")
    return Vocabulary([PAD, UNK] + kept, lower)


@dataclass
class Cooccurrence:
    """The nonzero entries of the symmetric co-occurrence matrix X: ``X[rows[k], cols[k]] = counts[k]``."""

    rows: np.ndarray  # int64
    cols: np.ndarray  # int64
    counts: np.ndarray  # float64
    size: int  # the vocabulary size V (X is V x V)


def cooccurrence(files: Sequence[Path], vocab: Vocabulary, window: int = 10, text_field: str = "text") -> Cooccurrence:
    """X_ij = Σ 1/d over the occurrences of word j at distance d ≤ ``window`` from word i, on the same line
    (Pennington et al. 2014, §4.2); pairs with ``<pad>``/``<unk>`` are left out. The library's counts
    (:func:`sesame.data.ppmi.cooccurrence_counts`, lines as segments), entries in row-major order."""
    if window < 1:
        raise SesameError(f"--window {window}: must be 1 or more")
    ids_list, line_list = [], []
    for n, text in enumerate(iter_texts(files, text_field)):
        ids = vocab.encode(text)
        ids_list.append(np.asarray(ids, dtype=np.int64))
        line_list.append(np.full(len(ids), n, dtype=np.int64))
    ids = np.concatenate(ids_list) if ids_list else np.zeros(0, np.int64)
    lines = np.concatenate(line_list) if line_list else np.zeros(0, np.int64)
    counts = cooccurrence_counts(ids, lines, len(vocab), window, skip=(0, 1)).sorted_indices().tocoo()
    return Cooccurrence(counts.row.astype(np.int64), counts.col.astype(np.int64), counts.data, len(vocab))


def glove_weight(x: torch.Tensor, x_max: float = 100.0, alpha: float = 0.75) -> torch.Tensor:
    """f(x) = (x / x_max)^α, and 1 from x_max on (Pennington et al. 2014, eq. 9)."""
    return (x / x_max).pow(alpha).clamp(max=1.0)


def train_glove(cooc: Cooccurrence, vocab: Vocabulary, spec: GloveSpec) -> tuple[WordVectors, list[float]]:
    """Fit GloVe to the nonzero counts (module docstring); returns the vectors W + W̃ of the vocabulary's words
    (specials left out) and the mean weighted squared error of each epoch."""
    dim, epochs, lr, batch_size = spec.dim, spec.epochs, spec.lr, spec.batch_size
    for flag, value in (("--dim", dim), ("--epochs", epochs), ("--batch-size", batch_size)):
        if value < 1:
            raise SesameError(f"{flag} {value}: must be 1 or more")
    if len(cooc.counts) == 0:
        raise SesameError("--corpus: no two known words share a window; give more text or lower --min-count")
    gen = torch.Generator().manual_seed(spec.seed)
    size = cooc.size
    # the GloVe tool's start: uniform in ±0.5/dim, biases likewise
    params = [torch.nn.Parameter((torch.rand(size, n, generator=gen) - 0.5) / dim) for n in (dim, dim, 1, 1)]
    w, w_tilde, b, b_tilde = params
    opt = torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=1.0)
    torch.sparse.check_sparse_tensor_invariants.disable()  # Adagrad's sparse steps warn unless a choice is made
    rows, cols = torch.from_numpy(cooc.rows), torch.from_numpy(cooc.cols)
    counts = torch.from_numpy(cooc.counts)
    log_x = counts.log().float()
    weight = glove_weight(counts, spec.x_max, spec.alpha).float()
    losses = []
    for epoch in range(epochs):
        order = torch.randperm(len(counts), generator=gen)
        total = 0.0
        for first in tqdm(range(0, len(order), batch_size), desc=f"glove {epoch + 1}/{epochs}", unit="batch",
                          disable=not spec.progress, leave=False):
            k = order[first: first + batch_size]
            i, j = rows[k], cols[k]
            pred = ((F.embedding(i, w, sparse=True) * F.embedding(j, w_tilde, sparse=True)).sum(1)
                    + F.embedding(i, b, sparse=True)[:, 0] + F.embedding(j, b_tilde, sparse=True)[:, 0])
            loss = (weight[k] * (pred - log_x[k]).square()).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total / len(counts))
        if not math.isfinite(losses[-1]):
            raise SesameError(f"--lr {lr}: GloVe diverged in epoch {epoch + 1}; lower the learning rate")
    vectors = (w + w_tilde).detach()[2:].clone()
    return WordVectors(vocab.words[2:], vectors), losses


def glove(spec: GloveSpec) -> dict:
    """``sesame vectors train``: vocabulary, counts, GloVe, then ``spec.out`` in GloVe text format; returns a report
    (sizes, per-epoch loss, seconds per stage)."""
    files = resolve_sources(spec.corpus)
    new_file(spec.out, "--out", {"--corpus": files})
    start = time.perf_counter()
    vocab = build_vocabulary(files, spec.lower, spec.min_count, spec.max_size, spec.text_field)
    cooc = cooccurrence(files, vocab, spec.window, spec.text_field)
    counted = time.perf_counter()
    vectors, losses = train_glove(cooc, vocab, spec)
    trained = time.perf_counter()
    vectors.save(spec.out)
    return {"out": str(spec.out), "words": len(vectors.words), "dim": spec.dim, "nonzero_pairs": len(cooc.counts),
            "losses": losses, "count_seconds": round(counted - start, 1), "train_seconds": round(trained - counted, 1)}


def nearest(vectors: WordVectors, word: str, k: int) -> list[tuple[str, float]]:
    """``sesame vectors neighbors``: the ``k`` words nearest to ``word`` by cosine (the word itself left out)."""
    if word not in vectors.index:
        raise SesameError(f"--word {word!r} has no vector; pick a word from the vocabulary")
    unit = F.normalize(vectors.vectors, dim=1)
    cosines = unit @ unit[vectors.index[word]]
    cosines[vectors.index[word]] = -2.0
    top = cosines.topk(min(k, len(vectors.words) - 1))
    return [(vectors.words[i], float(c)) for c, i in zip(top.values, top.indices)]
