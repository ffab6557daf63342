"""config.json as typed parts (:class:`sesame.run.RunConfig`: common fields, then ``pretrained``, ``finetuned`` and
``cove``), written back as the flat JSON object it always was.

tests/fixtures/schema/NAME.written.json is what the code of commit 41623b3 (RunConfig one flat dataclass, before the
parts) wrote back, with ``write_config(run, RunConfig.parse(data, ...))``, for the config.json of each fixture run
(tests/fixtures/runs/NAME) and for NAME.json beside it: ``every-field``, a run with every field away from its default,
its keys in the reverse of the order written, and ``cove``, a ``sesame cove`` run. Do not regenerate them to make
this test pass: a difference means config.json is written differently now.
"""
from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, fields
from pathlib import Path

import pytest

from sesame.errors import SesameError
from sesame.models import TransformerConfig
from sesame.resume import record_training
from sesame.run import (KEYS, PARTS, CovePart, FinetunedPart, PretrainedPart, RunConfig, read_config,
                        write_config)
from sesame.train import TrainConfig
from sesame.train.recipes import Recipe

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA = FIXTURES / "schema"
WRITTEN = sorted(path.name.removesuffix(".written.json") for path in SCHEMA.glob("*.written.json"))


def config_json(name: str) -> Path:
    run = FIXTURES / "runs" / name / "config.json"
    return run if run.is_file() else SCHEMA / f"{name}.json"


def test_every_case_is_written_back():
    assert WRITTEN == sorted([*(p.name for p in (FIXTURES / "runs").iterdir()), "cove", "every-field"])


@pytest.mark.parametrize("name", WRITTEN)
def test_a_run_s_config_json_is_written_back_byte_for_byte_as_before_the_parts(name, tmp_path):
    path = config_json(name)
    config = RunConfig.parse(json.loads(path.read_text()), str(path))
    write_config(tmp_path, config)
    assert (tmp_path / "config.json").read_bytes() == (SCHEMA / f"{name}.written.json").read_bytes()
    assert read_config(tmp_path, "--model") == config  # and reads back as the same parts


def test_each_key_of_config_json_lands_in_its_part():
    data = json.loads((SCHEMA / "every-field.json").read_text())
    config = RunConfig.parse(data, "config.json")
    assert (config.pretrained.seq_len, config.pretrained.sizing.batch_size) == (16, 4)
    assert (config.finetuned.task, config.finetuned.mixture) == ("classify", data["mixture"])
    assert config.finetuned.recipe == Recipe(**data["recipe"])  # typed, not a dict
    assert (config.cove.vectors, config.cove.valid_tgt) == ("glove.txt", "valid.en")
    assert (config.max_length, config.setup) == (40, {"teacher": "teacher-run"})  # common: CoVe's and fine-tuning's


def test_the_parts_and_the_common_fields_hold_config_json_s_keys_once_each():
    common = [f.name for f in fields(RunConfig) if f.name not in PARTS and f.name != "read_model"]
    in_parts = [f.name for part in (PretrainedPart, FinetunedPart, CovePart) for f in fields(part)]
    assert sorted(KEYS) == sorted(common + in_parts) and len(set(KEYS)) == len(KEYS)
    assert {f.name: f.type for f in fields(RunConfig) if f.name in PARTS} == {
        "pretrained": "PretrainedPart", "finetuned": "FinetunedPart", "cove": "CovePart"}


def test_a_run_of_one_kind_writes_no_other_part_s_fields():
    model = TransformerConfig(vocab_size=8)
    tuned = RunConfig(kind="finetuned", family="bert", model=model, finetuned=FinetunedPart(task="classify"))
    assert not {f.name for f in fields(PretrainedPart)} & set(tuned.to_json())
    cove = RunConfig(kind="pretrained", family="cove", model=model, cove=CovePart(vectors="glove.txt"))
    written = cove.to_json()
    assert written["vectors"] == "glove.txt" and "train_src" not in written and "task" not in written


def test_a_broken_recipe_record_is_refused_naming_the_file():
    data = json.loads((FIXTURES / "runs" / "classifier" / "config.json").read_text())
    for recipe in ({"colour": "red"}, [4]):
        with pytest.raises(SesameError, match=r"^config.json: a broken recipe record .*; recreate the run$"):
            RunConfig.parse({**data, "recipe": recipe}, "config.json")


def test_a_run_config_and_its_parts_change_only_by_replacing_them(tmp_path):
    run = FIXTURES / "runs" / "classifier"
    config = read_config(run, "--model")
    for record, name in ((config, "pooling"), (config.pretrained, "seq_len"), (config.finetuned, "epochs"),
                         (config.cove, "vectors")):
        with pytest.raises(FrozenInstanceError):
            setattr(record, name, None)
    recorded = record_training(tmp_path, config, TrainConfig(max_steps=7), 9, runtime={"device": "cpu"})
    assert (recorded.finetuned.epochs, recorded.train["max_steps"], recorded.runtime) == (9, 7, {"device": "cpu"})
    assert config == read_config(run, "--model") and read_config(tmp_path, "--out") == recorded
    (tmp_path / "config.json").unlink()
    assert record_training(tmp_path, recorded, TrainConfig(max_steps=7), 9, runtime={"device": "cpu"}) == recorded
    assert not (tmp_path / "config.json").exists()  # nothing changed: nothing written
