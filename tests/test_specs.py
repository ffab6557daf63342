"""The wiring's contracts: specs declare every option once, the CLI's flags and the Python API are read
from them, config.json is checked against a versioned schema, and what --from names is resolved once."""
from __future__ import annotations

import argparse
import inspect
import json
from dataclasses import fields
from pathlib import Path

import pytest

from sesame import cli
from sesame import api
from sesame.apps.cove import CoveSpec
from sesame.apps.ulmfit import UlmfitSpec
from sesame.commands import COMMANDS
from sesame.errors import SesameError
from sesame.families import FAMILIES
from sesame.models.additions import Additions
from sesame.objectives import OBJECTIVES
from sesame.options import RATE, add_flags, given, parse_value
from sesame.models import TransformerConfig
from sesame.run import FinetunedPart, RunConfig, SCHEMA_VERSION, read_config
from sesame.sources import resolve_source
from sesame.specs import FinetuneSpec, PretrainSpec
from sesame.train import TrainConfig
from sesame.train.recipes import Recipe

FIXTURES = Path(__file__).parent / "fixtures" / "runs"


def parse(cls: type, argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_flags(parser, cls)
    return given(parser.parse_args(argv), cls)


def test_flags_come_from_the_fields_and_only_typed_ones_are_given():
    assert parse(PretrainSpec, ["--corpus", "a.txt", "b.txt", "--out", "run", "--seq-len", "64", "--resume"]) == \
        {"corpus": ["a.txt", "b.txt"], "out": "run", "seq_len": 64, "resume": True}
    assert parse(FinetuneSpec, ["--from", "minilm", "--pooling", "concat"]) == {"base": "minilm", "pooling": "concat"}
    assert parse(TrainConfig, ["--lr", "1e-3", "--schedule", "stlr"]) == {"lr": 1e-3, "schedule": "stlr"}
    with pytest.raises(SystemExit):
        parse(TrainConfig, ["--schedule", "cosine"])  # choices come from the field


def test_every_pipeline_and_train_flag_of_the_cli_is_a_spec_field():
    """finetune --vectors and every --pooling of the code's table are flags because the fields are."""
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    finetune = {a.dest: a for a in sub.choices["finetune"]._actions}
    for cls in (FinetuneSpec, Recipe, TrainConfig):
        for f in fields(cls):
            if f.metadata.get("cli"):
                assert f.name in finetune, f.name
    assert set(finetune["pooling"].choices) == {"cls", "last", "mean", "max", "concat"}
    assert set(sub.choices) == {name.replace("_", "-") for name in COMMANDS}


def test_the_python_api_splits_keywords_by_spec_and_refuses_unknown_ones():
    spec = FinetuneSpec.of("minilm", "t.csv", "d.csv", "out", text_column="tweet", lm_weight=0.5, lr=1e-4, epochs=2)
    assert spec.task_options == {"text_column": "tweet"} and spec.recipe.lm_weight == 0.5
    assert spec.training == {"lr": 1e-4} and spec.epochs == 2
    cfg = spec.train_config(FAMILIES["ulmfit"], size=None, scratch=False)
    assert cfg.lr == 1e-4 and cfg.warmup == 0.1
    assert FinetuneSpec.of("m", "t", "d", "o").train_config(FAMILIES["ulmfit"], size=None, scratch=False).lr == 2e-3
    with pytest.raises(TypeError, match="unknown option 'learning_rate'"):
        PretrainSpec.of(["c.txt"], "out", learning_rate=1e-3)
    # nothing after the files is positional: a misrouted flag cannot happen
    assert all(p.kind == p.VAR_KEYWORD for p in list(inspect.signature(api.finetune).parameters.values())[4:])


def test_values_are_typed_by_their_field():
    assert parse_value(TrainConfig, "lr", "3e-4", "here") == 3e-4
    assert parse_value(TrainConfig, "max_steps", "null", "here") is None
    assert parse_value(FinetuneSpec, "tokenizer", "123", "here") == "123"  # a path stays a string
    with pytest.raises(SesameError, match='here: lr=fast should be a float'):
        parse_value(TrainConfig, "lr", "fast", "here")
    with pytest.raises(SesameError, match="choose one of linear, stlr"):
        parse_value(TrainConfig, "schedule", "cosine", "here")


def test_spec_validation_names_the_flag_before_anything_is_written(tmp_path):
    bad = [({"family": "lstm"}, "--family lstm: has no pre-training objective"),
           ({"family": "cove"}, "is trained by `sesame cove`"),
           ({"seq_len": 4}, "--seq-len 4"),
           ({"attention_window": 8, "family": "ulmfit"}, "banded attention is for Transformers"),
           ({"objective_options": {"samples": 3}}, "--objective-option samples: not an option of the mlm_nsp"),
           ({"objective_options": {"rate": "abc"}}, "--objective-option rate=abc: the mlm_nsp objective's rate is a "
                                                    r"number \(default 0.15\)"),
           ({"family": "elmo", "objective_options": {"samples": 2.5}}, "samples=2.5: .* is a whole number"),
           ({"family": "t5", "objective_options": {"separators": 1}}, "separators=1: .* is true or false"),
           ({"family": "bart", "objective_options": {"mask_ratio": None}}, "mask_ratio=null: .* is a number"),
           ({"objective_options": {"rate": 1.5}}, r"rate=1.5: the mlm_nsp objective's rate is above 0 and at most 1 "
                                                  r"\(default 0.15\)"),
           ({"family": "spanbert", "objective_options": {"max_span": 0}}, "max_span=0: .* is at least 1"),
           ({"family": "electra", "objective_options": {"two_stage": 1}}, "two_stage=1: .* a fraction from 0 and under 1"),
           ({"lr": -1.0}, "--lr: must be positive"),
           ({"drop_mult": 0.5}, "--drop-mult: scales the five dropouts of a recurrent .* --family bert is a "
                                "transformer model; drop --drop-mult"),
           ({"family": "ulmfit", "drop_mult": 2.5}, "--drop-mult 2.5: makes weight_dropout 1.25"),
           ({"model_options": {"norm": "pre", "depth": 2}}, "--model-option depth: not a setting of a transformer "
                                                            "model; it takes activation, .*norm, "),
           ({"model_options": {"vocab_size": 9}}, "--model-option vocab_size: not a setting"),
           ({"model_options": {"dropout": 0.2}}, "--model-option dropout: set it with --dropout"),
           ({"model_options": {"bias": "no"}}, '--model-option bias: bias="no" should be a bool'),
           ({"model_options": {"norm_kind": "batch"}}, "--model-option: norm_kind 'batch': choose layer or rms"),
           ({"model_options": {"layers": 2}, "size": "auto", "max_minutes": 1.0},
            "--model-option layers: --size auto picks the shape")]
    for options, message in bad:
        with pytest.raises(SesameError, match=message):
            api.pretrain([str(tmp_path / "none.txt")], str(tmp_path / "run"), **options)
    assert not (tmp_path / "run").exists()
    continued = PretrainSpec(corpus=["a.txt"], out="run", base="runs/pre", model_options={"norm": "pre"})
    with pytest.raises(SesameError, match="--from runs/pre brings its own model; drop --model-option"):
        continued.validate()


def test_objective_options_are_declared_and_accepted_by_the_objective():
    for cls in OBJECTIVES.values():
        build = {**inspect.signature(cls.build).parameters, **inspect.signature(cls.__init__).parameters}
        takes_more = any(p.kind == p.VAR_KEYWORD for p in build.values())
        for name in cls.options:
            assert name in build or takes_more, (cls.name, name)
        for name, default in cls.option_defaults().items():
            cls.check_option(name, default)  # each default is a value of its own kind
    for family in FAMILIES.values():  # and so is every family's own setting
        for name, value in (family.objective_options if family.objective in OBJECTIVES else {}).items():
            OBJECTIVES[family.objective].check_option(name, value)


def test_config_schema_version_and_fields_are_checked(tmp_path):
    old = read_config(FIXTURES / "pretrained", "--model")  # written before versioning: version 0 reads as today's
    assert old.version == SCHEMA_VERSION and old.family == "bert" and old.pretrained.objective == "mlm_nsp"
    run = tmp_path / "run"
    run.mkdir()
    for data, message in [({**old.to_json(), "version": SCHEMA_VERSION + 1}, "written by a newer sesame"),
                          ({**old.to_json(), "version": -1}, "config version -1 is none sesame writes"),
                          ({**old.to_json(), "version": True}, "config version true is none sesame writes"),
                          ({**old.to_json(), "version": "1"}, 'config version "1" is none sesame writes'),
                          ({**old.to_json(), "colour": "red"}, "unknown fields colour"),
                          ({"kind": "pretrained"}, "a broken run config .missing family, model"),
                          ([1, 2], "a JSON object is expected")]:
        (run / "config.json").write_text(json.dumps(data))
        with pytest.raises(SesameError, match=message):
            read_config(run, "--model")
    written = RunConfig(kind="finetuned", family="bert", model=TransformerConfig(vocab_size=8),
                        finetuned=FinetunedPart(task="classify")).to_json()
    assert written["version"] == SCHEMA_VERSION and "objective" not in written and written["select"] is None


def test_what_a_recipe_inserts_is_recorded_apart_from_the_backbone_config(tmp_path):
    """config.json's ``additions`` (adapters, a scalar mix: issue 34), written only where there are any; a run
    written when the stack's config held them (``adapter_size``, ``scalar_mix``) reads with them moved out, and
    ELMo's own ``scalar_mix``, part of its model, stays."""
    old = read_config(FIXTURES / "adapters", "--model")
    assert old.additions == Additions(adapter_size=4) and not {"adapter_size", "scalar_mix"} & set(old.model.to_dict())
    written = old.to_json()
    assert written["additions"] == {"adapter_size": 4, "scalar_mix": False}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(written))
    assert read_config(run, "--model") == old
    assert "additions" not in read_config(FIXTURES / "classifier", "--model").to_json()
    model = {"arch": "elmo", "vocab_size": 8, "scalar_mix": True}
    elmo = RunConfig.parse({"kind": "pretrained", "family": "elmo", "model": model}, "config.json")
    assert elmo.to_json()["model"] == model and elmo.model.scalar_mix and not elmo.additions


