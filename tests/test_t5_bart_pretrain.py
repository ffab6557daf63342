"""The t5 and bart families (Raffel et al. 2020; Lewis et al. 2020): their rows, tokenizers and objectives, and
`sesame tokenizer` → `pretrain` → `evaluate` → `pretrain --resume` on tiny data for each."""
import json

import pytest
import torch
import torch.nn.functional as F

from sesame.cli import main
from sesame.families import FAMILIES, backbone_config
from sesame.models import EncoderDecoder, EncoderDecoderConfig, build_model
from sesame.models.encoder_decoder import STYLES
from sesame.objectives import OBJECTIVES, Denoising, SpanCorruption
from sesame.objectives.seq2seq import sentence_ends
from sesame.objectives.span_corruption import SpanCorruptionOptions, raw_length, sentinel_ids
from sesame.tokenizer import SpecialIds, train_tokenizer

from .conftest import documents, sentences

pytestmark = pytest.mark.usefixtures("one_thread")

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


@pytest.fixture(scope="module")
def text():
    return sentences(300)


@pytest.fixture(scope="module")
def tokenizers(text):
    return {"t5": train_tokenizer(text, "unigram", 400, sentinels=100), "bart": train_tokenizer(text, "bpe", 400)}


def test_t5_row_is_t5_style():
    cfg = backbone_config("t5", "mini", 500, 0, specials=SPECIALS)
    assert isinstance(cfg, EncoderDecoderConfig) and cfg.to_dict()["arch"] == "encoder_decoder"
    assert (cfg.norm, cfg.norm_kind, cfg.bias, cfg.activation, cfg.scale_attention) == ("pre", "rms", False, "relu",
                                                                                      False)
    assert (cfg.relative_buckets, cfg.relative_max_distance, cfg.scale_logits) == (32, 128, True)
    assert cfg.decoder_start_id == SPECIALS.pad  # T5's decoder starts from <pad>
    assert (cfg.layers, cfg.stack("decoder").layers, cfg.hidden, cfg.heads, cfg.intermediate) == (4, 4, 256, 4, 1024)
    assert build_model(cfg.to_dict()).embed.positions is None  # a relative position bias, no position table


def test_bart_row_is_bart_style_with_learned_positions():
    cfg = backbone_config("bart", "tiny", 500, 0, specials=SPECIALS)
    assert (cfg.norm, cfg.norm_kind, cfg.bias, cfg.activation, cfg.embedding_norm) == ("post", "layer", True, "gelu",
                                                                                     True)
    assert (cfg.relative_buckets, cfg.scale_logits, cfg.max_positions) == (0, False, 1024)  # BART's 1024 positions
    assert cfg.decoder_start_id == SPECIALS.sep  # BART's decoder starts from </s>
    assert (cfg.layers, cfg.stack("decoder").layers, cfg.heads) == (2, 2, 2)
    model = build_model(cfg.to_dict())
    assert {side: model.embed.positions[side].num_embeddings for side in ("encoder", "decoder")} == {
        "encoder": 1024, "decoder": 1024}


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_rows_agree_with_their_style_and_need_the_tokenizers_ids(family):
    fam = FAMILIES[family]
    assert fam.model_options is STYLES[family]
    assert (fam.norm, fam.embedding_norm) == (STYLES[family]["norm"], STYLES[family]["embedding_norm"])
    with pytest.raises(ValueError, match="give specials"):
        backbone_config(family, "tiny", 500, 0)


def test_t5_sentinels_count_down_from_the_top_of_the_vocabulary(tokenizers, text):
    tok = tokenizers["t5"]
    assert tok.vocab_size <= 400  # --vocab-size counts the sentinels (this text has fewer pieces to learn)
    sentinels = tok.sentinels()
    assert len(sentinels) == 40  # at most a tenth of a tiny vocabulary
    assert sentinels.tolist() == sentinel_ids(tok.vocab_size, 40).tolist()  # <extra_id_0> = vocab − 1, ...
    assert tok.backend.id_to_token(tok.vocab_size - 1) == "<extra_id_0>"
    assert len(train_tokenizer(text, "unigram", 2000, sentinels=100).sentinels()) == 100
    assert len(train_tokenizer(text, "unigram", 400).sentinels()) == 0  # albert's unigram has none
    encoded = tok.encode(["a cat <extra_id_3> sleeps"], special=False)[0]
    assert tok.vocab_size - 4 in encoded and tok.decode(encoded).split() == ["a", "cat", "sleeps"]  # special


def test_bart_tokenizer_has_mask_and_finds_sentence_ends(tokenizers):
    tok = tokenizers["bart"]
    assert tok.backend.id_to_token(tok.specials.mask) == "<mask>"
    final = tok.sentence_ends()
    assert final[tok.backend.token_to_id(".")] and final[tok.specials.sep]
    assert not final[tok.encode(["cat"], special=False)[0]].any()
    ids = torch.tensor(tok.encode(["The cat runs. A dog sleeps. Birds"], special=False)[0])
    ends = sentence_ends(ids, final)
    assert tok.decode(ids[:ends[0]].tolist()) == "The cat runs." and len(ends) == 2
    assert sentence_ends(torch.tensor([9, 7, 7, 9, 8, 9]), torch.tensor([False] * 7 + [True, True, False])) == [3, 5]


