"""The decoding step's output layer (sesame.models.vocabulary): the blocked product is the plain one."""
import pytest
import torch

from sesame.models.vocabulary import BLOCKS, FEW_ROWS, vocabulary_scores


@pytest.mark.parametrize("vocab", [BLOCKS * 40, BLOCKS * 40 + 7])  # blocks alone, and blocks plus the rows left over
@pytest.mark.parametrize("shape", [(1, 32), (3, 1, 32), (FEW_ROWS + 1, 32)])  # a step's rows, 3-D, a plain product
def test_blocked_scores_equal_the_plain_product(vocab, shape):
    gen = torch.Generator().manual_seed(0)
    states, weight = torch.randn(shape, generator=gen), torch.randn(vocab, shape[-1], generator=gen)
    got = vocabulary_scores(states, weight)
    assert got.shape == (*shape[:-1], vocab)
    torch.testing.assert_close(got, states @ weight.t(), rtol=1e-5, atol=1e-5)


def test_blocked_scores_keep_gradients():
    weight = torch.randn(BLOCKS * 4 + 1, 8, requires_grad=True)
    vocabulary_scores(torch.randn(2, 8), weight).sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