def test_what_from_names_is_resolved_once(tmp_path):
    scratch = resolve_source("scratch:bilstm:tiny", "--from")
    assert (scratch.kind, scratch.family.name, scratch.size, scratch.path) == ("scratch", "bilstm", "tiny", None)
    run = resolve_source(FIXTURES / "classifier", "--from")
    assert (run.kind, run.config.kind, run.family.name) == ("run", "finetuned", "bert")
    for given_, message in [("scratch:bert", "write scratch:FAMILY:SIZE"), ("scratch:nope:tiny", "--family 'nope'"),
                            (str(tmp_path / "missing"), "no such run directory")]:
        with pytest.raises(SesameError, match=message):
            resolve_source(given_, "--from")


def test_a_run_whose_objective_another_command_scores_is_pointed_there(tmp_path):
    (tmp_path / "cove").mkdir()
    (tmp_path / "cove" / "config.json").write_text(json.dumps(
        {"kind": "pretrained", "family": "cove", "objective": "translation",
         "model": {"arch": "cove", "vocab_size": 8, "target_vocab_size": 8}}))
    with pytest.raises(SesameError, match="score it with `sesame translate --model RUN"):
        api.evaluate(str(tmp_path / "cove"), [str(tmp_path / "text.txt")])
    with pytest.raises(SesameError, match="train it with `sesame cove`"):
        api.pretrain([str(tmp_path / "text.txt")], str(tmp_path / "run"), objective="translation")
    assert not (tmp_path / "run").exists()


