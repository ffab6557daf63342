"""The output layer of a decoding step: scores over the vocabulary for the few states a step has."""
from __future__ import annotations

import torch

BLOCKS = 16  # vocabulary blocks of the batched product
FEW_ROWS = 64  # up to this many states a product is a decoding step's, with the BLAS on one thread


def vocabulary_scores(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``states @ weight.T``: states (..., hidden) times an output layer (vocabulary, hidden) → (..., vocabulary).

    On a CPU, a few rows (a decoding step's: one state per batch row) against a vocabulary of tens of thousands
    make a matrix-vector product, which PyTorch's BLAS runs on a single thread however many it has. There the
    vocabulary is cut into :data:`BLOCKS` equal blocks multiplied as one batched product, whose blocks run in
    parallel (and a product for the few rows left over): the same dot products, which makes greedy decoding of a
    mini T5 or BART 1.26-1.60× transformers' on 2 threads (``benchmarks/seq2seq_generate.py``, whose parity check
    compares the generated tokens). Elsewhere (more rows, or another device) it is the plain product."""
    rows = states.numel() // states.shape[-1]
    if states.device.type != "cpu" or rows > FEW_ROWS or weight.shape[0] < 2 * BLOCKS:
        return states @ weight.t()
    vocab, hidden = weight.shape
    block = vocab // BLOCKS
    flat = states.reshape(rows, hidden)
    blocked = torch.bmm(flat.expand(BLOCKS, rows, hidden), weight[:block * BLOCKS].view(BLOCKS, block, hidden).mT)
    scores = blocked.transpose(0, 1).reshape(rows, block * BLOCKS)
    if block * BLOCKS < vocab:
        scores = torch.cat([scores, flat @ weight[block * BLOCKS:].t()], 1)
    return scores.reshape(*states.shape[:-1], vocab)
