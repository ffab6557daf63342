"""Fine-tuning recipes: ULMFiT's slanted triangular rates, discriminative rates and gradual unfreezing;
Houlsby adapters; ELMo's scalar mix over frozen features; GPT's auxiliary LM loss; re-initialised top layers."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from sesame.models import Transformer, TransformerConfig
from sesame.models.additions import Additions
from sesame.tasks.classify import SequenceModel
from sesame.train.optim import adamw, slanted_triangular
from sesame.errors import SesameError
from sesame.models import ElmoConfig
from sesame.train.recipes import (TableRate, discriminative_param_groups, gradual_unfreezing, layer_groups,
                                   train_only)

from .conftest import refused

LAYERS = 3
CONFIGS = {
    "bert": {},
    "gpt2": {"norm": "pre", "causal": True},  # a final LayerNorm, in the top layer's group
    "albert": {"embedding_size": 16, "sharing": "all"},
    "shared-attention": {"sharing": "attention"},
    "shared-ffn": {"sharing": "ffn"},
    "factorised": {"embedding_size": 16},
}


def classifier(additions: Additions = Additions(), **config) -> SequenceModel:
    torch.manual_seed(0)
    backbone = Transformer(TransformerConfig(vocab_size=100, hidden=32, layers=LAYERS, heads=2, intermediate=64,
                                             **config))
    return SequenceModel(additions.insert(backbone), 3, "cls")


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
                    discriminative=2.6, **common)
    config = json.loads((run / "config.json").read_text())
    assert config["recipe"] == {"discriminative": 2.6, "gradual_unfreezing": False, "adapters": None,
                                "features": False, "lm_weight": 0.0, "vectors": None, "reinit_layers": 0,
                                "embedding_rate": 1.0}
    assert config["train"]["schedule"] == "stlr"
    logged = [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    embeddings_peak = 1e-3 / 2.6 ** 3  # tiny: 2 layers, so the embeddings sit 3 groups below the head
    assert max(logged) <= embeddings_peak * (1 + 1e-9) and logged[-1] < embeddings_peak / 4


# -- adapters, frozen features, auxiliary LM -------------------------------------------------------

def test_adapters_start_near_the_identity_and_train_alone_with_norms_and_head():
    """Houlsby et al. 2019: the adapted network starts as the pre-trained one; only adapters, LayerNorms
    and the head train."""
    plain = classifier().eval()
    adapted = classifier(Additions(adapter_size=4)).eval()
    adapted.load_state_dict(plain.state_dict(), strict=False)  # the same pre-trained weights
    batch = {"ids": torch.randint(5, 100, (2, 9)), "padding": torch.ones(2, 9, dtype=torch.bool)}
    hidden = [m.backbone(batch["ids"]) for m in (plain, adapted)]
    assert (hidden[0] - hidden[1]).abs().max() < 1e-3 and not torch.equal(hidden[0], hidden[1])
    trainable = train_only(adapted, adapted.backbone, "adapters")
    names = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert names and all(".adapter." in n or ".norm." in n or not n.startswith("backbone.") for n in names)
    assert sum(".adapter." in n for n in names) == 4 * 2 * LAYERS  # down/up weight/bias, attention and ffn
    assert trainable == sum(adapted.get_parameter(n).numel() for n in names) < 0.2 * sum(
        p.numel() for p in adapted.parameters())


def test_scalar_mix_is_gamma_times_softmax_weighted_layers_and_only_it_trains():
    """ELMo (Peters et al. 2018, eq. 1) over a frozen backbone."""
    model = classifier(Additions(scalar_mix=True)).eval()
    mix = model.backbone.mix
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
        mix.gamma.fill_(1.7)
    ids = torch.randint(5, 100, (2, 7))
    layers = model.backbone(ids, all_layers=True)
    weights = torch.softmax(torch.tensor([0.5, -1.0, 2.0, 0.0]), 0)
    expected = 1.7 * sum(w * h for w, h in zip(weights, layers))
    assert torch.allclose(model.backbone(ids), expected, atol=1e-6)
    train_only(model, model.backbone, "features")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"backbone.mix.scalars", "backbone.mix.gamma", "pooler.0.weight", "pooler.0.bias",
                         "head.weight", "head.bias"}


def test_auxiliary_lm_adds_the_next_token_loss_of_the_task_inputs():
    """GPT (Radford et al. 2018, eq. 5): L = L_task + λ·L_LM from the same forward pass."""
    import torch.nn.functional as F

    from sesame.errors import SesameError
    from sesame.train.auxiliary_lm import add_auxiliary_lm, next_tokens

    model = classifier(causal=True, dropout=0.0)
    model.pooling = "last"
    add_auxiliary_lm(model, 0.5)
    ids = torch.randint(5, 100, (2, 6))
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    batch = {"ids": ids, "padding": padding, "targets": torch.tensor([0, 2])}
    model.train()
    out = model(batch)
    logits = model.backbone(ids, padding=padding) @ model.backbone.embed.tokens.weight.t()
    real = next_tokens(padding)
    assert real.sum() == 5 + 3
    assert torch.allclose(out["lm"], F.cross_entropy(logits[:, :-1][real], ids[:, 1:][real], reduction="sum"),
                          atol=1e-4)
    assert model.part_weights == {"lm": 0.5} and out["loss"].ndim == 0
    model.eval()
    assert isinstance(model(batch), torch.Tensor)  # evaluation: the task loss alone
    with pytest.raises(SesameError, match="causal backbone"):
        add_auxiliary_lm(classifier(), 0.5)


def test_finetune_with_adapters_features_and_lm_end_to_end(corpus, labeled, tmp_path, one_thread):
    """The recipes through sesame.finetune: frozen weights stay put, config.json records the recipe,
    the run reloads for prediction, and the parameter counts are reported."""
    import sesame
    from sesame.train.checkpoint import load_weights

    train, dev = labeled
    common = dict(train=str(train), dev=str(dev), batch_size=8, max_length=32, epochs=1, lr=1e-3, progress=False)
    for family in ("bert", "gpt"):
        pre = tmp_path / family
        sesame.pretrain([str(corpus)], str(pre), family=family, objective="mlm" if family == "bert" else None,
                        size="tiny", vocab_size=200, seq_len=32, batch_size=8, max_steps=4, progress=False)
        before = load_weights(pre / "model.safetensors")
        for name, recipe in (("adapters", {"adapters": 8}), ("features", {"features": True})):
            run = tmp_path / f"{family}-{name}"
            result = sesame.finetune(str(pre), out=str(run), **recipe, **common)
            after = load_weights(run / "model.safetensors")
            assert all(torch.equal(after[k][: len(v)], v) for k, v in before.items()  # gpt adds 3 token rows
                       if k.startswith("backbone.") and ".norm." not in k)
            assert 0 < result["trainable_parameters"] < result["parameters"] / 5
            assert len(sesame.load(run).predict(["The cat sleeps."])) == 1
            # λ unset: GPT's own 0.5 (Radford et al. 2018, §4.1) where the backbone trains; off for BERT
            lm_weight = json.loads((run / "config.json").read_text())["recipe"]["lm_weight"]
            assert lm_weight == (0.5 if (family, name) == ("gpt", "adapters") else 0.0), (family, name)
    result = sesame.finetune(str(tmp_path / "gpt"), out=str(tmp_path / "gpt-lm"), lm_weight=0.0, **common)
    assert result["trainable_parameters"] == result["parameters"]
    assert json.loads((tmp_path / "gpt-lm/config.json").read_text())["recipe"]["lm_weight"] == 0.0  # given: kept


# -- re-initialised top layers ---------------------------------------------------------------------

def test_reinit_layers_start_the_top_layers_and_pooler_as_the_scratch_twin_does(tiny_runs, tmp_path, one_thread):
    """Zhang et al. 2021, §5: with --reinit-layers 1 the top layer and the [CLS] pooler start as the scratch twin of
    the same seed starts them, the lower layer and the embeddings from the pretrained run (a rate of 1e-12 keeps
    every weight within 1e-9 of where it started)."""
    import sesame
    from sesame.train.checkpoint import load_weights

    pre = tiny_runs / "pre"
    common = dict(train=str(tiny_runs / "train.csv"), dev=str(tiny_runs / "dev.csv"), epochs=1, lr=1e-12,
                  batch_size=16, max_length=32, seed=3, progress=False)
    sesame.finetune(str(pre), out=str(tmp_path / "reinit"), reinit_layers=1, **common)
    sesame.finetune(f"scratch:{pre}", out=str(tmp_path / "twin"), **common)
    started = load_weights(tmp_path / "reinit/model.safetensors")
    twin, pretrained = load_weights(tmp_path / "twin/model.safetensors"), load_weights(pre / "model.safetensors")
    top = ("backbone.attention.1.", "backbone.feed_forward.1.", "pooler.")  # tiny: 2 layers
    for name, value in started.items():
        if not name.startswith(("backbone.", "pooler.")):
            continue
        source = twin if name.startswith(top) else pretrained
        assert torch.allclose(value, source[name], atol=1e-9), name
        if name.startswith(top) and name in pretrained and value.dim() == 2:
            assert not torch.allclose(value, pretrained[name], atol=1e-3), name
    assert json.loads((tmp_path / "reinit/config.json").read_text())["recipe"]["reinit_layers"] == 1


@pytest.mark.parametrize("flags, expected", [
    (["--reinit-layers", "3"], ("--reinit-layers 3", "2 layers", "at most 2")),
    (["--reinit-layers", "-1"], ("--reinit-layers -1",)),
    (["--reinit-layers", "1", "--adapters", "8"], ("--reinit-layers", "--adapters")),
])
def test_reinit_layers_beyond_the_backbone_or_with_a_frozen_one_are_refused(tiny_runs, tmp_path, capsys, flags,
                                                                           expected):
    argv = ["finetune", "--from", str(tiny_runs / "pre"), "--train", str(tiny_runs / "train.csv"), "--dev",
            str(tiny_runs / "dev.csv"), "--out", str(tmp_path / "new"), *flags]
    refused(argv, capsys, tmp_path, *expected)
    assert not (tmp_path / "new").exists()


# -- the token table's share of the rate ------------------------------------------------------------

def test_embedding_rate_0_keeps_the_token_table_as_it_started_while_the_rest_trains(tiny_runs, tmp_path, one_thread):
    """--embedding-rate 0: fine-tuning leaves the table exactly as the pretrained run has it; the layers move."""
    import sesame
    from sesame.train.checkpoint import load_weights

    pre = tiny_runs / "pre"
    sesame.finetune(str(pre), str(tiny_runs / "train.csv"), str(tiny_runs / "dev.csv"), str(tmp_path / "kept"),
                    embedding_rate=0, epochs=1, lr=1e-3, batch_size=16, max_length=32, progress=False)
    before, after = load_weights(pre / "model.safetensors"), load_weights(tmp_path / "kept/model.safetensors")
    table = "backbone.embed.tokens.weight"
    assert torch.equal(after[table], before[table])
    assert not torch.allclose(after["backbone.attention.0.qkv.weight"], before["backbone.attention.0.qkv.weight"])
    assert json.loads((tmp_path / "kept/config.json").read_text())["recipe"]["embedding_rate"] == 0


def test_an_embedding_rate_share_puts_the_table_alone_at_that_share_of_its_group_s_rate():
    model = classifier()
    groups = TableRate(share=0.25).param_groups(model, lr=1e-3, weight_decay=0.01)
    table = model.backbone.embed.tokens.weight
    own = [g for g in groups if any(p is table for p in g["params"])]
    assert len(own) == 1 and own[0]["params"] == [table]
    assert own[0]["lr"] == own[0]["base_lr"] == pytest.approx(2.5e-4) and own[0]["weight_decay"] == 0.01
    assert {g["lr"] for g in groups if g is not own[0]} == {1e-3}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_embedding_rate_refuses_a_model_without_a_token_table():
    with pytest.raises(SesameError, match="--embedding-rate: elmo"):
        TableRate(share=0).configure(ElmoConfig(vocab_size=50), source="elmo")


@pytest.mark.parametrize("flags, expected", [
    (["--embedding-rate", "0", "--discriminative", "2.6"], ("--embedding-rate", "--discriminative")),
    (["--embedding-rate", "-1"], ("--embedding-rate",)),
])
def test_embedding_rate_with_other_rates_or_below_0_is_refused(tiny_runs, tmp_path, capsys, flags, expected):
    argv = ["finetune", "--from", str(tiny_runs / "pre"), "--train", str(tiny_runs / "train.csv"), "--dev",
            str(tiny_runs / "dev.csv"), "--out", str(tmp_path / "new"), *flags]
    refused(argv, capsys, tmp_path, *expected)
    assert not (tmp_path / "new").exists()
