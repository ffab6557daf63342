"""XLNet interop: tiny seeded transformers XLNets convert to xlnet runs with transformers' outputs (the content
stream after a memory, the query stream under a permutation mask and target mapping, the next memory, a sequence
classifier's logits on padded pairs), a checkpoint comes back tensor for tensor, sesame's own runs export to
directories transformers' Auto classes load unchanged with the same outputs, and what sesame does not compute is
refused with one line naming the config key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from sesame.errors import SesameError  # noqa: E402
from sesame.interop import from_hf, to_hf  # noqa: E402
from sesame.models import XLNet, XLNetConfig  # noqa: E402
from sesame.models.xlnet import target_mapping  # noqa: E402
from sesame.objectives.plm import factorisation_order, permutation_masks, select_targets  # noqa: E402
from sesame.pipelines.evaluate import Predictor, load  # noqa: E402
from sesame.run import (FinetunedPart, PretrainedPart, RunConfig, load_backbone, load_tokenizer,  # noqa: E402
                        write_config)
from sesame.tasks import make_task  # noqa: E402
from sesame.tokenizer import put_cls_last, train_tokenizer  # noqa: E402
from sesame.train.checkpoint import load_weights, save_weights, write_json  # noqa: E402

from .conftest import sentences  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]  # XLNet's ids 0-8
LABELS = ["neg", "neutral", "pos"]


def xlnet_tokenizer(folder: Path) -> int:
    """transformers' own XLNetTokenizer over a small Unigram vocabulary, saved as save_pretrained saves it."""
    words = sorted({w for s in sentences(50) for w in s.split()})
    chars = sorted({c for w in words for c in w})
    pieces = [(t, 0.0) for t in SPECIALS] + [("\u2581", -2.0)] + [(c, -5.0) for c in chars]
    pieces += [(f"\u2581{w}", -3.0) for w in words[:60]]
    transformers.XLNetTokenizer(vocab=pieces).save_pretrained(folder)
    return len(pieces)


