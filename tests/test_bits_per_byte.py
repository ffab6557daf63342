"""Bits per byte and per character: the analytic value for a known distribution, and where they are reported."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import sesame
from sesame.data.shards import prepare_corpus
from sesame.metrics import language_model_report
from sesame.run import load_tokenizer
from sesame.train.checkpoint import load_weights, save_weights

from .conftest import sentences


def test_report_divides_the_total_nats_by_the_texts_bytes_and_characters() -> None:
    n = 1000  # a byte-level model that is uniform over 256 bytes, on a text of n two-byte characters
    report = language_model_report(2 * n * math.log(256), 2 * n, {"bytes": 2 * n, "chars": n})
    assert report["bits_per_byte"] == pytest.approx(8.0) and report["bits_per_char"] == pytest.approx(16.0)
    assert report["perplexity"] == pytest.approx(256.0)
    assert "bits_per_byte" not in language_model_report(1.0, 1)


@pytest.fixture(scope="module")
def uniform_gpt2(tmp_path_factory) -> tuple[Path, Path]:
    """A gpt2 run whose output embedding is zero: every next token has probability 1/V."""
    folder = tmp_path_factory.mktemp("bpb")
    text = folder / "text.txt"
    text.write_text("\n".join(sentences(300)) + "\nÉté à Zürich, naïve café.\n", encoding="utf-8")
    run = folder / "run"
    sesame.pretrain([str(text)], str(run), family="gpt2", size="tiny", vocab_size=300, seq_len=32, batch_size=8,
                    max_steps=1, valid=[str(text)], progress=False)
    weights = load_weights(run / "model.safetensors")
    weights["backbone.embed.tokens.weight"] = torch.zeros_like(weights["backbone.embed.tokens.weight"])
    save_weights(run / "model.safetensors", weights)
    return run, text


def test_a_uniform_model_costs_log2_v_bits_per_token(uniform_gpt2, tmp_path) -> None:
    run, text = uniform_gpt2
    tok = load_tokenizer(run)
    report = sesame.evaluate(str(run), str(text))
    n_tokens = prepare_corpus([text], tok, tmp_path / "shards", progress=False).n_tokens
    raw = text.read_bytes()
    assert report["loss"] == pytest.approx(math.log(tok.vocab_size), rel=1e-5)
    assert report["bits_per_byte"] == pytest.approx(n_tokens * math.log2(tok.vocab_size) / len(raw), rel=1e-4)
    assert report["bits_per_char"] == pytest.approx(n_tokens * math.log2(tok.vocab_size) / len(raw.decode()), rel=1e-4)
    assert report["bits_per_char"] > report["bits_per_byte"]  # the accented characters take two bytes


def test_pretraining_validation_reports_bits_per_byte(uniform_gpt2) -> None:
    run, _ = uniform_gpt2
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in valid if r.get("split") == "dev"]
    assert valid and all(r["bits_per_byte"] > 0 and r["bits_per_char"] >= r["bits_per_byte"] for r in valid)
