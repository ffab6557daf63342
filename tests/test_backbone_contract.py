"""The contract every backbone of ``sesame.models.ARCHITECTURES`` honours, as one battery run over a tiny model of
each (after transformers' ``ModelTesterMixin``): shapes and ``all_layers``, what a position sees (padding, the
future), tied output layers, the config's JSON round trip, state-dict names and a safetensors round trip, eval
determinism, gradients reaching every parameter, and device and dtype following the module.

A new architecture proves itself here: add its tiny cases to ``CASES`` (the suite fails until every architecture
has one) and its state-dict names to ``fixtures/backbone_state_dicts.json`` (the test below prints them). What is
particular to one architecture (T5's buckets, XLNet's streams, AWD-LSTM's dropouts) stays in its own test file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

from sesame.models import (ARCHITECTURES, CoveConfig, ElmoConfig, EncoderDecoderConfig, RecurrentConfig,
                           TransformerConfig, XLNetConfig, build_model, model_config, position_limit)
from sesame.models.additions import Additions, takes_additions
from sesame.models.encoder_decoder import STYLES
from sesame.train.checkpoint import load_weights, save_weights

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, LENGTH, SHORT, CHANGED_FROM = 50, 12, 7, 6  # SHORT: the padded row's real tokens
NAMES = Path(__file__).resolve().parent / "fixtures" / "backbone_state_dicts.json"

# -- how each architecture is read -------------------------------------------------------------------------------
# A view: (model, ids, padding) → the tensors a position's outputs are, (batch, time, ...) each, for the padding
# and causality checks. A backbone is read as ``model(ids, types=, padding=, all_layers=)``; an encoder-decoder as
# its encoder (the source) and its decoder (teacher-forced logits of decoder ids after one fixed source).
View = Callable[[nn.Module, torch.Tensor, torch.Tensor | None], list[torch.Tensor]]


def layers_and_output(model: nn.Module, ids: torch.Tensor, padding: torch.Tensor | None) -> list[torch.Tensor]:
    return [*model(ids, padding=padding, all_layers=True), model(ids, padding=padding)]


def encoder_layers(model: nn.Module, ids: torch.Tensor, padding: torch.Tensor | None) -> list[torch.Tensor]:
    return model.encoder_layers(ids, padding)


def source(batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One right-padded source, the same for every row, for the decoder view."""
    ids = torch.arange(3, 12, device=device)[None].expand(batch, -1)
    return ids, (torch.arange(9, device=device) < 8)[None].expand(batch, -1)


def decoder_logits(model: nn.Module, ids: torch.Tensor, padding: torch.Tensor | None) -> list[torch.Tensor]:
    src, src_padding = source(ids.shape[0], ids.device)
    return [model(src, padding=src_padding, decoder_ids=ids, decoder_padding=padding)]


def states(model: nn.Module, ids: torch.Tensor, types: torch.Tensor | None = None) -> torch.Tensor:
    """The states a task head reads, (batch, time, ``config.hidden``)."""
    if isinstance(model.config, EncoderDecoderConfig):
        return model.encode(ids).states
    return model(ids, types=types)


