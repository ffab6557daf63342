"""Static word vectors: train GloVe on a corpus, read and write GloVe / word2vec text files.

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
* Words are tokens of :func:`words`: runs of letters/digits (with inner ' and -), runs of punctuation,
  and ``<...>`` markers such as WikiText's ``<unk>``.

Pre-trained vectors load from GloVe text (``word v1 ... vd`` per line) or word2vec text (a first
line ``count dim``, then the same rows); the format is detected. Nothing is unpickled.
docs/wordvectors.md shows training on WikiText-2 and its nearest neighbours.
"""
from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data.corpus import decoded_lines, iter_pieces, resolve_sources
from .errors import SesameError

PAD, UNK = "<pad>", "<unk>"
WORD = re.compile(r"<\w+>|\w+(?:['’-]\w+)*|[^\w\s]+")


def words(text: str, lower: bool = False) -> list[str]:
    """The word tokens of a text (see the module docstring), optionally lower-cased."""
    return WORD.findall(text.lower() if lower else text)


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
    for _, text in iter_pieces(files, text_field):
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


def _reduce(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the weights of equal keys: (sorted unique keys, their sums)."""
    unique, inverse = np.unique(keys, return_inverse=True)
    return unique, np.bincount(inverse, weights=weights, minlength=len(unique))


def cooccurrence(files: Sequence[Path], vocab: Vocabulary, window: int = 10, text_field: str = "text") -> Cooccurrence:
    """X_ij = Σ 1/d over the occurrences of word j at distance d ≤ ``window`` from word i, on the same line
    (Pennington et al. 2014, §4.2); pairs with ``<pad>``/``<unk>`` are left out. Accumulated distance by
    distance as sorted int64 keys i·V + j, so memory is a few arrays the size of the corpus and of X."""
    if window < 1:
        raise SesameError(f"--window {window}: must be 1 or more")
    ids_list, line_list = [], []
    for n, (_, text) in enumerate(iter_pieces(files, text_field)):
        ids = vocab.encode(text)
        ids_list.append(np.asarray(ids, dtype=np.int64))
        line_list.append(np.full(len(ids), n, dtype=np.int64))
    ids = np.concatenate(ids_list) if ids_list else np.zeros(0, np.int64)
    lines = np.concatenate(line_list) if line_list else np.zeros(0, np.int64)
    size = len(vocab)
    keys, sums = np.zeros(0, np.int64), np.zeros(0, np.float64)
    for d in range(1, window + 1):
        left, right = ids[:-d], ids[d:]
        ok = (lines[:-d] == lines[d:]) & (left > 1) & (right > 1)
        new_keys, new_sums = _reduce(left[ok] * size + right[ok], np.full(int(ok.sum()), 1.0 / d))
        keys, sums = _reduce(np.concatenate([keys, new_keys]), np.concatenate([sums, new_sums]))
    # each pair was counted once, left word first; X is that plus its transpose
    keys, sums = _reduce(np.concatenate([keys, (keys % size) * size + keys // size]), np.concatenate([sums, sums]))
    return Cooccurrence(keys // size, keys % size, sums, size)


def glove_weight(x: torch.Tensor, x_max: float = 100.0, alpha: float = 0.75) -> torch.Tensor:
    """f(x) = (x / x_max)^α, and 1 from x_max on (Pennington et al. 2014, eq. 9)."""
    return (x / x_max).pow(alpha).clamp(max=1.0)


@dataclass
class WordVectors:
    """One vector per word (row i of ``vectors`` is ``words[i]``)."""

    words: list[str]
    vectors: torch.Tensor  # [n, dim] float32
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.index = {}
        for i, w in enumerate(self.words):
            self.index.setdefault(w, i)  # a repeated word keeps its first row

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    def nearest(self, word: str, k: int = 10) -> list[tuple[str, float]]:
        """The ``k`` words nearest to ``word`` by cosine (the word itself left out)."""
        if word not in self.index:
            raise SesameError(f"--word {word!r} has no vector; pick a word from the vocabulary")
        unit = F.normalize(self.vectors, dim=1)
        cosines = unit @ unit[self.index[word]]
        cosines[self.index[word]] = -2.0
        top = cosines.topk(min(k, len(self.words) - 1))
        return [(self.words[i], float(c)) for c, i in zip(top.values, top.indices)]

    def save(self, path: str | Path) -> None:
        """Write GloVe text format: one ``word v1 ... vd`` line per word (6 significant digits)."""
        with open(path, "w", encoding="utf-8") as fh:
            for w, row in zip(self.words, self.vectors.tolist()):
                fh.write(w + " " + " ".join(f"{v:.6g}" for v in row) + "\n")


def train_glove(cooc: Cooccurrence, vocab: Vocabulary, dim: int = 100, epochs: int = 15, lr: float = 0.05,
                x_max: float = 100.0, alpha: float = 0.75, batch_size: int = 4096, seed: int = 0,
                progress: bool = True) -> tuple[WordVectors, list[float]]:
    """Fit GloVe to the nonzero counts (module docstring); returns the vectors W + W̃ of the vocabulary's words
    (specials left out) and the mean weighted squared error of each epoch."""
    for flag, value in (("--dim", dim), ("--epochs", epochs), ("--batch-size", batch_size)):
        if value < 1:
            raise SesameError(f"{flag} {value}: must be 1 or more")
    if len(cooc.counts) == 0:
        raise SesameError("--corpus: no two known words share a window; give more text or lower --min-count")
    gen = torch.Generator().manual_seed(seed)
    size = cooc.size
    # the GloVe tool's start: uniform in ±0.5/dim, biases likewise
    params = [torch.nn.Parameter((torch.rand(size, n, generator=gen) - 0.5) / dim) for n in (dim, dim, 1, 1)]
    w, w_tilde, b, b_tilde = params
    opt = torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=1.0)
    torch.sparse.check_sparse_tensor_invariants.disable()  # Adagrad's sparse steps warn unless a choice is made
    rows, cols = torch.from_numpy(cooc.rows), torch.from_numpy(cooc.cols)
    counts = torch.from_numpy(cooc.counts)
    log_x = counts.log().float()
    weight = glove_weight(counts, x_max, alpha).float()
    losses = []
    for epoch in range(epochs):
        order = torch.randperm(len(counts), generator=gen)
        total = 0.0
        for first in tqdm(range(0, len(order), batch_size), desc=f"glove {epoch + 1}/{epochs}", unit="batch",
                          disable=not progress, leave=False):
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


def glove(corpus: Sequence[str | Path], out: str | Path, dim: int = 100, window: int = 10, epochs: int = 15,
          min_count: int = 1, max_size: int | None = None, lower: bool = False, lr: float = 0.05,
          x_max: float = 100.0, alpha: float = 0.75, batch_size: int = 4096, seed: int = 0,
          text_field: str = "text", progress: bool = True) -> dict:
    """``sesame vectors train``: vocabulary, counts, GloVe, then ``out`` in GloVe text format; returns a report
    (sizes, per-epoch loss, seconds per stage)."""
    files = resolve_sources(corpus)
    start = time.perf_counter()
    vocab = build_vocabulary(files, lower, min_count, max_size, text_field)
    cooc = cooccurrence(files, vocab, window, text_field)
    counted = time.perf_counter()
    vectors, losses = train_glove(cooc, vocab, dim, epochs, lr, x_max, alpha, batch_size, seed, progress)
    trained = time.perf_counter()
    vectors.save(out)
    return {"out": str(out), "words": len(vectors.words), "dim": dim, "nonzero_pairs": len(cooc.counts),
            "losses": losses, "count_seconds": round(counted - start, 1), "train_seconds": round(trained - counted, 1)}


def _row(parts: list[str], where: str, dim: int | None) -> np.ndarray:
    """The floats of one text row (``parts`` = word then values); wrong counts or non-numbers name ``where``."""
    if dim is not None and len(parts) - 1 != dim:
        raise SesameError(f"{where}: {len(parts) - 1} values, but the file's vectors have {dim}; "
                          "fix or remove the line (a word with a space in it breaks the format)")
    try:
        return np.asarray(parts[1:], dtype=np.float32)
    except ValueError:
        raise SesameError(f"{where}: a value is not a number; fix or remove the line") from None


def load_vectors(path: str | Path) -> WordVectors:
    """Read GloVe text (``word v1 ... vd``) or word2vec text (first line ``count dim``), told apart by the first
    line; bad UTF-8, ragged rows, non-numbers and a wrong count name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise SesameError(f"--vectors {path}: no such file")
    names: list[str] = []
    rows: list[np.ndarray] = []
    dim = header = None
    for lineno, line in decoded_lines(path):
        parts = line.split()
        where = f"{path}:{lineno}"
        if not parts:
            continue
        if lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
            header, dim = int(parts[0]), int(parts[1])  # word2vec's "count dim"
            continue
        if len(parts) < 2:
            raise SesameError(f"{where}: a word without values; fix or remove the line")
        rows.append(_row(parts, where, dim))
        dim = len(parts) - 1
        names.append(parts[0])
    if not rows:
        raise SesameError(f"--vectors {path}: no vectors in the file; expected 'word v1 v2 ...' lines")
    if header is not None and header != len(rows):
        raise SesameError(f"{path}:1: the header says {header} vectors but the file has {len(rows)}; fix the count")
    return WordVectors(names, torch.from_numpy(np.stack(rows)))


def embedding_matrix(vectors: WordVectors, vocab: Iterable[str], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows for a vocabulary, to initialise an embedding: each word's vector (exact match, else its lower-case
    form); ``<pad>`` zero; others drawn from N(0, σ²), σ the standard deviation of the found rows' entries, so they
    start at the same scale (0.02 when fewer than two are found). Returns the matrix and a bool mask of the rows
    found (coverage = mask.float().mean())."""
    names = list(vocab)
    gen = torch.Generator().manual_seed(seed)
    found = torch.zeros(len(names), dtype=torch.bool)
    picked = torch.full((len(names),), -1, dtype=torch.long)
    for r, w in enumerate(names):
        i = vectors.index.get(w, vectors.index.get(w.lower(), -1))
        if i >= 0:
            picked[r], found[r] = i, True
    sigma = float(vectors.vectors[picked[found]].std()) if found.sum() > 1 else 0.02
    matrix = torch.randn(len(names), vectors.dim, generator=gen) * sigma
    matrix[found] = vectors.vectors[picked[found]].float()
    matrix[[r for r, w in enumerate(names) if w == PAD]] = 0.0
    return matrix, found
