"""Count-based token vectors of a corpus: positive PMI of windowed co-occurrence counts, reduced by truncated SVD.

Levy, Goldberg & Dagan (2015), "Improving Distributional Similarity with Lessons Learned from Word Embeddings":
PMI(w, c) = log P̂(w, c) / (P̂(w) P̂_α(c)) with context-distribution smoothing P̂_α(c) = #(c)^α / Σ_c' #(c')^α, α = 0.75
(§3.2); PPMI = max(PMI, 0); the vectors are W = U_d Σ_d^p of the truncated SVD PPMI ≈ U_d Σ_d V_dᵀ with eigenvalue
weighting p = 0.5 (§3.3). Co-occurrences within a symmetric window of ``window`` tokens count 1/d for tokens d apart,
as GloVe's counts (Pennington et al. 2014, §4.2) and :mod:`sesame.apps.vectors` (a deterministic stand-in for
word2vec's sampled dynamic window, which Levy et al. carry over to PPMI). Windows stay inside a document; special
tokens are left out. The SVD is randomized (Halko, Martinsson & Tropp 2011, scikit-learn's), seeded.

Here the tokens are a run's own subword ids, read from its shards, so the vectors can start a model's token embedding
(:func:`sesame.pipelines.starts.ppmi_embedding`) within the run's time budget: on WikiText-2 + the Gutenberg books
(8.3M tokens, 16k ids) counting and a 256-dimensional SVD took 29 to 41 s on two cores (the line `sesame pretrain`
prints).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
from scipy import sparse
from sklearn.utils.extmath import randomized_svd
from tqdm.auto import tqdm

from .shards import Shards

ALPHA = 0.75  # context-distribution smoothing (Levy et al. 2015, §3.2)
CHUNK = 1 << 22  # tokens counted at a time (windows that straddle two chunks are not counted)


def cooccurrence_counts(ids: np.ndarray, segments: np.ndarray, size: int, window: int,
                        skip: Sequence[int] = ()) -> sparse.csr_matrix:
    """The symmetric ``size`` × ``size`` matrix X with X_ij = Σ 1/d over the occurrences of id j at distance
    d ≤ ``window`` from id i in the same segment (``segments[k]``: the segment of ``ids[k]``, e.g. its line or
    document); pairs with an id in ``skip`` are left out."""
    ids = np.asarray(ids, dtype=np.int64)
    kept = ~np.isin(ids, np.asarray(skip, dtype=np.int64))
    total = sparse.csr_matrix((size, size), dtype=np.float64)
    for d in range(1, window + 1):
        ok = (segments[:-d] == segments[d:]) & kept[:-d] & kept[d:]
        left, right = ids[:-d][ok], ids[d:][ok]
        total = total + sparse.csr_matrix((np.full(len(left), 1.0 / d), (left, right)), shape=(size, size))
    return (total + total.T).tocsr()  # each pair was counted once, left id first


def shard_cooccurrence(shards: Shards, size: int, window: int, skip: Sequence[int] = (),
                       max_tokens: int = 1 << 26, progress: bool = False) -> sparse.csr_matrix:
    """:func:`cooccurrence_counts` over a shard corpus, documents as segments, read :data:`CHUNK` tokens at a time;
    over ``max_tokens`` tokens, evenly spaced chunks of the corpus that hold that many."""
    chunks = list(_chunks(shards))
    if len(chunks) * CHUNK > max_tokens:
        chunks = [chunks[i] for i in np.linspace(0, len(chunks) - 1, max(1, max_tokens // CHUNK)).round().astype(int)]
    total = sparse.csr_matrix((size, size), dtype=np.float64)
    for shard, start in tqdm(chunks, desc="co-occurrences", unit="chunk", disable=not progress, leave=False):
        ids = np.asarray(shards.arrays[shard][start: start + CHUNK], dtype=np.int64)
        first = shards.shard_starts[shard] + start
        documents = np.searchsorted(shards.doc_ends, np.arange(first, first + len(ids)), side="right")
        total = total + cooccurrence_counts(ids, documents, size, window, skip)
    return total


def _chunks(shards: Shards) -> Iterator[tuple[int, int]]:
    for shard, array in enumerate(shards.arrays):
        for start in range(0, len(array), CHUNK):
            yield shard, start


def ppmi(counts: sparse.csr_matrix, alpha: float = ALPHA) -> sparse.csr_matrix:
    """max(PMI, 0) of co-occurrence ``counts`` (rows: words, columns: contexts), contexts' distribution smoothed by
    ``alpha`` (module docstring); entries of zero count stay zero."""
    counts = counts.tocoo()
    words, contexts = np.asarray(counts.sum(1)).ravel(), np.asarray(counts.sum(0)).ravel()
    smoothed = contexts ** alpha
    p_context = smoothed / smoothed.sum()
    pmi = np.log(counts.data / (words[counts.row] * p_context[counts.col]))  # P̂(w, c) / P̂(w) = #(w, c) / #(w)
    keep = pmi > 0
    return sparse.csr_matrix((pmi[keep].astype(np.float32), (counts.row[keep], counts.col[keep])), shape=counts.shape)


def svd_vectors(matrix: sparse.csr_matrix, dim: int, seed: int = 0, power: float = 0.5) -> np.ndarray:
    """U_d Σ_d^``power`` of the rank-``dim`` truncated SVD of ``matrix`` (one row per word; Levy et al. 2015, §3.3),
    randomized and seeded; fewer columns than ``dim`` when the matrix has fewer rows than ``dim`` + 1."""
    rank = min(dim, min(matrix.shape) - 1)
    u, s, _ = randomized_svd(matrix, rank, n_iter=4, random_state=seed)
    return (u * s ** power).astype(np.float32)


def ppmi_vectors(shards: Shards, size: int, dim: int, *, window: int = 10, skip: Sequence[int] = (), seed: int = 0,
                 progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The PPMI-SVD vectors of the ``size`` ids of a shard corpus (``[size, ≤ dim]``), and which ids have one (those
    that co-occur with another outside ``skip``; the other rows are zero)."""
    counts = shard_cooccurrence(shards, size, window, skip, progress=progress)
    counted = np.asarray(counts.sum(1)).ravel() > 0
    if not counted.any():  # no two tokens outside ``skip`` share a window
        return np.zeros((size, 0), np.float32), counted
    return svd_vectors(ppmi(counts), dim, seed), counted
