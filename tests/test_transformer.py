import pytest
import torch

from sesame.models import Transformer, TransformerConfig


def model(causal: bool, norm: str = "post") -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=100, hidden=32, layers=2, heads=4, intermediate=64, max_positions=64,
                            causal=causal, norm=norm, dropout=0.0)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_no_future_token_changes_a_causal_output(norm):
    m = model(causal=True, norm=norm)
    ids = torch.randint(5, 100, (2, 20))
    changed = ids.clone()
    changed[:, 11:] = torch.randint(5, 100, (2, 9))
    a, b = m(ids), m(changed)
    assert torch.allclose(a[:, :11], b[:, :11], atol=1e-6)
    assert not torch.allclose(a[:, 11:], b[:, 11:], atol=1e-4)


def test_gpt2_residual_projections_are_scaled():
    m = model(causal=True, norm="pre")
    std = m.attention[0].out.weight.std().item()
    assert abs(std - 0.02 / 2) < 0.004  # 0.02 / sqrt(2 * layers)


def count(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def albert(embedding_size: int | None = None, sharing: str = "none", layers: int = 4) -> Transformer:
    return Transformer(TransformerConfig(vocab_size=1000, hidden=64, layers=layers, heads=2, intermediate=256,
                                         max_positions=32, type_vocab_size=2, embedding_size=embedding_size,
                                         sharing=sharing, dropout=0.0))


def test_factorised_embedding_parameters_follow_v_e_plus_e_h():
    """ALBERT §3.1: V·H embedding parameters become V·E + E·H (plus E-wide positions, segments, norm)."""
    v, h, e, p, t = 1000, 64, 16, 32, 2
    full, factorised = albert(), albert(embedding_size=e)
    assert count(full) - count(factorised) == (v + p + t) * (h - e) + 2 * (h - e) - (e * h + h)
    assert count(factorised.embed) == (v + p + t) * e + 2 * e and count(factorised.project) == e * h + h


@pytest.mark.parametrize("sharing, attention_copies, ffn_copies", [
    ("none", 4, 4), ("all", 1, 1), ("attention", 1, 4), ("ffn", 4, 1)])
def test_cross_layer_sharing_stores_one_copy_of_each_shared_sublayer(sharing, attention_copies, ffn_copies):
    m = albert(sharing=sharing)
    attention, ffn = count(m.attention[0]), count(m.feed_forward[0])
    assert count(m) == count(m.embed) + attention_copies * attention + ffn_copies * ffn
    assert len(m.state_dict()) == len({id(t) for t in m.state_dict().values()})  # no aliased tensors to save
    deeper = albert(sharing=sharing, layers=8)
    grows = (attention_copies == 4) * 4 * attention + (ffn_copies == 4) * 4 * ffn
    assert count(deeper) - count(m) == grows  # shared sublayers cost nothing per extra layer


def test_all_shared_layers_apply_the_same_function_at_every_depth():
    m = albert(sharing="all").eval()
    layers = m(torch.randint(5, 1000, (1, 6)), all_layers=True)
    again = m.residual(m.feed_forward[0], m.residual(m.attention[0], layers[1], None))
    assert torch.allclose(again, layers[2], atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_banded_mask_pattern(causal):
    m = model(causal=causal)
    band = m.attention_mask(None, 6, window=3)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    expected = ((i - j >= 0) if causal else (i - j).abs() >= 0) & ((i - j).abs() < 3)
    assert torch.equal(band, expected)
    later = m.attention_mask(None, 2, past=4, window=3)  # two new positions over a cache of four
    assert torch.equal(later, expected[4:])


def test_banded_layers_alternate_with_dense_ones():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=100, hidden=32, layers=4, heads=4, intermediate=64, max_positions=64,
                            causal=True, dropout=0.0, attention_window=2)
    m = Transformer(cfg).eval()
    seen = {}
    for i, sublayer in enumerate(m.attention):
        sublayer.register_forward_pre_hook(lambda module, args, i=i: seen.__setitem__(i, args[1]))
    ids = torch.randint(5, 100, (1, 12))
    m(ids)
    assert seen[0] is None and seen[2] is None  # dense: SDPA's own causal mask
    assert torch.equal(seen[1], m.attention_mask(None, 12, window=2)) and torch.equal(seen[3], seen[1])
    dense = Transformer(TransformerConfig(**{**cfg.to_dict(), "attention_window": None})).eval()
    dense.load_state_dict(m.state_dict())
    assert not torch.allclose(m(ids), dense(ids), atol=1e-4)
    wide = Transformer(TransformerConfig(**{**cfg.to_dict(), "attention_window": 64})).eval()
    wide.load_state_dict(m.state_dict())
    assert torch.allclose(wide(ids), dense(ids), atol=1e-5)  # a band wider than the text is dense attention


def test_dropout_does_not_break_a_compiled_graph():
    """sesame's cheaper dropout draws its mask with an in-place integer draw, which torch.compile cannot trace: a
    graph break at every dropout (15 in a tiny BERT step) left compile little to fuse. Compiled, it is F.dropout."""
    import torch._dynamo

    from sesame.models.transformer import dropout

    def block(x: torch.Tensor) -> torch.Tensor:
        return dropout(torch.tanh(dropout(x, 0.1, True)), 0.1, True)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(torch.randn(4, 8))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
