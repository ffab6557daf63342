"""T5 v1.1 (the ``t5v1_1`` family): its row, gated-GELU feed-forward and untied output layer; span-corruption
pre-training; and ``sesame convert`` both ways with transformers' logits on tiny random v1.1 models, whether
config.json says ``tie_word_embeddings: false`` (as v1.1's released configs do) or transformers 5 wrote it."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from sesame.errors import SesameError
from sesame.families import FAMILIES, backbone_config
from sesame.models import build_model
from sesame.models.encoder_decoder import STYLES, EncoderDecoder
from sesame.run import load_backbone, load_tokenizer, read_config
from sesame.tokenizer import SpecialIds

from .conftest import documents, sentences

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from sesame.interop import from_hf, to_hf  # noqa: E402
from sesame.interop.encoder_decoder import check_style, model_config  # noqa: E402
from sesame.sources import resolve_source  # noqa: E402

from .test_encoder_decoder_interop import (SPARE, T5_KEYS, assert_same_logits, sesame_run,  # noqa: E402
                                           t5_tokenizer)

pytestmark = pytest.mark.usefixtures("one_thread")

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
V1_1 = {k: STYLES["t5v1_1"][k] for k in ("activation", "gated", "tied", "scale_logits")}


def test_the_row_is_t5_with_a_gated_gelu_feed_forward_of_equal_size_and_its_own_output_layer():
    cfg, v1 = (backbone_config(f, "mini", 500, 0, specials=SPECIALS) for f in ("t5v1_1", "t5"))
    assert (cfg.gated, cfg.activation, cfg.tied, cfg.scale_logits) == (True, "gelu_tanh", False, False)
    assert (cfg.norm_kind, cfg.bias, cfg.relative_buckets, cfg.decoder_start_id) == ("rms", False, 32, SPECIALS.pad)
    assert FAMILIES["t5v1_1"].objective == "span_corruption" and FAMILIES["t5v1_1"].pretrain_dropout == 0.0
    ours, theirs = build_model(cfg.to_dict()), build_model(v1.to_dict())
    assert ours.head is not None and theirs.head is None
    ffn = [sum(p.numel() for p in m.encoder.feed_forward[0].parameters()) for m in (ours, theirs)]
    assert ffn[0] == pytest.approx(ffn[1], rel=0.01)  # Shazeer 2020: 3·h·(8/3)h ≈ 2·h·4h
    assert backbone_config("t5v1_1", "base", 500, 0, specials=SPECIALS).intermediate == 2048  # T5 v1.1-base's d_ff


def test_the_feed_forward_is_gated_and_the_output_layer_is_not_the_token_table():
    torch.manual_seed(0)
    model = build_model(backbone_config("t5v1_1", "tiny", 200, 0, specials=SPECIALS).to_dict()).eval()
    ffn, x = model.encoder.feed_forward[0], torch.randn(3, 128)
    with torch.no_grad():
        expected = ffn.out(F.gelu(ffn.inp(x), approximate="tanh") * ffn.linear(x))
        torch.testing.assert_close(ffn(x), expected)
        ffn.linear.weight.zero_()  # the linear half gates everything: no signal passes a closed gate
        assert ffn(x).abs().max() == 0
    ids = torch.randint(5, 200, (2, 9))
    with torch.no_grad():
        before = model(ids, decoder_ids=ids)
        model.head.weight.add_(1.0)  # the scores move with the head alone, unscaled by hidden^-0.5
        after = model(ids, decoder_ids=ids)
        states = model.decode(ids, model.encode(ids))
    torch.testing.assert_close(after - before, states.sum(-1, keepdim=True).expand_as(after), atol=1e-4, rtol=1e-4)


def test_t5v1_1_pretrains_with_span_corruption_and_resumes(tmp_path):
    from sesame.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(documents(sentences(400)))
    run = tmp_path / "run"
    pretrain = ["--no-progress", "pretrain", "--family", "t5v1_1", "--size", "tiny", "--corpus", str(corpus),
                "--vocab-size", "300", "--seq-len", "32", "--batch-size", "8", "--lr", "3e-3", "--eval-every", "6",
                "--out", str(run)]
    assert main(pretrain + ["--max-steps", "6"]) == 0
    config = read_config(run, "--out", ("pretrained",))
    assert (config.family, config.pretrained.objective, config.model.gated, config.model.tied) == (
        "t5v1_1", "span_corruption", True, False)
    assert config.model.dropout == 0.0  # v1.1 pre-trained without dropout
    assert main(pretrain + ["--resume", "--max-steps", "12"]) == 0
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r["split"] == "train"]
    assert len(losses) >= 2 and losses[-1] < 0.9 * losses[0]
    assert "head.weight" in {n for n, _ in load_backbone(run).named_parameters()}


def v1_1_checkpoint(folder, *, config_says_untied: bool):
    """A tiny random transformers T5 v1.1 with its tokenizer: gated-gelu, an lm_head of its own. transformers 5
    ties every T5's lm_head when building one and writes ``tie_word_embeddings: true``; an lm_head given other
    values is saved and loaded untied all the same. ``config_says_untied`` rewrites config.json as v1.1's
    released ones are (``tie_word_embeddings: false``, no ``scale_decoder_outputs``)."""
    folder.mkdir()
    size = t5_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=size + SPARE, d_model=32, d_ff=48, num_layers=2, num_decoder_layers=3,
                                   num_heads=4, d_kv=8, relative_attention_num_buckets=16,
                                   relative_attention_max_distance=40, dropout_rate=0.0, pad_token_id=0,
                                   eos_token_id=1, decoder_start_token_id=0, feed_forward_proj="gated-gelu",
                                   tie_word_embeddings=False)
    model = transformers.T5ForConditionalGeneration(config)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(size + SPARE, 32))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assert not model.config.scale_decoder_outputs and model.lm_head.weight is not model.shared.weight
    model.save_pretrained(folder)
    if config_says_untied:
        saved = json.loads((folder / "config.json").read_text())
        del saved["scale_decoder_outputs"]
        (folder / "config.json").write_text(json.dumps({**saved, "tie_word_embeddings": False}))
    return model.eval()


@pytest.mark.parametrize("config_says_untied", [True, False])
def test_a_v1_1_checkpoint_converts_with_transformers_logits_and_comes_back_tensor_for_tensor(config_says_untied,
                                                                                             tmp_path):
    theirs = v1_1_checkpoint(tmp_path / "hf", config_says_untied=config_says_untied)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["family"], summary["objective"]) == ("t5v1_1", "span_corruption")
    ours, tok = load_backbone(tmp_path / "run"), load_tokenizer(tmp_path / "run")
    assert isinstance(ours, EncoderDecoder) and (ours.config.gated, ours.config.tied) == (True, False)
    assert ours.config.activation == "gelu_tanh"  # transformers' gated-gelu is gelu_new
    assert_same_logits(ours, theirs, tok, 0)

    to_hf(tmp_path / "run", tmp_path / "back")
    source, back = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "back"))
    assert sorted(back) == sorted(source) and "lm_head.weight" in back
    assert all(torch.equal(back[n], source[n]) for n in source)
    config, returned = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "back"))
    assert returned["tie_word_embeddings"] is False and returned["feed_forward_proj"] == "gated-gelu"
    del config["transformers_version"], config["tie_word_embeddings"]  # written false: both versions then untie it
    assert {k: returned.get(k) for k in config} == config
    reloaded, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert reloaded.lm_head.weight is not reloaded.shared.weight
    assert_same_logits(ours, reloaded.eval(), tok, 0)


def test_a_sesame_v1_1_model_exports_to_what_transformers_loads_with_its_logits(tmp_path):
    ours, tok = sesame_run("t5", tmp_path / "run", **V1_1)
    to_hf(tmp_path / "run", tmp_path / "hf")
    theirs, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert theirs.config.is_gated_act and theirs.config.dense_act_fn == "gelu_new"
    assert_same_logits(ours, theirs.eval(), tok, ours.config.decoder_start_id)


def test_gated_feed_forwards_transformers_cannot_name_are_refused():
    gated = model_config({**T5_KEYS, "feed_forward_proj": "gated-relu"}, "t5", "config.json")
    assert (gated["gated"], gated["activation"]) == (True, "relu")
    with pytest.raises(SesameError, match=r"a gated feed-forward of exact gelu \(t5's gated-gelu is the tanh form"):
        check_style({**gated, "activation": "gelu"}, "t5")
    with pytest.raises(SesameError, match=r"gated True \(needs False\)"):
        check_style({**model_config({"d_model": 32, "encoder_attention_heads": 4}, "bart", "c"), "gated": True},
                    "bart")


@pytest.mark.parametrize("config_says_untied", [True, False])
def test_a_v1_1_directory_is_a_source_of_the_family_its_conversion_records(config_says_untied, tmp_path):
    """resolve_source reads config.json alone; the conversion also sees an lm_head of its own (transformers 5's
    config.json says tied): both name t5v1_1."""
    v1_1_checkpoint(tmp_path / "hf", config_says_untied=config_says_untied)
    assert resolve_source(tmp_path / "hf", "--from").family.name == from_hf(tmp_path / "hf", tmp_path / "run")["family"]