def objective(family, tok, **options):
    cfg = backbone_config(family, "tiny", tok.vocab_size, tok.specials.pad, 0.0, specials=tok.specials)
    torch.manual_seed(0)
    return OBJECTIVES[FAMILIES[family].objective].build(build_model(cfg.to_dict()), tok, **options)


def windows(tok, text, length, rows=8):
    ids = torch.tensor([i for line in tok.encode(text, special=False) for i in line + [tok.specials.sep]])
    return ids[: rows * length].view(rows, length)


def generators(n):
    return [torch.Generator().manual_seed(i) for i in range(n)]


@pytest.mark.parametrize("options", [{}, {"noise_density": 0.3, "mean_span": 2}])
def test_span_corruption_fills_the_inputs_exactly_without_padding(tokenizers, text, options):
    tok = tokenizers["t5"]
    obj = objective("t5", tok, **options)
    length = SpanCorruption.window_length(32, **options)
    assert length == raw_length(32, obj.noise)[0] and length > 32
    batch = obj.make_batch(windows(tok, text, length), generators(8))
    assert batch["ids"].shape == (8, 32) and "padding" not in batch  # every input exactly seq_len, as T5's
    assert not (batch["ids"] == tok.specials.pad).any() and not (batch["targets"] == tok.specials.pad).any()
    assert (batch["targets"][:, 0] == tok.vocab_size - 1).all()  # the targets open with <extra_id_0>
    assert (batch["ids"][:, -1] == tok.specials.sep).all() and (batch["targets"][:, -1] == tok.specials.sep).all()


def test_t5_joins_documents_with_nothing_between_as_its_reduce_concat_tokens(tokenizers, text):
    """The t5 rows drop the </s> that closes each document from the windows (T5's reduce_concat_tokens joins documents
    with nothing between), so </s> ends the inputs and the targets and appears nowhere else; every row is cut to the
    shortest one's length. Runs without the option (made before it) keep the separators."""
    from sesame.objectives.span_corruption import joined

    assert FAMILIES["t5"].objective_options["separators"] is FAMILIES["t5v1_1"].objective_options["separators"] is False
    tok, sep = tokenizers["t5"], tokenizers["t5"].specials.sep
    rows = windows(tok, text, SpanCorruption.window_length(32))
    assert (rows == sep).any(1).all()  # every window crosses a document's end
    kept = joined(rows, sep)
    assert kept.shape == (8, rows.shape[1] - int((rows == sep).sum(1).max()))
    assert all(out.tolist() == [t for t in row.tolist() if t != sep][: kept.shape[1]] for row, out in zip(rows, kept))
    batch = objective("t5", tok, separators=False).make_batch(rows, generators(8))
    assert batch["ids"].shape[1] < 32  # the deviation: inputs short of --seq-len by the separators dropped
    for key in ("ids", "targets"):
        assert (batch[key][:, -1] == sep).all() and not (batch[key][:, :-1] == sep).any()
    before = objective("t5", tok).make_batch(rows, generators(8))  # an older run: the separators stay
    assert before["ids"].shape == (8, 32) and (torch.cat([before["ids"][:, :-1], before["targets"][:, :-1]], 1)
                                               == sep).any()


def test_t5_windows_read_spare_tokens_so_every_input_is_exactly_seq_len(tokenizers, text):
    """The t5 rows read each window ``spare_tokens`` longer and drop its first separators, up to that many, then its
    last tokens: the shapes are static (issue 37's leftover); a window with more separators keeps its last ones."""
    options = FAMILIES["t5"].objective_options
    assert options["spare_tokens"] == 4 == FAMILIES["t5v1_1"].objective_options["spare_tokens"]
    tok, sep = tokenizers["t5"], tokenizers["t5"].specials.sep
    length = SpanCorruption.window_length(32, **options)
    assert length == raw_length(32)[0] + 4
    rows = windows(tok, text, length)
    rows[0, 5:11] = sep  # more separators than spare tokens
    assert (rows == sep).any(1).all()
    batch = objective("t5", tok, **options).make_batch(rows, generators(8))
    assert batch["ids"].shape == (8, 32) and batch["targets"].shape[1] == SpanCorruptionOptions().lengths(length - 4)[1]
    kept = []
    for i, row in enumerate(rows.tolist()):
        drop = [p for p, t in enumerate(row) if t == sep][:4]
        expected = [t for p, t in enumerate(row) if p not in drop][:length - 4]
        spans = dict(split_at_sentinels(batch["targets"][i], tok))
        rebuilt = [t for s, piece in split_at_sentinels(batch["ids"][i], tok) for t in spans.get(s, []) + piece]
        assert rebuilt == expected
        kept.append(expected.count(sep))
    assert kept[0] >= 2 and 0 in kept  # the row of 6 and more keeps its last ones; a row of few keeps none


