"""T5 and BART interop: tiny seeded transformers models convert to sesame's encoder-decoder with transformers'
logits (padded sources and padded decoder inputs), sesame models export to directories AutoModelForSeq2SeqLM
loads with no missing or unexpected weights and the same logits, a checkpoint comes back tensor for tensor, and
what sesame does not compute is refused with one line naming the config key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

from sesame.errors import SesameError  # noqa: E402
from sesame.interop import from_hf, to_hf  # noqa: E402
from sesame.interop.encoder_decoder import model_config  # noqa: E402
from sesame.interop.hf_seq2seq import Seq2SeqCheckpoint, export_encoder_decoder, import_encoder_decoder  # noqa: E402
from sesame.models.encoder_decoder import STYLES, EncoderDecoder, EncoderDecoderConfig  # noqa: E402
from sesame.run import RunConfig, load_backbone, load_tokenizer, write_config  # noqa: E402
from sesame.tokenizer import train_tokenizer  # noqa: E402
from sesame.train.checkpoint import save_weights  # noqa: E402

from .conftest import config_reads, sentences  # noqa: E402

SPARE = 8  # T5's vocabulary is padded past its tokenizer's (32,100 tokens, 32,128 rows)
SENTINELS = 4
BART_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def t5_tokenizer(folder: Path) -> int:
    """A T5-like tokenizer.json: Unigram, <pad> </s> <unk> first, <extra_id_N> sentinels last, "$A </s>"."""
    words = sorted({w for s in sentences(50) for w in s.split()})
    chars = sorted({c for w in words for c in w})
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in chars] + [(f"\u2581{w}", -3.0) for w in words[:60]]
    pieces += [(f"<extra_id_{k}>", 0.0) for k in reversed(range(SENTINELS))]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, _ in pieces[:3] + pieces[-SENTINELS:]])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return tok.get_vocab_size()


def bart_tokenizer(folder: Path) -> int:
    """BART's files: vocab.json and merges.txt of a byte-level BPE with <s> <pad> </s> <unk> first, <mask> last."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(sentences(50), trainers.BpeTrainer(
        vocab_size=400, special_tokens=BART_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.model.save(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<mask>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BartTokenizer"}))
    return len(vocab)


def hf_model(model_type: str, vocab: int):
    """A seeded tiny transformers model with every weight moved off its initial value."""
    torch.manual_seed(0)
    if model_type == "t5":
        config = transformers.T5Config(vocab_size=vocab, d_model=32, d_ff=64, num_layers=2, num_decoder_layers=3,
                                       num_heads=4, d_kv=8, relative_attention_num_buckets=16,
                                       relative_attention_max_distance=40, dropout_rate=0.0, pad_token_id=0,
                                       eos_token_id=1, decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.BartConfig(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=3,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
                                         attention_dropout=0.0, activation_dropout=0.0)
        model = transformers.BartForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def checkpoint(model_type: str, folder: Path):
    """A transformers directory (save_pretrained) with its tokenizer, and the model."""
    folder.mkdir()
    size = t5_tokenizer(folder) if model_type == "t5" else bart_tokenizer(folder)
    model = hf_model(model_type, size + SPARE if model_type == "t5" else size)
    model.save_pretrained(folder)
    return model


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    return ids, torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])