def checkpoint(folder: Path, kind: str = "lm", **config):
    """A transformers XLNet directory with its tokenizer, every weight moved off its initial value, and the model."""
    vocab = xlnet_tokenizer(folder)
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(**{"vocab_size": vocab, "d_model": 32, "n_layer": 2, "n_head": 4, "d_inner": 64,
                                      "dropout": 0.0, "mem_len": 5, **config})
    if kind in ("lm", "base"):
        model = (transformers.XLNetLMHeadModel if kind == "lm" else transformers.XLNetModel)(cfg)
    else:
        cfg.id2label, cfg.label2id = dict(enumerate(LABELS)), {name: i for i, name in enumerate(LABELS)}
        model = transformers.XLNetForSequenceClassification(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval().save_pretrained(folder)
    return model


def sesame_lm(run: Path) -> tuple[XLNet, torch.Tensor]:
    """The run's backbone and its plm objective's output bias."""
    return load_backbone(run), load_weights(run / "model.safetensors")["bias"]


def orders(rows: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sampled order per row: (the rank of each target, −1 elsewhere; the targets; the predicted positions)."""
    keys = torch.stack([torch.rand(n, generator=torch.Generator().manual_seed(i)) for i in range(rows)])
    rank = factorisation_order(keys, 5)
    target = select_targets(rank, 5, 3)
    return torch.where(target, rank, -1), target, target.nonzero()[:, 1].view(rows, -1)


def assert_same_lm(net: XLNet, bias: torch.Tensor, theirs, vocab: int) -> None:
    """transformers' logits and next memory, and sesame's, within 1e-4: the content stream after a memory, and the
    query stream under XLNet's perm_mask and target_mapping after a memory."""
    ids = torch.randint(9, vocab, (3, 12), generator=torch.Generator().manual_seed(1))
    types = torch.tensor([0] * 6 + [1] * 5 + [2]).expand(3, -1)
    memory = [torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(2 + i)) for i in range(2)]
    mems = [m.transpose(0, 1) for m in memory]  # transformers' memory is (time, batch, hidden)
    table = net.embed.tokens.weight
    with torch.no_grad():
        content = net.streams(ids, types=types, memory=memory, content_mask=torch.ones(3, 12, 16, dtype=torch.bool))
        expected = theirs(ids, token_type_ids=types, mems=mems, use_mems=True)
        assert expected.logits.abs().max() > 0.1
        torch.testing.assert_close(content.layers[-1] @ table.T + bias, expected.logits, atol=1e-4, rtol=1e-4)
        for kept, given in zip(net.remember(memory, content.layers), expected.mems):  # mem_len 5 of 4 + 12
            assert kept.shape[1] == 5
            torch.testing.assert_close(kept, given.transpose(0, 1), atol=1e-4, rtol=1e-4)
        ranked, target, predict = orders(3, 12)
        content_mask, query_mask = permutation_masks(ranked, predict, past=4)
        mine = net.streams(ids, types=types, memory=memory, content_mask=content_mask, query_mask=query_mask,
                           targets=predict)
        perm_mask = (target[:, None, :] & (ranked[:, None, :] >= ranked[:, :, None])).float()  # 1: may not attend
        expected = theirs(ids, token_type_ids=types, perm_mask=perm_mask, target_mapping=target_mapping(predict, 12),
                          mems=mems, use_mems=True)
        torch.testing.assert_close(mine.query @ table.T + bias, expected.logits, atol=1e-4, rtol=1e-4)
        for kept, given in zip(net.remember(memory, mine.layers), expected.mems):
            torch.testing.assert_close(kept, given.transpose(0, 1), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("clamp_len", [-1, 3])  # 3: distances up to 15 are clamped, as transformers clamps them
def test_an_lm_checkpoint_imports_with_transformers_outputs_and_comes_back_tensor_for_tensor(tmp_path, clamp_len):
    theirs = checkpoint(tmp_path / "hf", clamp_len=clamp_len)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["family"], summary["kind"], summary["objective"]) == ("xlnet", "pretrained", "plm")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["mem_len"] == 5 and config["pooling"] == "last" and config["model"]["clamp_len"] == clamp_len
    assert config["model"]["activation"] == "gelu"  # transformers' default ff_activation, exact GELU, as it says
    assert_same_lm(*sesame_lm(tmp_path / "run"), theirs, theirs.config.vocab_size)

    assert to_hf(tmp_path / "run", tmp_path / "back")["architecture"] == "XLNetLMHeadModel"
    source, back = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "back"))
    assert sorted(back) == sorted(source) and all(torch.equal(back[n], source[n]) for n in source)
    original, returned = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "back"))
    del original["transformers_version"]
    assert {k: returned.get(k) for k in original} == original
    reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert_same_lm(*sesame_lm(tmp_path / "run"), reloaded.eval(), theirs.config.vocab_size)


def test_xlnets_tokenizer_reads_cls_and_sep_as_sesames_roles_and_comes_back_as_it_was(tmp_path):
    checkpoint(tmp_path / "hf")
    from_hf(tmp_path / "hf", tmp_path / "run")
    tok, auto = load_tokenizer(tmp_path / "run"), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    specials = tok.specials
    assert (specials.unk, specials.cls, specials.sep, specials.pad, specials.mask) == (0, 3, 4, 5, 6)
    texts, pairs = sentences(8, seed=3), sentences(8, seed=4)
    for encoding, a, b in zip(tok.encodings(texts, pairs), texts, pairs):
        given = auto(a, b, return_token_type_ids=True)
        assert encoding.ids == given["input_ids"] and encoding.type_ids == given["token_type_ids"]
        assert encoding.ids[-2:] == [4, 3] and encoding.type_ids[-1] == 2  # a <sep> b <sep> <cls>, <cls> in segment 2
    to_hf(tmp_path / "run", tmp_path / "back")
    source, back = (json.loads((tmp_path / d / "tokenizer.json").read_text()) for d in ("hf", "back"))
    assert back == source


def classifier_inputs(auto, texts: list[str], pairs: list[str] | None) -> dict:
    batch = auto(texts, pairs, padding=True, return_tensors="pt", return_token_type_ids=True)
    assert auto.padding_side == "left" and not batch["attention_mask"].all()  # rows of several lengths
    return batch


