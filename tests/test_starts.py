"""What a pre-training run starts from (sesame.pipelines.starts): where its model came from is a typed value, which
config.json records as its ``size``, ``base``, ``pooling`` and ``added_words``."""
from dataclasses import FrozenInstanceError, replace

import pytest

from sesame.families import backbone_config
from sesame.pipelines.starts import Continued, NewModel, Origin
from sesame.run import RunConfig, write_config
from sesame.specs import PretrainSpec


def test_a_new_model_comes_from_its_size_alone_read_as_its_family_says(tmp_path):
    spec = PretrainSpec(corpus=["corpus.txt"], out=str(tmp_path / "run"), size="tiny")
    model = backbone_config("bert", "tiny", 100, 0)
    origin = NewModel().origin(spec, model)
    assert origin == Origin("tiny", None, pooling="cls") and origin.added_words == 0
    t5 = replace(spec, family="t5")  # the row's pretrain_pooling: T5's encoder mean, not its head's last
    assert NewModel().origin(t5, model) == Origin("tiny", None, pooling="mean")
    with pytest.raises(FrozenInstanceError):
        origin.size = "mini"


def test_a_continued_run_comes_from_its_base_with_the_words_it_added(tmp_path):
    model = backbone_config("bert", "tiny", 100, 0)
    (tmp_path / "base").mkdir()
    write_config(tmp_path / "base", RunConfig(kind="pretrained", family="bert", size="tiny", pooling="mean",
                                              model=model))
    spec = PretrainSpec(corpus=["corpus.txt"], out=str(tmp_path / "run"), base=str(tmp_path / "base"))
    assert Continued(spec).origin(spec, replace(model, vocab_size=107)) == Origin(
        "tiny", str(tmp_path / "base"), pooling="mean", added_words=7)  # the base's pooling, not the family's cls
