"""Static word vectors as the library uses them: GloVe / word2vec text files read and written, and the
rows of an embedding matrix for a vocabulary (a recurrent task model's, CoVe's MT-LSTM's).

Vectors load from GloVe text (``word v1 ... vd`` per line) or word2vec text (a first line
``count dim``, then the same rows); the format is detected. Nothing is unpickled. :func:`words` is the
word split that ``sesame vectors`` trains on and the ``word`` tokenizer uses, so vectors line up with
vocabularies. Training GloVe is an application: :mod:`sesame.apps.vectors`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from ..errors import SesameError
from .corpus import decoded_lines

PAD, UNK = "<pad>", "<unk>"
WORD = re.compile(r"<\w+>|\w+(?:['’-]\w+)*|[^\w\s]+")


def words(text: str, lower: bool = False) -> list[str]:
    """The word tokens of a text, optionally lower-cased: runs of letters/digits (with inner ' and -), runs of
    punctuation, and ``<...>`` markers such as WikiText's ``<unk>``."""
    return WORD.findall(text.lower() if lower else text)


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

    def save(self, path: str | Path) -> None:
        """Write GloVe text format: one ``word v1 ... vd`` line per word (6 significant digits)."""
        with open(path, "w", encoding="utf-8") as fh:
            for w, row in zip(self.words, self.vectors.tolist()):
                fh.write(w + " " + " ".join(f"{v:.6g}" for v in row) + "\n")


def _row(parts: list[str], where: str, dim: int | None) -> np.ndarray:
    """The floats of one text row (``parts`` = word then values); wrong counts or non-numbers name ``where``."""
    if dim is not None and len(parts) - 1 != dim:
        raise SesameError(f"{where}: {len(parts) - 1} values, but the file's vectors have {dim}; "
                          "fix or remove the line (a word with a space in it breaks the format)")
    try:
        row = np.asarray(parts[1:], dtype=np.float64)
    except ValueError:
        row = np.array([np.nan])
    if not (np.abs(row) <= np.finfo(np.float32).max).all():  # nan, inf, or inf as float32: they would spread
        raise SesameError(f"{where}: a value is not a finite number; fix or remove the line")
    return row.astype(np.float32)


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