def split_at_sentinels(row, tok):
    """A row without its </s>, cut before each sentinel: (sentinel or None, the tokens after it)."""
    sentinels, pieces = set(tok.sentinels().tolist()), [(None, [])]
    for t in row[:-1].tolist():
        if t in sentinels:
            pieces.append((t, []))
        else:
            pieces[-1][1].append(t)
    return pieces


def test_denoising_pads_only_the_inputs_and_restores_the_clean_window(tokenizers, text):
    tok = tokenizers["bart"]
    obj = objective("bart", tok)
    clean = windows(tok, text, Denoising.window_length(32))
    batch = obj.make_batch(clean, generators(8))
    assert torch.equal(batch["targets"][:, 1:-1], clean) and batch["targets"].shape == (8, 32)
    assert torch.equal(batch["padding"], batch["ids"] != tok.specials.pad)
    assert (batch["ids"] == tok.specials.mask).any() and batch["ids"].shape[1] < 32  # infilling shortens


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_denoising_cuts_inputs_only_to_learned_positions(family, tokenizers):
    """Inputs longer than max_positions lose their last tokens before </s> for BART's learned positions; T5's relative
    ones (``--family t5 --objective denoising``) read them whole."""
    tok = tokenizers["t5" if family == "t5" else "bart"]
    cfg = backbone_config(family, "tiny", tok.vocab_size, tok.specials.pad, 0.0, 16, specials=tok.specials)
    obj = Denoising.build(build_model(cfg.to_dict()), tok)
    inputs = torch.arange(5, 25).repeat(2, 1)
    inputs[1, 12:] = tok.specials.pad  # a row that ends before the cut keeps its padding
    kept = obj.within_positions(inputs)
    if family == "t5":
        assert torch.equal(kept, inputs)
    else:
        assert torch.equal(kept[:, :15], inputs[:, :15]) and kept[:, 15].tolist() == [tok.specials.sep, tok.specials.pad]


def test_denoising_permutes_whole_sentences(tokenizers, text):
    tok = tokenizers["bart"]
    obj = objective("bart", tok, mask_ratio=0.0)  # sentence permutation alone
    clean = windows(tok, text, 62)
    noised = obj.make_batch(clean, generators(8))["ids"][:, 1:-1]
    moved = 0
    for row, out in zip(clean, noised):
        assert sorted(row.tolist()) == sorted(out.tolist())
        cut = [0, *sentence_ends(row, obj.sentence_final), len(row)]
        assert len(cut) > 4
        text = f" {' '.join(map(str, out.tolist()))} "
        for a, b in zip(cut, cut[1:]):  # each sentence (the window's cut ones too) is still in one piece
            assert f" {' '.join(map(str, row[a:b].tolist()))} " in text
        moved += not torch.equal(row, out)
    assert moved >= 6


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_loss_is_the_teacher_forced_cross_entropy_and_goes_down(family, tokenizers, text):
    tok = tokenizers[family]
    obj = objective(family, tok)
    batch = obj.make_batch(windows(tok, text, obj.window_length(32)), generators(8))
    model: EncoderDecoder = obj.backbone
    with torch.no_grad():  # the fused loss is the plain one (with T5's hidden^-0.5 inside the logits)
        logits = model(batch["ids"], decoder_ids=model.decoder_inputs(batch["targets"]), padding=batch.get("padding"))
        reference = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), reduction="sum")
        assert obj(batch).item() == pytest.approx(reference.item(), rel=1e-5)
    optimizer = torch.optim.Adam(obj.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = obj(batch) / batch["targets"].numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses))) and losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("family, kind", [("t5", ["--kind", "unigram", "--sentinels", "100"]),
                                          ("bart", ["--kind", "bpe"])])
def test_tokenizer_pretrain_evaluate_resume(family, kind, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(documents(sentences(400)))
    q = ["--no-progress"]
    assert main(q + ["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "300", *kind,
                     "--out", str(tmp_path / "tok.json")]) == 0
    run = tmp_path / "run"
    pretrain = q + ["pretrain", "--family", family, "--size", "tiny", "--corpus", str(corpus), "--tokenizer",
                    str(tmp_path / "tok.json"), "--seq-len", "32", "--batch-size", "8", "--eval-every", "2",
                    "--out", str(run)]
    assert main(pretrain + ["--max-steps", "2"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert (config["objective"], config["model"]["arch"]) == (FAMILIES[family].objective, "encoder_decoder")
    assert config["objective_options"] == FAMILIES[family].objective_options  # t5: separators false, recorded
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--data", str(corpus), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["loss"] > 0 and report["perplexity"] == pytest.approx(2.718281828 ** report["loss"], rel=1e-6)
    assert main(pretrain + ["--resume", "--max-steps", "4"]) == 0
    state = json.loads((run / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 4
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    assert [r["step"] for r in records if r["split"] == "dev"] == [2, 4]