def assert_same_logits(ours: EncoderDecoder, theirs, tok, start: int) -> None:
    """Equal logits at every real decoder position, the sources padded and the decoder inputs padded."""
    texts = sentences(4, seed=3)
    ids, padding = padded(tok.encode(texts), tok.specials.pad)
    targets = tok.encode([t.split(" ", 2)[-1] for t in sentences(4, seed=4)])
    decoder_ids, decoder_padding = padded([[start] + t[:-1] for t in targets], tok.specials.pad)
    assert not padding.all() and not decoder_padding.all()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=padding.long(), decoder_input_ids=decoder_ids,
                          decoder_attention_mask=decoder_padding.long()).logits
        got = ours(ids, padding=padding, decoder_ids=decoder_ids, decoder_padding=decoder_padding)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got[decoder_padding], expected[decoder_padding], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_a_checkpoint_imports_with_transformers_logits_and_comes_back_tensor_for_tensor(model_type, tmp_path):
    theirs = checkpoint(model_type, tmp_path / "hf")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert summary["family"] == model_type
    ours, tok = load_backbone(tmp_path / "run"), load_tokenizer(tmp_path / "run")
    assert isinstance(ours, EncoderDecoder) and ours.config.decoder_layers == 3
    assert_same_logits(ours, theirs, tok, theirs.config.decoder_start_token_id)

    to_hf(tmp_path / "run", tmp_path / "back")
    source, back = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "back"))
    assert sorted(back) == sorted(source)
    assert all(torch.equal(back[n], source[n]) for n in source)
    if model_type == "bart":  # the position tables' unread leading rows too, which are not zero here
        assert source["model.encoder.embed_positions.weight"][:2].abs().min() > 0
    config, returned = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "back"))
    del config["transformers_version"]
    if model_type == "bart":  # sesame forces no </s> at the length limit, and the export says so
        assert config["forced_eos_token_id"] == 2 and returned["forced_eos_token_id"] is None
        config["forced_eos_token_id"] = None
    assert {k: returned.get(k) for k in config} == config
    reloaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "back").eval()
    assert_same_logits(ours, reloaded, tok, theirs.config.decoder_start_token_id)


def test_a_routed_conversion_reads_config_json_once(tmp_path, monkeypatch):
    """T5's route (hf_seq2seq) takes the config.json from_hf read, as the Transformer stacks' converter does."""
    checkpoint("t5", tmp_path / "hf")
    reads = config_reads(monkeypatch, tmp_path / "hf")
    from_hf(tmp_path / "hf", tmp_path / "run")
    assert len(reads) == 1


def test_t5s_tokenizer_keeps_its_ids_and_sentinels_and_comes_back_as_it_was(tmp_path):
    checkpoint("t5", tmp_path / "hf")
    imported = import_encoder_decoder(tmp_path / "hf")
    tok, source = imported.tokenizer, Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    texts = sentences(20, seed=5) + ["<extra_id_0> a <extra_id_3>."]
    assert tok.encode(texts) == [e.ids for e in source.encode_batch(texts)]
    size = source.get_vocab_size()
    assert [tok.backend.token_to_id(f"<extra_id_{k}>") for k in range(SENTINELS)] == [size - 1 - k
                                                                                    for k in range(SENTINELS)]
    assert (tok.specials.pad, tok.specials.sep, tok.specials.unk) == (0, 1, 2)
    assert (tok.specials.cls, tok.specials.mask) == (size, size + 1)  # T5 has neither: two of its unused rows
    assert imported.model["vocab_size"] == size + SPARE
    export_encoder_decoder(imported, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "tokenizer.json").read_text()) == json.loads(source.to_str())
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert [auto(t)["input_ids"] for t in texts] == tok.encode(texts)


def test_barts_vocabulary_files_tokenize_as_transformers_does(tmp_path):
    checkpoint("bart", tmp_path / "hf")
    tok = import_encoder_decoder(tmp_path / "hf").tokenizer
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = sentences(20, seed=6)
    assert tok.encode(texts) == [auto(t)["input_ids"] for t in texts]
    assert [tok.specials.cls, tok.specials.pad, tok.specials.sep, tok.specials.unk] == [0, 1, 2, 3]