def all_layers(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    if isinstance(model.config, EncoderDecoderConfig):
        return model.encoder_layers(ids)
    return model(ids, all_layers=True)


# Everything a model computes in training, one scalar (a fixed random projection of each output, as a sum of
# normalised states has no gradient), so that every parameter should get a gradient from it.
def projected(*outputs: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return sum((x * torch.randn(x.shape, generator=g, dtype=x.dtype)).sum() for x in outputs)


def read_all(model, ids, types):
    return projected(model(ids, types=types))


def translate(model, ids, types):  # CoVe: the encoder, and the decoder teacher-forced into its softmax
    return projected(model.out(model.teacher_forced(ids, torch.ones_like(ids, dtype=torch.bool), ids[:, :6])))


def seq2seq(model, ids, types):
    return projected(model(ids, decoder_ids=model.decoder_inputs(ids[:, :6])))


def two_streams(model, ids, types):  # XLNet: the content and query streams, segments compared
    b, t = ids.shape
    targets = torch.tensor([[1, 4]]).expand(b, -1)
    query = torch.ones(b, 2, t, dtype=torch.bool).scatter(2, targets[:, :, None], False)
    out = model.streams(ids, types=types, content_mask=torch.ones(b, t, t, dtype=torch.bool), query_mask=query,
                        targets=targets)
    return projected(out.layers[-1], out.query)


@dataclass(frozen=True)
class Case:
    """A tiny model of one architecture: its config, the views of what it reads, the scalar that exercises every
    parameter, and what ties its output layer to its token table (None: nothing)."""

    name: str
    config: object
    views: dict[str, tuple[View, bool]] = field(default_factory=lambda: {"states": (layers_and_output, False)})
    exercise: Callable = read_all
    tied: Callable[[nn.Module], tuple[torch.Tensor, torch.Tensor]] | None = None
    prepare: Callable[[nn.Module], None] = lambda model: None  # what a run sets after building (ELMo's spellings)
    backbone: Callable[[nn.Module], nn.Module] = lambda model: model  # the part a task model reads (CoVe's encoder)

    @property
    def arch(self) -> str:
        return self.config.to_dict().get("arch", "transformer")

    def build(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        model = build_model(self.config.to_dict())
        self.prepare(model)
        return model.eval()


def spell(model: nn.Module) -> None:
    model.set_vocabulary(["<pad>"] + [f"w{i}" * (i % 3 + 1) for i in range(1, VOCAB)], [0])


def tiny_transformer(**fields) -> TransformerConfig:
    return TransformerConfig(**{"vocab_size": VOCAB, "hidden": 16, "layers": 2, "heads": 2, "intermediate": 32,
                                "max_positions": 16, "dropout": 0.1, **fields})


def tiny_seq2seq(style: str) -> EncoderDecoderConfig:
    relative = {"relative_buckets": 8, "relative_max_distance": 16} if style.startswith("t5") else {}
    return EncoderDecoderConfig(**{"vocab_size": VOCAB, "hidden": 16, "layers": 2, "decoder_layers": 1, "heads": 2,
                                   "intermediate": 32, "max_positions": 16, "dropout": 0.1, **STYLES[style],
                                   **relative})


CAUSAL = {"states": (layers_and_output, True)}
SEQ2SEQ_VIEWS = {"encoder": (encoder_layers, False), "decoder": (decoder_logits, True)}


def output_layer(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return model.output_weight, model.embed.tokens.weight


CASES = [
    Case("bert", tiny_transformer()),
    Case("gpt2-banded", tiny_transformer(causal=True, norm="pre", activation="gelu_tanh", attention_window=3),
         CAUSAL),
    Case("albert", tiny_transformer(embedding_size=8, sharing="all")),
    Case("awd-lstm", RecurrentConfig(vocab_size=VOCAB, embedding_size=8, hidden_size=12, layers=2, tied=True,
                                     dropout=0.1, embedding_dropout=0.1, input_dropout=0.1, hidden_dropout=0.1,
                                     weight_dropout=0.1), CAUSAL),
    Case("bigru", RecurrentConfig(vocab_size=VOCAB, cell="gru", causal=False, embedding_size=8, hidden_size=12,
                                  layers=2, dropout=0.1)),
    Case("elmo", ElmoConfig(vocab_size=VOCAB, max_chars=10, char_embedding=4, filters=[[1, 4], [2, 4], [3, 8]],
                            highways=1, projection=8, cell=16, layers=2, dropout=0.1), prepare=spell),
    Case("cove", CoveConfig(vocab_size=VOCAB, target_vocab_size=VOCAB, embedding_size=8, hidden_size=6, dropout=0.1),
         exercise=translate, backbone=lambda model: model.encoder),
    Case("t5", tiny_seq2seq("t5"), SEQ2SEQ_VIEWS, seq2seq, output_layer),
    Case("t5v1_1", tiny_seq2seq("t5v1_1"), SEQ2SEQ_VIEWS, seq2seq),
    Case("bart", tiny_seq2seq("bart"), SEQ2SEQ_VIEWS, seq2seq, output_layer),
    Case("xlnet", XLNetConfig(vocab_size=VOCAB, hidden=16, layers=2, heads=2, intermediate=32, dropout=0.1,
                              mem_len=8), exercise=two_streams),
]
ALL = pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
VIEWS = pytest.mark.parametrize("case, view", [(case, view) for case in CASES for view in case.views],
                                ids=lambda x: x.name if isinstance(x, Case) else x)


def ids_of(shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    """Ordinary tokens (not the pad, id 0)."""
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def test_every_architecture_has_a_tiny_case():
    assert {case.arch for case in CASES} == set(ARCHITECTURES), "give every architecture a tiny Case in CASES"
    for case in CASES:
        config_class, module_class = ARCHITECTURES[case.arch]
        assert type(case.config) is config_class and type(case.build()) is module_class


@ALL
def test_the_config_round_trips_through_json(case):
    recorded = json.loads(json.dumps(case.config.to_dict()))  # as config.json holds it
    assert model_config(recorded) == case.config
    assert recorded.get("arch", "transformer") == case.arch  # the dict names its own architecture


@pytest.mark.parametrize("case", [c for c in CASES if hasattr(c.config, "embedding_std")], ids=lambda c: c.name)
def test_embedding_std_draws_the_token_table_alone(case):
    """``embedding_std`` (a Transformer's, an encoder-decoder's, XLNet's) is the token table's initial scale and
    changes no other weight's first draw."""
    plain, scaled = case.build(), Case(case.name, replace(case.config, embedding_std=0.5)).build()
    table = "embed.tokens.weight"
    assert abs(scaled.state_dict()[table].std().item() - 0.5) < 0.05
    assert all(torch.equal(value, scaled.state_dict()[name]) for name, value in plain.state_dict().items()
               if name != table and not torch.equal(value, plain.state_dict()[table]))  # (a tied output: the table)


@ALL
def test_states_and_every_layer_have_the_documented_shapes(case):
    model, ids = case.build(), ids_of((2, LENGTH))
    types = torch.zeros_like(ids).index_fill_(1, torch.arange(SHORT, LENGTH), 1)  # task heads pass segment ids
    out = states(model, ids, types)
    assert out.shape == (2, LENGTH, model.config.hidden) and out.dtype == torch.float32
    layers = all_layers(model, ids)
    assert len(layers) == model.config.layers + 1
    assert all(layer.shape[:2] == (2, LENGTH) for layer in layers)
    torch.testing.assert_close(layers[-1], states(model, ids), rtol=0, atol=0)  # no scalar mix: the top layer


@pytest.mark.parametrize("case", [c for c in CASES if c.arch == "encoder_decoder"], ids=lambda case: case.name)
def test_an_encoder_decoder_scores_the_vocabulary_at_every_decoder_position(case):
    model = case.build()
    logits = model(ids_of((2, LENGTH)), decoder_ids=ids_of((2, 5), seed=2))
    assert logits.shape == (2, 5, VOCAB)


@VIEWS
def test_padding_changes_no_real_position(case, view):
    """A right-padded row's real positions are those of the row alone, whatever the padded positions hold, and
    the padding changes nothing in the row beside it."""
    model, (read, _) = case.build(), case.views[view]
    ids = ids_of((2, LENGTH))
    padding = torch.ones(2, LENGTH, dtype=torch.bool)
    padding[1, SHORT:] = False
    other_pads = ids.clone()
    other_pads[1, SHORT:] = ids_of((LENGTH - SHORT,), seed=3)
    with torch.no_grad():
        padded, other = read(model, ids.masked_fill(~padding, 0), padding), read(model, other_pads, padding)
        alone, full = read(model, ids[1:, :SHORT], None), read(model, ids[:1], None)
    for together, garbage, short, first in zip(padded, other, alone, full, strict=True):
        torch.testing.assert_close(together[1, :SHORT], short[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(garbage[1, :SHORT], together[1, :SHORT], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together[0], first[0], atol=1e-5, rtol=1e-5)


@VIEWS
def test_a_causal_position_sees_no_later_token_and_a_bidirectional_one_does(case, view):
    model, (read, causal) = case.build(), case.views[view]
    ids = ids_of((2, LENGTH))
    changed = ids.clone()
    changed[:, CHANGED_FROM:] = ids_of((2, LENGTH - CHANGED_FROM), seed=4)
    with torch.no_grad():
        before, after = read(model, ids, None)[-1], read(model, changed, None)[-1]
    assert not torch.allclose(before[:, CHANGED_FROM:], after[:, CHANGED_FROM:], atol=1e-4)
    if causal:
        torch.testing.assert_close(before[:, :CHANGED_FROM], after[:, :CHANGED_FROM], atol=1e-6, rtol=1e-6)
    else:
        assert not torch.allclose(before[:, :CHANGED_FROM], after[:, :CHANGED_FROM], atol=1e-4)


@ALL
def test_eval_is_deterministic_and_training_draws_dropout(case):
    model, ids = case.build(), ids_of((2, LENGTH))
    with torch.no_grad():
        assert torch.equal(states(model, ids), states(model, ids))
        model.train()
        assert not torch.equal(states(model, ids), states(model, ids))


@ALL
def test_every_parameter_gets_a_gradient(case):
    model, ids = case.build().train(), ids_of((2, LENGTH))
    types = torch.zeros_like(ids).index_fill_(1, torch.arange(SHORT, LENGTH), 1)
    case.exercise(model, ids, types).backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and
               (p.grad is None or not bool(p.grad.abs().sum() > 0))]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize("case", [c for c in CASES if c.tied], ids=lambda case: case.name)
def test_a_tied_output_layer_is_the_token_table_stored_once(case, tmp_path):
    model = case.build()
    output, table = case.tied(model)
    assert output is table
    save_weights(tmp_path / "model.safetensors", model.state_dict())  # safetensors refuses a tensor stored twice
    twin = case.build(seed=1)
    twin.load_state_dict(load_weights(tmp_path / "model.safetensors"))
    output, table = case.tied(twin)
    assert output is table and torch.equal(table, case.tied(model)[1])


@ALL
def test_weights_round_trip_through_safetensors_into_a_model_built_from_the_config(case, tmp_path):
    model = case.build()
    save_weights(tmp_path / "model.safetensors", model.state_dict())
    twin = build_model(json.loads(json.dumps(case.config.to_dict()))).eval()  # as a run is loaded: no prepare
    fresh = {name: (tuple(t.shape), t.dtype) for name, t in twin.state_dict().items()}
    assert fresh == {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
    twin.load_state_dict(load_weights(tmp_path / "model.safetensors"))
    ids = ids_of((2, LENGTH))
    with torch.no_grad():
        for read, _ in case.views.values():
            assert all(torch.equal(a, b) for a, b in zip(read(twin, ids, None), read(model, ids, None), strict=True))


@ALL
def test_layer_groups_hold_each_backbone_parameter_once_embeddings_first(case):
    """What discriminative rates and gradual unfreezing read (``layer_modules``): bottom to top, the embeddings
    first, one group per layer (per stack of an encoder-decoder, whose decoder starts with its position bias)."""
    model = case.build()
    groups = [[p for module in group if module is not None for p in module.parameters()]
              for group in model.layer_modules()]
    grouped = [id(p) for group in groups for p in group]
    assert sorted(grouped) == sorted(id(p) for p in case.backbone(model).parameters())
    assert {id(p) for p in model.embed.parameters()} <= {id(p) for p in groups[0]}
    cfg = model.config
    stacks = [cfg.layers, cfg.decoder_layers or cfg.layers] if isinstance(cfg, EncoderDecoderConfig) else [cfg.layers]
    assert len(groups) == sum(layers + 1 for layers in stacks)


@ALL
def test_state_dict_names_are_those_saved_runs_hold(case):
    """Renaming or reshaping a tensor breaks every saved run of its architecture: load old names (and say so in
    the docs) before changing one. A new case's entry is printed below, to add to the fixture."""
    names = {name: list(t.shape) for name, t in case.build().state_dict().items()}
    recorded = json.loads(NAMES.read_text())
    assert case.name in recorded, f"add to {NAMES.name}: {json.dumps({case.name: names})}"
    assert names == recorded[case.name]


@VIEWS
def test_dtype_and_device_follow_the_module(case, view):
    """A backbone makes what it needs beside its weights (masks, positions, sinusoids) on its input's device, in
    its weights' dtype: moved to float64 (and to a GPU where there is one) it computes what it did."""
    model, (read, _) = case.build(), case.views[view]
    ids = ids_of((2, LENGTH))
    padding = torch.ones(2, LENGTH, dtype=torch.bool)
    padding[1, SHORT:] = False
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    with torch.no_grad():
        expected = read(model, ids, padding)
        for device in devices:
            outputs = read(model.to(device, torch.float64), ids.to(device), padding.to(device))
            for out, reference in zip(outputs, expected, strict=True):
                assert out.dtype == torch.float64 and out.device.type == device
                torch.testing.assert_close(out.float().cpu(), reference, atol=1e-4, rtol=1e-4)


@ALL
def test_sequences_are_read_up_to_the_position_limit(case):
    """``position_limit`` is what the pipelines check lengths against: that long is read, one more is a ValueError
    (not an index error deep inside); without a limit, a sequence past every tiny size is read."""
    model, limit = case.build(), position_limit(case.config)
    with torch.no_grad():
        assert states(model, ids_of((1, limit or 40))).shape[1] == (limit or 40)
        if limit is not None:
            with pytest.raises(ValueError, match="max_positions"):
                states(model, ids_of((1, limit + 1)))


# -- what fine-tuning recipes insert into a Transformer stack (sesame.models.additions) -----------------------------
STACKS = pytest.mark.parametrize("case", [c for c in CASES if takes_additions(c.config)], ids=lambda c: c.name)
ADAPTERS_AND_MIX = Additions(adapter_size=4, scalar_mix=True)


@STACKS
def test_inserted_adapters_and_mix_have_the_names_runs_saved_with_them_hold(case):
    """Until issue 34 the stack's config carried ``adapter_size`` and ``scalar_mix`` and built them itself; inserted
    into a built stack, they take the names (and shapes) that code gave them (recorded as "NAME with additions"), and
    a layer group each (the adapters their sublayer's, the mix the top layer's)."""
    assert not {"adapter_size", "scalar_mix"} & set(case.config.to_dict())  # the stack's config knows nothing of them
    model = ADAPTERS_AND_MIX.insert(case.build())
    names = {name: list(t.shape) for name, t in model.state_dict().items()}
    assert names == json.loads(NAMES.read_text())[f"{case.name} with additions"]
    grouped = [id(p) for group in model.layer_modules() for module in group if module is not None
               for p in module.parameters()]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())


@STACKS
def test_adapters_start_near_the_identity_and_a_mix_as_the_layers_mean(case):
    """Houlsby et al. (2019, §2.1): the adapted stack starts as (nearly) the stack it was inserted into; ELMo's mix
    (Peters et al. 2018, eq. 1) starts at s = 0, γ = 1: the mean of the embeddings and every layer."""
    plain, ids = case.build(), ids_of((2, LENGTH))
    adapted = Additions(adapter_size=4).insert(case.build())
    mixed = Additions(scalar_mix=True).insert(case.build())
    with torch.no_grad():
        before, after = states(plain, ids), states(adapted, ids)
        assert (before - after).abs().max() < 1e-3 and not torch.equal(before, after)
        layers = all_layers(plain, ids)
        torch.testing.assert_close(states(mixed, ids), sum(layers) / len(layers), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if not takes_additions(c.config)], ids=lambda c: c.name)
def test_backbones_without_transformer_stacks_refuse_insertions(case):
    with pytest.raises(ValueError, match="join Transformer stacks"):
        ADAPTERS_AND_MIX.insert(case.build())