def sesame_features(run: Path, texts: list[str], pairs: list[str] | None) -> tuple[Predictor, list[dict]]:
    """The run loaded as predict, evaluate and serve load it, and its features of the texts (or text pairs)."""
    predictor = load(run)
    examples = [{"text": a} for a in texts] if pairs is None else [{"text": a, "pair": b} for a, b in zip(texts, pairs)]
    return predictor, predictor.features(examples)


def sesame_logits(run: Path, texts: list[str], pairs: list[str] | None) -> torch.Tensor:
    predictor, features = sesame_features(run, texts, pairs)
    return predictor.outputs(features)


def test_a_sequence_classifier_imports_as_a_pair_run_with_transformers_logits_on_left_padded_rows(tmp_path):
    theirs = checkpoint(tmp_path / "hf", kind="classify")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["kind"], summary["task"], summary["labels"], summary["pooler"]) == ("finetuned", "classify",
                                                                                       LABELS, True)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config.update(task="pair", task_options=make_task("pair").options())  # the same head reads text pairs
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    texts, pairs = sentences(6, seed=5), [s.split(" ", 2)[-1] for s in sentences(6, seed=6)]
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = theirs(**classifier_inputs(auto, texts, pairs)).logits
    assert expected.std() > 0.05
    torch.testing.assert_close(sesame_logits(tmp_path / "run", texts, pairs), expected, atol=1e-4, rtol=1e-4)
    to_hf(tmp_path / "run", tmp_path / "back")
    source, back = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "back"))
    assert sorted(back) == sorted(source) and all(torch.equal(back[n], source[n]) for n in source)


def test_a_sequence_classifier_reads_a_single_text_with_the_tokenizers_segment_ids_and_transformers_logits(tmp_path):
    theirs = checkpoint(tmp_path / "hf", kind="classify")
    with torch.no_grad():  # N(0, 1) tokens, segment vectors and biases, head: the segment ids show in the logits
        for table in (theirs.transformer.word_embedding, theirs.sequence_summary.summary, theirs.logits_proj):
            table.weight.normal_()
        for layer in theirs.transformer.layer:
            layer.rel_attn.seg_embed.normal_()
            layer.rel_attn.r_s_bias.normal_()
    theirs.save_pretrained(tmp_path / "hf")
    assert from_hf(tmp_path / "hf", tmp_path / "run")["task"] == "classify"  # single texts
    texts = sentences(6, seed=10)
    given = classifier_inputs(transformers.AutoTokenizer.from_pretrained(tmp_path / "hf"), texts, None)
    real = given["attention_mask"].bool()  # left-padded rows
    assert given["token_type_ids"][real].tolist().count(2) == len(texts)  # each text's <cls>, in segment 2
    with torch.no_grad():
        expected = theirs(**given).logits
        unsegmented = theirs(input_ids=given["input_ids"], attention_mask=given["attention_mask"]).logits
    assert expected.std() > 0.05 and (expected - unsegmented).abs().max() > 0.1  # the segment ids matter
    predictor, features = sesame_features(tmp_path / "run", texts, None)
    torch.testing.assert_close(predictor.outputs(features), expected, atol=1e-4, rtol=1e-4)
    for feature, ids, types, row in zip(features, given["input_ids"], given["token_type_ids"], real):
        assert feature["ids"] == ids[row].tolist() and feature["types"] == types[row].tolist()


