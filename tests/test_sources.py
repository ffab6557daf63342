"""Every source a pipeline starts from has its family's registry row, resolved once by sesame.sources: a run's,
a scratch model's and a transformers directory's (the family its model_type imports as), so no pipeline branches
on a source without one."""
import json
import shutil
from pathlib import Path

import pytest

from sesame.errors import SesameError
from sesame.families import FAMILIES
from sesame.interop.hf_import import transformers_family
from sesame.sources import resolve_source

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
# a transformers config.json (its fields beyond model_type: what tells the rows of one type apart) → the family
CONFIGS = [({"model_type": "bert"}, "bert"), ({"model_type": "distilbert"}, "bert"),
           ({"model_type": "roberta"}, "roberta"), ({"model_type": "electra"}, "electra"),
           ({"model_type": "albert"}, "albert"), ({"model_type": "gpt2"}, "gpt2"), ({"model_type": "bart"}, "bart"),
           ({"model_type": "xlnet"}, "xlnet"), ({"model_type": "t5"}, "t5"),
           ({"model_type": "t5", "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, "t5v1_1")]


@pytest.mark.parametrize("hf, family", CONFIGS)
def test_a_transformers_directory_is_a_source_of_the_family_it_imports_as(hf, family, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf))
    source = resolve_source(tmp_path, "--from")
    assert (source.kind, source.family) == ("transformers", FAMILIES[family])
    assert source.family.finetune == {}  # fine-tuning's defaults: BERT's, as an import's always were


def test_a_type_sesame_does_not_convert_is_refused_naming_its_config(tmp_path):
    with pytest.raises(SesameError, match=r"config.json: model_type 'llama' is not supported"):
        transformers_family({"model_type": "llama"}, str(tmp_path / "config.json"))


def test_a_run_of_a_family_sesame_does_not_know_is_refused_naming_the_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "pretrained", run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "family": "bort"}))
    with pytest.raises(SesameError, match=r"^--from .*run: its config.json's family 'bort' is unknown"):
        resolve_source(run, "--from")
