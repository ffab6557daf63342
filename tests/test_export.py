"""sesame export (ONNX, dynamic int8) and running an export: parity with the eager model on padded batches, the
exported tokenizer.json against sesame's input ids, int8 against fp32, predict/evaluate on an export, refusals."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from .conftest import onnxruntime_or_skip, refused, sentences

PARITY = 1e-4  # the bar for fp32: max abs difference between ONNX and eager outputs


@pytest.fixture(scope="module")
def runs(tiny_runs: Path, tmp_path_factory) -> Path:
    """tiny_runs plus four fine-tuned runs: a symmetric bert pair classifier (segment ids, both orders), a gpt
    regressor (causal, GPT's input tokens), a forward LSTM classifier (recurrent) and an xlnet classifier of single
    texts (segment ids: ``a <sep> <cls>`` reads 0 … 0 2), one epoch each."""
    from sesame.cli import main

    onnxruntime_or_skip()
    root = tmp_path_factory.mktemp("export_runs")
    for split, seed, n in (("train", 20, 48), ("dev", 21, 24)):
        rows = ["text,pair,label,score"] + [f'"{a}","{b}",{"longer" if len(a) > len(b) else "shorter"},{len(a) / 10}'
                                            for a, b in zip(sentences(n, seed), sentences(n, seed + 50))]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    common = ["--train", str(root / "train.csv"), "--dev", str(root / "dev.csv"), "--epochs", "1", "--batch-size",
              "16", "--max-length", "24"]
    for name, argv in (("pair", ["--from", str(tiny_runs / "pre"), "--task", "pair", "--text-column", "text",
                                 "--pair-column", "pair", "--symmetric"]),
                       ("gpt", ["--from", "scratch:gpt:tiny", "--task", "regress", "--label-column", "score"]),
                       ("lstm", ["--from", "scratch:lstm:tiny"]), ("xlnet", ["--from", "scratch:xlnet:tiny"])):
        assert main(["--no-progress", "finetune", *argv, *common, "--out", str(root / name)]) == 0
    for name in ("clf", "pre"):
        (root / name).symlink_to(tiny_runs / name)
    (root / "clf.csv").symlink_to(tiny_runs / "dev.csv")
    return root


def export(run: Path, out: Path, *extra: str) -> dict:
    from sesame.cli import main

    assert main(["--no-progress", "export", "--model", str(run), "--out", str(out), *extra]) == 0
    return json.loads((out / "export.json").read_text())


def client_inputs(out: Path, examples: list[dict]) -> dict[str, np.ndarray]:
    """The ONNX inputs made as a client without sesame makes them: tokenizer.json's batch encodings, the pair's
    other order for the swapped_* inputs."""
    meta = json.loads((out / "export.json").read_text())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    pairs = "pair" in examples[0]
    orders = {"": [(e["text"], e["pair"]) if pairs else e["text"] for e in examples],
              "swapped_": [(e["pair"], e["text"]) for e in examples] if pairs else []}
    feed = {}
    for prefix, inputs in orders.items():
        encodings = tok.encode_batch(inputs) if inputs else []
        for name, field in (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids")):
            if prefix + name in meta["inputs"]:
                feed[prefix + name] = np.array([getattr(e, field) for e in encodings], dtype=np.int64)
    assert sorted(feed) == sorted(meta["inputs"])
    return feed


def eager(run: Path, examples: list[dict]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """sesame's own batch of the examples, padded to the longest (one batch), and the eager model's outputs on it."""
    from sesame.pipelines.evaluate import Predictor

    predictor = Predictor(run)
    features = predictor.task.features(examples, predictor.tokenizer, predictor.max_length, [], predictor.causal)
    batch = predictor.task.collate(features, predictor.tokenizer.specials.pad)
    with torch.no_grad():
        return batch, predictor.model.eval().outputs(batch)


@pytest.mark.parametrize("name", ["clf", "pair", "gpt", "lstm", "xlnet"])
def test_onnx_matches_eager_on_padded_batches_from_the_exported_tokenizer(runs: Path, tmp_path: Path,
                                                                          name: str, one_thread) -> None:
    from sesame.interop.onnx_export import session
    from sesame.pipelines.evaluate import Predictor

    out = tmp_path / "export"
    meta = export(runs / name, out)
    predictor = Predictor(runs / name)
    examples = predictor.read(str(runs / (f"{name}.csv" if name == "clf" else "dev.csv")))[:12]
    batch, expected = eager(runs / name, examples)
    feed = client_inputs(out, examples)
    # the tokenizer.json alone gives sesame's input ids, padding and segments, special tokens and truncation included
    for key, onnx_name in (("ids", "input_ids"), ("padding", "attention_mask"), ("types", "token_type_ids"),
                           ("swapped_ids", "swapped_input_ids")):
        if key in batch:
            assert np.array_equal(feed[onnx_name], batch[key].long().numpy()), key
    assert bool((~batch["padding"]).any()), "the batch must hold padding"
    assert batch["ids"].shape[1] <= meta["max_length"]
    got = torch.from_numpy(session(out / "model.onnx").run(None, feed)[0])
    assert got.shape == expected.shape
    assert float((got - expected).abs().max()) <= PARITY
    # each example alone, unpadded, gives the same row as inside the padded batch (batch size 1, other lengths)
    one = {k: v[:1, : int(feed["attention_mask"][0].sum())] if not k.startswith("swapped") else
           v[:1, : int(feed["swapped_attention_mask"][0].sum())] for k, v in feed.items()}
    alone = session(out / "model.onnx").run(None, one)[0]
    assert float(np.abs(alone - expected[:1].numpy()).max()) <= PARITY
    assert meta["task"] == predictor.task.name and meta["labels"] == predictor.labels
    assert meta["output"] == ("score" if name == "gpt" else "logits")
    assert ("token_type_ids" in meta["inputs"]) == (name in ("pair", "xlnet"))
    if name == "xlnet":  # a single text's segments as XLNet pre-trained: <cls>, the last real token, alone in 2
        lengths = feed["attention_mask"].sum(1)
        assert (feed["token_type_ids"] == 2).sum(1).tolist() == [1] * len(examples)
        assert feed["token_type_ids"][np.arange(len(examples)), lengths - 1].tolist() == [2] * len(examples)


def test_int8_export_agrees_with_fp32_and_predict_runs_exports(runs: Path, tmp_path: Path, capsys, one_thread) -> None:
    from sesame.cli import main

    fp32, int8 = tmp_path / "fp32", tmp_path / "int8"
    export(runs / "clf", fp32)
    assert export(runs / "clf", int8, "--quantize", "int8")["quantize"] == "int8"
    assert (int8 / "model.onnx").stat().st_size < 0.6 * (fp32 / "model.onnx").stat().st_size  # int8 weights
    dev = str(runs / "clf.csv")

    def predict(model: Path) -> list[dict]:
        capsys.readouterr()
        assert main(["--no-progress", "predict", "--model", str(model), "--input", dev]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    run, onnx32, onnx8 = predict(runs / "clf"), predict(fp32), predict(int8)
    assert len(run) == len(onnx32) == len(onnx8) == 32
    # one code path writes the lines: the same fields, the same labels, probabilities within the fp32 parity bar
    for a, b in zip(run, onnx32):
        assert a.keys() == b.keys() and a["label"] == b["label"]
        assert max(abs(a["probabilities"][k] - b["probabilities"][k]) for k in a["probabilities"]) <= PARITY
    # int8: every argmax agrees with fp32 where fp32's top two probabilities are further apart than int8 moved them
    moved = max(abs(a["probabilities"][k] - b["probabilities"][k]) for a, b in zip(onnx32, onnx8)
                for k in a["probabilities"])
    assert 0.0 < moved < 0.05  # quantised (not the fp32 graph), and close
    for a, b in zip(onnx32, onnx8):
        first, second = sorted(a["probabilities"].values(), reverse=True)[:2]
        if first - second > 2 * moved:
            assert a["label"] == b["label"]
    refused(["predict", "--model", str(fp32), "--input", dev, "--precision", "bf16"], capsys, fp32, "--precision")
    capsys.readouterr()
    assert main(["--no-progress", "evaluate", "--model", str(fp32), "--data", dev, "--json"]) == 0
    onnx_metrics = json.loads(capsys.readouterr().out)
    assert main(["--no-progress", "evaluate", "--model", str(runs / "clf"), "--data", dev, "--json"]) == 0
    assert onnx_metrics["accuracy"] == json.loads(capsys.readouterr().out)["accuracy"]


def test_refusals_name_the_flag_and_the_fix(runs: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from sesame.interop.onnx_export import refusal
    from sesame.models import EncoderDecoderConfig, RecurrentConfig, TransformerConfig

    refused(["export", "--model", str(runs / "pre"), "--out", str(tmp_path / "x")], capsys, runs, "--model",
            "pretrained")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    refused(["export", "--model", str(runs / "clf"), "--out", str(tmp_path / "full")], capsys, tmp_path, "--out")
    assert "bidirectional" in refusal(RecurrentConfig(vocab_size=8, causal=False))
    assert "feature extractor" in refusal(RecurrentConfig(vocab_size=8, causal=False, features={"arch": "elmo"}))
    assert "encoder_decoder" in refusal(EncoderDecoderConfig(vocab_size=8))
    assert refusal(TransformerConfig(vocab_size=8, causal=True)) is None and refusal(
        RecurrentConfig(vocab_size=8)) is None
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed: importing it fails
    line = refused(["export", "--model", str(runs / "clf"), "--out", str(tmp_path / "y")], capsys, tmp_path,
                   "pip install 'sesame-nlp[onnx]'")
    assert "onnxruntime" in line and not (tmp_path / "y").exists()
