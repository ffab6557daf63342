"""XLNet's pre-training data options: span-based targets (Yang et al. 2019, §3.1; the code's ``_sample_mask``) and
bidirectional data with ``clamp_len`` (§3.1; the code's ``relative_positional_encoding``), against their definitions
and against transformers' ``XLNetModel`` with ``bi_data`` and ``clamp_len``."""
import pytest
import torch

from sesame.families import FAMILIES
from sesame.interop.xlnet import export_weights
from sesame.models import XLNet, XLNetConfig
from sesame.models.xlnet import relative_encodings, sinusoids, target_mapping
from sesame.objectives.plm import (PermutationLM, factorisation_order, permutation_masks, sample_spans,
                                   select_targets, span_targets)
from sesame.tokenizer import SpecialIds

pytestmark = pytest.mark.usefixtures("one_thread")
SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def model(clamp_len: int = -1, mem_len: int = 8) -> XLNet:
    torch.manual_seed(0)
    net = XLNet(XLNetConfig(vocab_size=40, hidden=16, layers=2, heads=2, intermediate=32, dropout=0.0,
                            mem_len=mem_len, clamp_len=clamp_len)).eval()
    with torch.no_grad():  # N(0, 1) tokens and position terms, so distances show in the states
        net.embed.tokens.weight.normal_()
        for attention in net.attention:
            attention.r_r_bias.normal_()
            attention.r.weight.normal_(std=0.3)
    return net