def test_fine_tuning_rates_come_from_the_size_and_whether_the_weights_are_pre_trained():
    """BERT's 5e-5 is for weights pre-trained on billions of words: a small model pre-trained by sesame gets its size's
    rate (sesame.families.FINETUNE_RATES), a model from scratch pre-training's (issue 37: at a fine-tuning rate a short
    tagger from scratch learned no entity); a family's own rate and flags win."""
    spec = FinetuneSpec(base="x", train="t", dev="d", out="o")
    bert, ulmfit = FAMILIES["bert"], FAMILIES["ulmfit"]
    assert spec.train_config(bert, size="mini", scratch=False).lr == 2e-4
    scratch = spec.train_config(bert, size="mini", scratch=True)
    assert (scratch.lr, scratch.warmup) == (1e-3, 0.1)
    assert spec.train_config(FAMILIES["lstm"], size="mini", scratch=True).lr == FAMILIES["lstm"].finetune["lr"]
    assert spec.train_config(bert, size=None, scratch=False).lr == 5e-5  # imported weights (transformers, minilm)
    assert spec.train_config(ulmfit, size="mini", scratch=False).lr == 2e-3  # the family's row
    given_rate = FinetuneSpec(base="x", train="t", dev="d", out="o", training={"lr": 1e-5})
    assert given_rate.train_config(bert, size="tiny", scratch=True).lr == 1e-5