def sesame_run(model_type: str, folder: Path, **fields) -> tuple[EncoderDecoder, object]:
    """A run sesame made (not imported): a random encoder-decoder of the style and a tokenizer sesame trained."""
    tok = train_tokenizer(sentences(60), "unigram" if model_type == "t5" else "bpe", vocab_size=150)
    torch.manual_seed(2)
    model = EncoderDecoder(EncoderDecoderConfig(**{
        "vocab_size": tok.vocab_size, "hidden": 32, "layers": 2, "decoder_layers": 3, "heads": 4, "intermediate": 64,
        "max_positions": 256, "dropout": 0.0, "pad_id": tok.specials.pad, **STYLES[model_type], **fields,
        "decoder_start_id": tok.specials.pad if model_type == "t5" else tok.specials.sep}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder.mkdir()
    tok.save(folder / "tokenizer.json")
    save_weights(folder / "model.safetensors", {"backbone." + k: v for k, v in model.state_dict().items()})
    write_config(folder, RunConfig(kind="pretrained", family=model_type,
                                   model=model.config))
    return model.eval(), tok


@pytest.mark.parametrize("model_type, fields", [("t5", {}), ("t5", {"scale_logits": False}), ("bart", {}),
                                                ("bart", {"activation": "relu"})])
def test_a_sesame_model_exports_to_what_transformers_loads_with_its_logits(model_type, fields, tmp_path):
    ours, tok = sesame_run(model_type, tmp_path / "run", **fields)
    summary = to_hf(tmp_path / "run", tmp_path / "hf")
    assert summary["architecture"] == ("T5" if model_type == "t5" else "Bart") + "ForConditionalGeneration"
    theirs, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert theirs.config.decoder_start_token_id == ours.config.decoder_start_id
    assert_same_logits(ours, theirs.eval(), tok, ours.config.decoder_start_id)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = sentences(5, seed=7)
    assert [auto(t)["input_ids"] for t in texts] == tok.encode(texts)


def test_transformers_generates_an_exported_bart_runs_tokens_as_sesame_does(tmp_path):
    """Greedy decoding of 8 new tokens: transformers' generate on the export, as its generation config says (no
    settings of the test's), gives sesame's tokens. BartConfig forces </s> as the last token at the length limit
    unless config.json says otherwise (forced_eos_token_id, 2 by default); sesame forces nothing and export says so."""
    from sesame.decoding import GenerationConfig
    from sesame.seq2seq import generate_seq2seq

    ours, tok = sesame_run("bart", tmp_path / "run")
    torch.manual_seed(0)
    with torch.no_grad():  # moved further, the decoder's sublayers louder: else it ends every output at once
        for name, p in ours.named_parameters():
            p.add_(torch.randn_like(p) * 0.2)
            if name.startswith("decoder.") and name.endswith("out.weight"):
                p.mul_(3.0)
    save_weights(tmp_path / "run" / "model.safetensors", {"backbone." + k: v for k, v in ours.state_dict().items()})
    to_hf(tmp_path / "run", tmp_path / "hf")
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    sources = tok.encode(sentences(3, seed=8))
    got = generate_seq2seq(ours, sources, GenerationConfig(max_new_tokens=8), eos=tok.specials.sep)
    ids, padding = padded(sources, tok.specials.pad)
    with torch.no_grad():
        rows = theirs.generate(input_ids=ids, attention_mask=padding.long(), max_new_tokens=8).tolist()
    sep = tok.specials.sep
    expected = [row[1: row.index(sep, 1) + 1] if sep in row[1:] else row[1:] for row in rows]  # after the start
    assert [h.tokens + [sep] * (h.finish == "end") for h in got] == expected
    assert any(len(h.tokens) == 8 for h in got)  # a row cut at the limit, where transformers forced </s> before
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["forced_eos_token_id"] is None


def test_a_run_that_is_not_of_the_style_is_refused(tmp_path):
    sesame_run("bart", tmp_path / "run", norm="pre")
    with pytest.raises(SesameError, match=r"not a bart model: norm 'pre' \(needs 'post'\)"):
        to_hf(tmp_path / "run", tmp_path / "hf")


T5_KEYS = {"d_model": 32, "num_heads": 4, "d_kv": 8}
BART_KEYS = {"d_model": 32, "encoder_attention_heads": 4}


@pytest.mark.parametrize("model_type, given, message", [
    ("t5", {"feed_forward_proj": "gated-swish"}, "feed_forward_proj 'gated-swish' (sesame supports gelu, gelu_new, "
                                                 "gelu_pytorch_tanh, relu, gated-ACT of those)"),
    ("t5", {"d_kv": 16}, "d_kv 16 (sesame supports d_model / num_heads, 8"),
    ("bart", {"scale_embedding": True}, "scale_embedding True (sesame supports False"),
    ("bart", {"tie_word_embeddings": False}, "tie_word_embeddings False (sesame supports True"),
    ("bart", {"add_final_layer_norm": True}, "add_final_layer_norm True (sesame supports False"),
    ("bart", {"normalize_before": True}, "normalize_before True (sesame supports False: BART normalises after"),
    ("bart", {"decoder_attention_heads": 2}, "decoder_attention_heads 2 (sesame supports 4, its "
                                             "encoder_attention_heads"),
    ("bart", {"activation_function": "swish"}, "activation_function 'swish' (sesame supports gelu"),
    ("bart", {"activation_function": "gated-gelu"}, "activation_function 'gated-gelu' (sesame supports gelu, gelu_new, "
                                                    "gelu_pytorch_tanh, relu)"),  # BART's feed-forward is not gated
])
def test_configs_sesame_does_not_compute_are_refused_in_one_line(model_type, given, message):
    base = T5_KEYS if model_type == "t5" else BART_KEYS
    assert model_config(base, model_type, "config.json")["hidden"] == 32
    with pytest.raises(SesameError) as err:
        model_config({**base, **given}, model_type, "config.json")
    assert str(err.value).startswith("config.json: ") and message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("model_type, copy", [("t5", "decoder.embed_tokens.weight"), ("bart", "lm_head.weight"),
                                              ("bart", "model.decoder.embed_tokens.weight")])
def test_untied_copies_and_stray_tensors_are_refused(model_type, copy, tmp_path):
    checkpoint(model_type, tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    weights = load_file(str(path))
    shared = next(t for n, t in weights.items() if n.endswith("shared.weight"))
    save_file({**weights, copy: shared.clone()}, str(path))
    assert import_encoder_decoder(tmp_path / "hf").model_type == model_type  # an equal copy is fine
    save_file({**weights, copy: shared + 1}, str(path))
    with pytest.raises(SesameError, match=f"{copy} differ from the shared token table"):
        import_encoder_decoder(tmp_path / "hf")
    save_file({**weights, "encoder.extra.weight": shared.clone()}, str(path))
    with pytest.raises(SesameError, match="unexpected: encoder.extra.weight"):
        import_encoder_decoder(tmp_path / "hf")


def test_a_checkpoint_and_tokenizer_that_disagree_are_refused(tmp_path):
    checkpoint("t5", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "eos_token_id": 2}))
    with pytest.raises(SesameError, match=r"eos_token_id 2 is not the tokenizer's eos token \(1\)"):
        import_encoder_decoder(tmp_path / "hf")


def test_the_seq2seq_checkpoint_is_the_library_route(tmp_path):
    """import_encoder_decoder → export_encoder_decoder without a run in between gives the same directory."""
    checkpoint("bart", tmp_path / "hf")
    imported = import_encoder_decoder(tmp_path / "hf")
    assert isinstance(imported, Seq2SeqCheckpoint) and set(imported.weights) == set(
        EncoderDecoder(EncoderDecoderConfig(**imported.model)).state_dict())
    export_encoder_decoder(imported, tmp_path / "back")
    source, back = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("hf", "back"))
    assert all(torch.equal(back[n], source[n]) for n in source) and sorted(back) == sorted(source)


def test_sesame_convert_routes_both_ways_and_predict_refuses_an_encoder_decoder(tmp_path, capsys):
    from sesame.cli import main
    from sesame.interop import resolve

    checkpoint("t5", tmp_path / "hf")
    main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert (summary["family"], summary["appended_tokens"]) == ("t5", ["<s>", "<mask>"])
    main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back")])
    assert "T5ForConditionalGeneration" in capsys.readouterr().out
    with pytest.raises(SesameError, match="--generator pairs an ELECTRA"):
        from_hf(tmp_path / "hf", tmp_path / "other", generator=tmp_path / "hf")
    with pytest.raises(SesameError, match="a t5 encoder-decoder, without a sequence-classification head"):
        with resolve(tmp_path / "hf", "--model", classifier=True):
            pass