def draw(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("n, k, max_span", [(64, 6, 5), (37, 7, 5), (20, 4, 3), (5, 6, 5)])
def test_targets_are_spans_of_at_most_max_span_in_their_contexts_and_exactly_one_kth_in_all(n, k, max_span):
    goal = max(1, round(n / k))
    for seed in range(20):
        begins, starts, lengths = sample_spans(n, k, max_span, 3, draw(seed))
        target = span_targets(n, k, max_span, 3, draw(seed))  # the same draws: the spans above, then the top-up
        assert target.shape == (3, n) and (target.sum(-1) == goal).all()  # round(n/K) predicted, as num_predict
        for row in range(3):
            spans = [(int(s), int(m)) for s, m in zip(starts[row], lengths[row]) if m > 0]
            assert all(1 <= m <= max_span for _, m in spans) and sum(m for _, m in spans) <= goal
            sizes = begins[row].diff()  # K·L: each context ends where the next begins
            assert (sizes % k == 0).all() and ((sizes // k >= 1) & (sizes // k <= max_span)).all()
            contexts = torch.cat([begins[row][1:], begins[row][-1:] + k * max_span])
            for (s, m), begin, end in zip(spans, begins[row], contexts):
                assert begin <= s and s + m <= end and s + m <= n  # inside its own context of K·L tokens: disjoint
                assert target[row, s: s + m].all()  # contiguous
            inside = torch.zeros(n, dtype=torch.bool)
            for s, m in spans:
                inside[s: s + m] = True
            singles = (target[row] & ~inside).nonzero().flatten()
            assert len(singles) == goal - int(inside.sum())  # the rest are single tokens topped up


def test_span_lengths_follow_one_over_l_and_spans_cover_one_kth_of_each_context():
    _, _, lengths = sample_spans(6000, 6, 5, 40, draw(0))
    kept = lengths[:, :400].flatten()  # ~457 spans fit in 6000 tokens: the first 400 are whole
    shares = torch.bincount(kept, minlength=6)[1:].float() / len(kept)
    expected = (1.0 / torch.arange(1, 6)) / (1.0 / torch.arange(1, 6)).sum()
    assert (kept > 0).all() and (shares - expected).abs().max() < 0.015  # p(L) ∝ 1/L, as _sample_mask draws
    runs = (span_targets(600, 6, 5, 40, draw(1)).int().diff(dim=-1) == -1).sum(-1).float().mean()
    order = select_targets(factorisation_order(torch.rand(40, 600, generator=draw(2)), 600), 600, 6)
    assert runs < 0.75 * (order.int().diff(dim=-1) == -1).sum(-1).float().mean()  # fewer, longer runs than singles


def test_the_family_pretrains_with_spans_and_both_directions_and_the_objective_default_is_the_order():
    assert FAMILIES["xlnet"].objective_options == {"max_span": 5, "bi_data": True}
    plain = PermutationLM(model(), SPECIALS, k=4)
    spans = PermutationLM(model(), SPECIALS, k=4, max_span=5, bi_data=True)
    windows = torch.randint(5, 40, (64, 2 * 30))
    before, after = (obj.make_batch(windows, [draw(i) for i in range(64)]) for obj in (plain, spans))
    assert "backward" not in before and before["predict"].shape == after["predict"].shape == (64, 2, 8)
    assert torch.equal(before["ids"][..., :30].flatten(1), windows)
    backward = after["backward"]
    assert 16 < int(backward.sum()) < 48  # about half the examples, each drawing its own direction
    for row in range(64):
        text = after["ids"][row, :, :30].flatten()
        assert torch.equal(text, windows[row].flip(0) if backward[row] else windows[row])  # reversed, then cut
        assert (after["ids"][row, :, 30:] == torch.tensor([SPECIALS.sep, SPECIALS.cls])).all()  # still at the end
    assert torch.equal(after["targets"], after["ids"].gather(-1, after["predict"]))
    again = spans.make_batch(windows[5:6], [draw(5)])
    assert all(torch.equal(again[key][0], after[key][5]) for key in again)  # per example, however batched


def test_a_backward_row_gets_the_forward_encodings_of_the_reversed_text():
    """Query i and key j of a backward row are the forward row's T−1−i and T−1−j: R_{−(i−j)} = R_{(T−1−i)−(T−1−j)}."""
    n = 6
    forward = relative_encodings(n, n, 8)[0]
    backward = relative_encodings(n, n, 8, backward=torch.tensor([True]))[0]
    for i in range(n):
        for j in range(n):
            at = n - 1 - (i - j)  # distances() lists n − 1 … −(n − 1)
            mirrored = n - 1 - ((n - 1 - i) - (n - 1 - j))
            torch.testing.assert_close(backward[at], forward[mirrored])
    clamped = relative_encodings(n, n, 8, clamp_len=2, backward=torch.tensor([False, True]))
    assert torch.equal(clamped[0, 0], sinusoids(torch.tensor([2]), 8)[0])  # distance 5 clamped to 2
    assert torch.equal(clamped[1, 0], sinusoids(torch.tensor([-2]), 8)[0])


@pytest.mark.parametrize("clamp_len", [-1, 3])
def test_reading_the_reversed_text_backward_gives_the_forward_states_mirrored(clamp_len):
    net = model(clamp_len)
    ids = torch.randint(5, 40, (2, 9))
    keys = torch.rand(2, 9, generator=draw(3))
    rank = factorisation_order(keys, 9)
    target = select_targets(rank, 9, 3)
    predict = target.nonzero()[:, 1].view(2, -1)
    ranked = torch.where(target, rank, -1)
    content, query = permutation_masks(ranked, predict)
    left = net.streams(ids, content_mask=content, query_mask=query, targets=predict)
    mirrored = predict.flip(1).neg() + 8  # the same targets, counted from the other end, in position order
    content, query = permutation_masks(ranked.flip(1), mirrored)
    right = net.streams(ids.flip(1), content_mask=content, query_mask=query, targets=mirrored,
                        backward=torch.tensor([True, True]))
    for a, b in zip(left.layers, right.layers):
        torch.testing.assert_close(b, a.flip(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(right.query, left.query.flip(1), atol=1e-5, rtol=1e-5)
    unturned = net.streams(ids.flip(1), content_mask=content, query_mask=query, targets=mirrored)
    assert (unturned.layers[-1] - right.layers[-1]).abs().max() > 1e-3  # counted forward, the states differ


def test_same_as_transformers_xlnet_with_bi_data_and_clamp_len():
    """transformers reads the second half of a batch backward under ``bi_data``; sesame the rows ``backward`` marks."""
    transformers = pytest.importorskip("transformers")
    net = model(clamp_len=3, mem_len=4)
    hf = transformers.XLNetModel(transformers.XLNetConfig(
        vocab_size=40, d_model=16, n_layer=2, n_head=2, d_inner=32, dropout=0.0, mem_len=4, layer_norm_eps=1e-12,
        bi_data=True, clamp_len=3)).eval()
    model_fields = {"hidden": 16, "heads": 2, "layers": 2}
    assert not hf.load_state_dict(export_weights(net.state_dict(), model_fields), strict=False).missing_keys
    ids, types = torch.randint(5, 40, (4, 12)), torch.tensor([0] * 6 + [1] * 5 + [2]).expand(4, -1)
    backward = torch.tensor([False, False, True, True])
    keys = torch.rand(4, 12, generator=draw(4))
    rank = factorisation_order(keys, 6)
    target = select_targets(rank, 6, 3)
    predict, ranked = target.nonzero()[:, 1].view(4, -1), torch.where(target, rank, -1)
    memory = [torch.randn(4, 4, 16) for _ in range(2)]
    content, query = permutation_masks(ranked, predict, past=4)
    with torch.no_grad():
        mine = net.streams(ids, types=types, memory=memory, content_mask=content, query_mask=query, targets=predict,
                           backward=backward)
        perm_mask = (target[:, None, :] & (ranked[:, None, :] >= ranked[:, :, None])).float()
        theirs = hf(ids, token_type_ids=types, perm_mask=perm_mask, target_mapping=target_mapping(predict, 12),
                    mems=[m.transpose(0, 1) for m in memory], use_mems=True)
        torch.testing.assert_close(mine.query, theirs.last_hidden_state, atol=1e-5, rtol=1e-5)
        forward_only = net.streams(ids, types=types, memory=memory, content_mask=content, query_mask=query,
                                   targets=predict)
    assert (forward_only.query[2:] - mine.query[2:]).abs().max() > 1e-3  # the backward half reads differently
    torch.testing.assert_close(forward_only.query[:2], mine.query[:2])


def test_a_batch_draws_what_each_example_drew_alone():
    """The batch's targets are worked out for all examples at once (issue 35); each example still makes its draws, in
    the order it made them alone (its orders' keys, its spans, their top-up, its direction), so runs resume as they
    were."""
    obj = PermutationLM(model(), SPECIALS, k=4, max_span=5, bi_data=True)
    windows = torch.randint(5, 40, (16, 2 * 30))
    batch = obj.make_batch(windows, [draw(i) for i in range(16)])
    for i in range(16):
        g = draw(i)
        rank = factorisation_order(torch.rand(2, 30, generator=g), 30)
        target = span_targets(30, 4, 5, 2, g)
        assert bool(batch["backward"][i]) == bool(torch.rand((), generator=g) < 0.5)
        assert batch["predict"][i].tolist() == [row.nonzero().squeeze(1).tolist() for row in target]
        assert torch.equal(batch["rank"][i, :, :30], torch.where(target, rank, -1))
