"""ULMFiT's fine-tuning recipes: slanted triangular rates, discriminative rates, gradual unfreezing."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sesame.models import Transformer, TransformerConfig
from sesame.tasks.classify import Classifier
from sesame.train.optim import adamw, slanted_triangular
from sesame.train.recipes import discriminative_param_groups, gradual_unfreezing, layer_groups

LAYERS = 3
CONFIGS = {
    "bert": {},
    "gpt2": {"norm": "pre", "causal": True},  # a final LayerNorm, in the top layer's group
    "albert": {"embedding_size": 16, "sharing": "all"},
    "shared-attention": {"sharing": "attention"},
    "shared-ffn": {"sharing": "ffn"},
    "factorised": {"embedding_size": 16},
}


def classifier(**config) -> Classifier:
    torch.manual_seed(0)
    backbone = Transformer(TransformerConfig(vocab_size=100, hidden=32, layers=LAYERS, heads=2, intermediate=64,
                                             **config))
    return Classifier(backbone, 3, "cls")


def ids(*modules: nn.Module | None) -> set[int]:
    return {id(p) for m in modules if m is not None for p in m.parameters()}


# -- slanted triangular learning rates ---------------------------------------------------------

@pytest.mark.parametrize("cut_frac, ratio", [(0.1, 32.0), (0.25, 10.0)])
def test_stlr_rises_to_one_at_the_cut_then_falls_linearly(cut_frac, ratio):
    def f(x: float) -> float:
        return slanted_triangular(x, cut_frac, ratio)

    assert f(0.0) == f(1.0) == 1 / ratio
    assert f(cut_frac) == 1.0
    grid = [i / 1000 for i in range(1001)]
    assert max(grid, key=f) == cut_frac
    for (a, b), sign in (((0.0, cut_frac), 1), ((cut_frac, 1.0), -1)):
        xs = [a + (b - a) * i / 10 for i in range(11)]
        steps = [f(y) - f(x) for x, y in zip(xs, xs[1:])]
        assert steps == pytest.approx([steps[0]] * 10) and sign * steps[0] > 0


def eq3(t: int, T: int, cut_frac: float, ratio: float) -> float:
    """ULMFiT eq. 3, as written, with integer steps."""
    cut = math.floor(T * cut_frac)
    p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
    return (1 + p * (ratio - 1)) / ratio


@pytest.mark.parametrize("T, cut_frac, ratio", [(1000, 0.1, 32.0), (1005, 0.1, 32.0), (37, 0.25, 10.0),
                                                 (203, 0.3, 32.0)])
def test_stlr_is_eq3_up_to_the_floor(T, cut_frac, ratio):
    # the floor moves the cut down by δ < 1 step; p then differs by at most δ / ((1 − cut_frac)·cut)
    cut = math.floor(T * cut_frac)
    delta = T * cut_frac - cut
    bound = (ratio - 1) / ratio * delta / ((1 - cut_frac) * cut) + 1e-12
    for t in range(T + 1):
        assert abs(slanted_triangular(t / T, cut_frac, ratio) - eq3(t, T, cut_frac, ratio)) <= bound


# -- layer groups and discriminative learning rates --------------------------------------------

@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_layer_groups_hold_each_parameter_once_bottom_to_top(config):
    model = classifier(**config)
    b = model.backbone
    groups = layer_groups(model, b)
    listed = [id(p) for params in groups for p in params]
    assert sorted(listed) == sorted(id(p) for p in model.parameters())  # each parameter exactly once
    expected = [ids(b.embed, b.project)]
    for layer in range(1, LAYERS + 1):
        top = layer == LAYERS
        owned = [stack[layer - 1] if len(stack) == LAYERS else stack[0] if top else None
                 for stack in (b.attention, b.feed_forward)]  # a shared sublayer: the top layer's
        expected.append(ids(*owned, b.final_norm if top else None))
    expected.append(ids(model.pooler, model.head))
    assert [{id(p) for p in params} for params in groups] == expected


def test_layer_groups_refuse_a_backbone_parameter_they_cannot_place():
    model = classifier()
    model.backbone.relative_bias = nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="relative_bias"):
        layer_groups(model, model.backbone)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_discriminative_rates_fall_by_the_factor_per_group_down_from_the_head(config):
    model = classifier(**config)
    groups = layer_groups(model, model.backbone)
    group_of = {id(p): g for g, params in enumerate(groups) for p in params}
    param_groups = discriminative_param_groups(groups, 1e-3, 0.01, 2.6)
    listed = [id(p) for d in param_groups for p in d["params"]]
    assert sorted(listed) == sorted(id(p) for p in model.parameters())
    rates = {}
    for d in param_groups:
        (g,) = {group_of[id(p)] for p in d["params"]}  # one layer group per dict
        assert d["lr"] == d["base_lr"] == 1e-3 / 2.6 ** (LAYERS + 1 - g)
        assert all((p.ndim >= 2) == (d["weight_decay"] == 0.01) for p in d["params"])
        assert d["weight_decay"] in (0.01, 0.0)
        rates[g] = d["lr"]
    assert rates[LAYERS + 1] == 1e-3 and rates[0] == 1e-3 / 2.6 ** 4
    uniform = discriminative_param_groups(groups, 1e-3, 0.01, 1.0)
    assert {d["lr"] for d in uniform} == {1e-3}


def test_adamw_takes_prebuilt_groups_and_keeps_its_default():
    model = classifier()
    param_groups = discriminative_param_groups(layer_groups(model, model.backbone), 1e-3, 0.01)
    optimizer = adamw(param_groups, 1e-3, 0.01)
    assert [(g["lr"], g["base_lr"], g["weight_decay"]) for g in optimizer.param_groups] == [
        (d["lr"], d["base_lr"], d["weight_decay"]) for d in param_groups]
    default = adamw(model, 1e-3, 0.01)
    assert [(g["lr"], g["base_lr"], g["weight_decay"]) for g in default.param_groups] == [(1e-3, 1e-3, 0.01),
                                                                                          (1e-3, 1e-3, 0.0)]
    assert [{p.ndim >= 2 for p in g["params"]} for g in default.param_groups] == [{True}, {False}]
    assert optimizer.defaults["fused"] and default.defaults["fused"]


# -- gradual unfreezing ------------------------------------------------------------------------

@pytest.mark.parametrize("config", [CONFIGS["bert"], CONFIGS["albert"]], ids=["bert", "albert"])
def test_gradual_unfreezing_trains_only_the_top_groups(config, one_thread):
    model = classifier(**config)
    groups = layer_groups(model, model.backbone)
    optimizer = adamw(discriminative_param_groups(groups, 1e-2, 0.1), 1e-2, 0.1)  # decay must spare the frozen
    generator = torch.Generator().manual_seed(0)
    batch = {"ids": torch.randint(1, 100, (4, 8), generator=generator), "padding": torch.ones(4, 8, dtype=torch.bool),
             "targets": torch.tensor([0, 1, 2, 0])}
    for epoch in range(len(groups) + 1):
        trainable = gradual_unfreezing(groups, epoch)
        unfrozen = {id(p) for g, params in enumerate(groups) if g >= len(groups) - 1 - epoch for p in params}
        assert {id(p) for p in model.parameters() if p.requires_grad} == unfrozen
        assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
        before = [p.detach().clone() for p in model.parameters()]
        model(batch).backward()
        assert [p.grad is not None for p in model.parameters()] == [id(p) in unfrozen for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        moved = [not torch.equal(p, old) for p, old in zip(model.parameters(), before)]
        assert moved == [id(p) in unfrozen for p in model.parameters()]
    assert unfrozen == {id(p) for p in model.parameters()}


def test_finetune_applies_the_recipes_end_to_end(corpus, labeled, tmp_path, one_thread):
    """Through sesame.finetune: one epoch of gradual unfreezing moves only the head; STLR shapes the logged
    rates; discriminative rates put the embeddings 2.6^(layers + 1) below the head; config.json records it all."""
    import json

    import sesame
    from sesame.train.checkpoint import load_weights

    pre = tmp_path / "pre"
    sesame.pretrain([str(corpus)], str(pre), family="bert", objective="mlm", size="tiny", vocab_size=200, seq_len=32,
                    batch_size=8, max_steps=4, progress=False)
    train, dev = labeled
    common = dict(train=str(train), dev=str(dev), batch_size=8, max_length=32, progress=False)
    sesame.finetune(str(pre), out=str(tmp_path / "frozen"), epochs=1, gradual_unfreezing=True, **common)
    before, after = load_weights(pre / "model.safetensors"), load_weights(tmp_path / "frozen/model.safetensors")
    assert all(torch.equal(after[name], value) for name, value in before.items() if name.startswith("backbone."))

    run = tmp_path / "stlr"
    sesame.finetune(str(pre), out=str(run), epochs=2, lr=1e-3, schedule="stlr", warmup=0.25, stlr_ratio=8,
                    discriminative=2.6, eval_every=1, **common)
    config = json.loads((run / "config.json").read_text())
    assert config["recipe"] == {"discriminative": 2.6, "gradual_unfreezing": False}
    assert config["train"]["schedule"] == "stlr"
    logged = [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    embeddings_peak = 1e-3 / 2.6 ** 3  # tiny: 2 layers, so the embeddings sit 3 groups below the head
    assert max(logged) <= embeddings_peak * (1 + 1e-9) and logged[-1] < embeddings_peak / 4
