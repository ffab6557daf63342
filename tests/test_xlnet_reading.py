"""XLNet read as a language model over a long text (``PermutationLM.token_losses``, what ``sesame evaluate`` reports):
left to right, so a token's loss never depends on a later token; across segments through the memory, so segment 2
reads segment 1 with memory and not without; and the same losses as the pre-training objective computes in the
identity order with every token a target, whose memory is the two segments read together (tests/test_xlnet.py)."""
import pytest
import torch

from sesame.objectives.plm import PermutationLM

from .test_xlnet import SPECIALS, draws, model

pytestmark = pytest.mark.usefixtures("one_thread")
SEQ_LEN, TEXT = 8, 6  # each segment: 6 tokens of text, then <sep> <cls>


def reader(mem_len: int) -> PermutationLM:
    torch.manual_seed(1)
    obj = PermutationLM(model(mem_len=mem_len), SPECIALS, k=1, perm_size=1, segments=3).eval()
    torch.nn.init.normal_(obj.bias)
    return obj


def text(seed: int = 0) -> torch.Tensor:
    return torch.randint(5, 40, (2, 3 * TEXT + 4), generator=torch.Generator().manual_seed(seed))  # 4 segments


def changed(ids: torch.Tensor, position: int) -> torch.Tensor:
    out = ids.clone()
    out[:, position] = (ids[:, position] + 13) % 35 + 5
    return out


@pytest.mark.parametrize("mem_len", [0, 4, 16])
def test_a_tokens_loss_never_reads_a_later_token(mem_len):
    obj, ids = reader(mem_len), text()
    with torch.no_grad():
        losses = obj.token_losses(ids, SEQ_LEN)
        assert losses.shape == ids.shape and (losses > 0).all()
        for t in range(ids.shape[1]):
            later = ids.clone()
            later[:, t:] = (ids[:, t:] + 11) % 35 + 5
            after = obj.token_losses(later, SEQ_LEN)
            torch.testing.assert_close(after[:, :t], losses[:, :t], atol=1e-6, rtol=0)
            assert (after[:, t] != losses[:, t]).all()  # its own token is what it predicts


def test_segment_two_reads_segment_one_through_the_memory_only():
    ids = text()
    with torch.no_grad():
        remembering, forgetful = reader(16).token_losses(ids, SEQ_LEN), reader(0).token_losses(ids, SEQ_LEN)
        torch.testing.assert_close(remembering[:, :TEXT], forgetful[:, :TEXT], atol=1e-6, rtol=0)  # nothing before
        assert (remembering[:, TEXT:] - forgetful[:, TEXT:]).abs().amax() > 1e-2
        for obj, moves in ((reader(16), True), (reader(0), False)):
            before, after = obj.token_losses(ids, SEQ_LEN), obj.token_losses(changed(ids, 2), SEQ_LEN)
            assert ((after[:, TEXT:2 * TEXT] - before[:, TEXT:2 * TEXT]).abs().amax() > 1e-4) == moves
        pieces = [reader(0).token_losses(ids[:, s:s + TEXT], SEQ_LEN) for s in range(0, ids.shape[1], TEXT)]
        torch.testing.assert_close(forgetful, torch.cat(pieces, 1), atol=1e-5, rtol=1e-5)  # without memory: alone


@pytest.mark.parametrize("mem_len", [4, 16])
def test_the_losses_are_the_objectives_in_the_identity_order_with_every_token_predicted(mem_len):
    """The pre-training objective with perm_size 1 (the identity order) and k 1 (every token a target) over the same
    three segments: its summed loss, each segment after the memory of those before, is the sum of the reading's."""
    obj, ids = reader(mem_len), text()[:, :3 * TEXT]
    batch = obj.make_batch(ids, draws(2))
    assert batch["predict"].shape == (2, 3, TEXT) and torch.equal(batch["rank"][..., :TEXT],
                                                                  torch.arange(TEXT).expand(2, 3, -1))
    with torch.no_grad():
        torch.testing.assert_close(obj(batch), obj.token_losses(ids, SEQ_LEN).sum(), atol=1e-4, rtol=1e-5)
