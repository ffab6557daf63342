import pytest
import torch

from sesame.models import Transformer, TransformerConfig
from sesame.train.checkpoint import load_weights, save_weights


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


def test_a_bidirectional_output_sees_the_future():
    m = model(causal=False)
    ids = torch.randint(5, 100, (2, 20))
    changed = ids.clone()
    changed[:, 15] = (ids[:, 15] + 1) % 100
    assert not torch.allclose(m(ids)[:, 0], m(changed)[:, 0], atol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_does_not_change_real_positions(causal):
    m = model(causal)
    ids = torch.randint(5, 100, (1, 12))
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    mask = torch.arange(17)[None] < 12
    assert torch.allclose(m(ids), m(padded, padding=mask)[:, :12], atol=1e-5)


def test_save_load_round_trip(tmp_path):
    m = model(causal=False)
    save_weights(tmp_path / "model.safetensors", m.state_dict())
    twin = Transformer(m.config).eval()
    twin.load_state_dict(load_weights(tmp_path / "model.safetensors"))
    ids = torch.randint(5, 100, (3, 10))
    assert torch.equal(m(ids), twin(ids))


def test_all_layers():
    layers = model(causal=False)(torch.randint(5, 100, (1, 6)), all_layers=True)
    assert len(layers) == 3 and layers[0].shape == (1, 6, 32)


def test_gpt2_residual_projections_are_scaled():
    m = model(causal=True, norm="pre")
    std = m.attention[0].out.weight.std().item()
    assert abs(std - 0.02 / 2) < 0.004  # 0.02 / sqrt(2 * layers)