def sesame_run(folder: Path, finetuned: bool = False) -> tuple[XLNet, object]:
    """A run sesame made: a random XLNet, and a Unigram tokenizer sesame trained, with XLNet's template; pretrained
    with the plm objective's bias, or a fine-tuned pair classifier (XLNet's sequence summary)."""
    tok = train_tokenizer(sentences(60), "unigram", vocab_size=150)
    put_cls_last(tok)
    torch.manual_seed(3)
    net = XLNet(XLNetConfig(vocab_size=tok.vocab_size, hidden=32, layers=2, heads=4, intermediate=64, dropout=0.0,
                            pad_id=tok.specials.pad, mem_len=5, activation="gelu_tanh"))  # as the xlnet row's
    folder.mkdir()
    tok.save(folder / "tokenizer.json")
    if finetuned:
        job = make_task("pair")
        model = job.build(net, len(LABELS), "last", 0.0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        save_weights(folder / "model.safetensors", model.state_dict())
        write_json(folder / "labels.json", LABELS)
        config = RunConfig(kind="finetuned", family="xlnet", model=net.config, pooling="last", max_length=64,
                           finetuned=FinetunedPart(task="pair", task_options=job.options(), select=job.select))
    else:
        bias = torch.randn(tok.vocab_size) * 0.1
        save_weights(folder / "model.safetensors", {**{"backbone." + k: v for k, v in net.state_dict().items()},
                                                    "bias": bias})
        config = RunConfig(kind="pretrained", family="xlnet", model=net.config, pooling="last",
                           pretrained=PretrainedPart(objective="plm", seq_len=16))
    write_config(folder, config)
    return net.eval(), tok


def test_a_sesame_lm_exports_to_what_transformers_loads_with_its_outputs(tmp_path):
    net, tok = sesame_run(tmp_path / "run")
    assert to_hf(tmp_path / "run", tmp_path / "hf")["architecture"] == "XLNetLMHeadModel"
    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert theirs.config.mem_len == 5 and theirs.config.pad_token_id == tok.specials.pad
    assert theirs.config.ff_activation == "gelu_new"  # transformers' name of the tanh form; its "gelu" is exact
    assert_same_lm(*sesame_lm(tmp_path / "run"), theirs.eval(), tok.vocab_size)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = sentences(5, seed=7)
    assert [auto(t)["input_ids"] for t in texts] == tok.encode(texts)


def test_a_sesame_pair_classifier_exports_to_what_transformers_loads_with_its_logits(tmp_path):
    sesame_run(tmp_path / "run", finetuned=True)
    assert to_hf(tmp_path / "run", tmp_path / "hf")["architecture"] == "XLNetForSequenceClassification"
    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf",
                                                                                  output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert theirs.config.id2label == dict(enumerate(LABELS))
    texts, pairs = sentences(6, seed=8), [s.split(" ", 3)[-1] for s in sentences(6, seed=9)]
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = theirs.eval()(**classifier_inputs(auto, texts, pairs)).logits
    assert expected.std() > 0.05
    torch.testing.assert_close(sesame_logits(tmp_path / "run", texts, pairs), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind, key, value", [("lm", "attn_type", "uni"), ("lm", "bi_data", True),
                                              ("lm", "same_length", True),
                                              ("classify", "summary_use_proj", False),
                                              ("classify", "summary_type", "first")])
def test_what_sesame_does_not_compute_is_refused_naming_the_key(tmp_path, kind, key, value):
    checkpoint(tmp_path / "hf", kind=kind)
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(SesameError, match=f"{key} {value!r}"):
        from_hf(tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_bare_model_imports_without_an_objective_and_an_unbounded_memory_as_sesames_default(tmp_path):
    theirs = checkpoint(tmp_path / "hf", kind="base", mem_len=None)  # the released checkpoints' mem_len: null
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["kind"], summary["objective"]) == ("pretrained", None) and "mem_len None" in summary["notes"][0]
    net = load_backbone(tmp_path / "run")
    assert net.config.mem_len == XLNetConfig.mem_len
    ids = torch.randint(9, theirs.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(net(ids), theirs(ids).last_hidden_state, atol=1e-4, rtol=1e-4)
    to_hf(tmp_path / "run", tmp_path / "back")
    source, back = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "back"))
    assert sorted(back) == sorted(source) and all(torch.equal(back[n], source[n]) for n in source)


def test_a_tensor_the_configuration_does_not_have_is_refused(tmp_path):
    checkpoint(tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    weights["transformer.layer.2.rel_attn.q"] = weights["transformer.layer.1.rel_attn.q"].clone()  # a stray third layer
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    stray = r"\(xlnet\): the tensors do not match config.json: unexpected: layer.2.rel_attn.q"  # XLNetModel's name
    with pytest.raises(SesameError, match=stray):
        from_hf(tmp_path / "hf", tmp_path / "run")