def test_small_training_sets_get_enough_steps_and_a_time_budget_is_used():
    """Without --epochs: at least MIN_STEPS optimizer steps (3 to 20 epochs), and with --max-minutes as many epochs
    as the time allows, where BERT's fixed 3 epochs stopped 1,000 labels after 96 steps whatever the budget."""
    from sesame.specs import EPOCHS, MIN_STEPS, TIMED_EPOCHS, default_epochs

    assert default_epochs(32, timed=False) == 8  # 1,000 labels in batches of 32: 256 steps
    assert default_epochs(2, timed=False) == EPOCHS[1] and default_epochs(366, timed=False) == EPOCHS[0]
    assert all(default_epochs(n, timed=False) * n >= MIN_STEPS for n in range(13, 84))
    assert default_epochs(32, timed=True) == TIMED_EPOCHS


def test_a_time_budget_alone_is_not_cut_short_by_the_default_step_cap():
    """`pretrain --max-minutes 15` trains for 15 minutes: the default 1,000 steps stopped such a run after 13 (the
    NSP re-run of the 15-minute compare) while the schedule decayed by time."""
    timed = PretrainSpec.of(["c.txt"], "run", family="bert", max_minutes=15).train_config()
    assert timed.max_steps is None and timed.max_minutes == 15
    both = PretrainSpec.of(["c.txt"], "run", family="bert", max_minutes=15, max_steps=500).train_config()
    assert both.max_steps == 500 and both.max_minutes == 15
    assert PretrainSpec.of(["c.txt"], "run", family="bert").train_config().max_steps == 1000


def test_the_epochs_a_run_was_given_by_default_are_recorded(labeled, tmp_path):
    train, dev = labeled  # 120 rows: 4 steps of 32 per epoch
    api.finetune("scratch:bert:tiny", str(train), str(dev), str(tmp_path / "run"), progress=False, max_length=16)
    config = read_config(tmp_path / "run", "--model")
    # scratch: pre-training's rate; 63 epochs, capped
    assert config.finetuned.epochs == 20 and config.train["lr"] == 1e-3
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 80


@pytest.mark.parametrize("spec", [
    lambda p: PretrainSpec(corpus="corpus.txt", out="run", dropout=p),
    lambda p: FinetuneSpec(base="scratch:bert:tiny", train="t.csv", dev="d.csv", out="run", dropout=p),
    lambda p: UlmfitSpec(train="t.csv", dev="d.csv", lm="lm", out="run", dropout=p),
    lambda p: CoveSpec(train_src="a", train_tgt="b", valid_src="c", valid_tgt="d", out="run", dropout=p),
])
def test_a_dropout_rate_is_declared_in_0_to_1_and_held_to_it(spec):
    for rate in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(SesameError, match=rf"^--dropout {rate}: must be at least 0 and below 1$"):
            spec(rate).validate()
    assert {f.name: f.metadata["within"] for f in fields(spec(0.0)) if f.name == "dropout"} == {"dropout": RATE}


@pytest.mark.parametrize("seq_len, message", [(0, "--seq-len 0: use a length between 8 and 4096"),
                                              (-8, "--seq-len -8: use a length between 8 and 4096"),
                                              (1024, "--seq-len 1024: --model .* has 512 positions")])
def test_evaluate_refuses_a_window_length_it_cannot_use(tmp_path, seq_len, message):
    (tmp_path / "text.txt").write_text("A cat sleeps on the old stone.\n" * 400)
    with pytest.raises(SesameError, match=message):
        api.evaluate(str(FIXTURES / "pretrained"), str(tmp_path / "text.txt"), seq_len=seq_len)
