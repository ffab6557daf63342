"""Encoder-decoder runs as the rest of sesame reads them: a T5 or BART run converted from transformers carries its
family row's objective and pooling (so it evaluates and continues pre-training); span corruption's examples that
need more sentinels than the tokenizer has are refused before anything is written; and ``evaluate --seq-len`` caps
only models with learned positions (BART), not T5's relative ones."""
from __future__ import annotations

import json
import math

import pytest

import sesame
from sesame.errors import SesameError
from sesame.families import FAMILIES
from sesame.objectives import SpanCorruption
from sesame.run import read_config
from sesame.tokenizer import train_tokenizer

from .conftest import documents, refused, sentences

transformers = pytest.importorskip("transformers")

from sesame.interop import from_hf, to_hf  # noqa: E402

from .test_encoder_decoder_interop import SENTINELS, checkpoint, sesame_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(documents(sentences(400)))
    return path


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_a_converted_run_takes_objective_and_pooling_from_its_family_row(model_type, corpus, tmp_path):
    checkpoint(model_type, tmp_path / "hf")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    config, fam = read_config(tmp_path / "run", "--model"), FAMILIES[model_type]
    assert (summary["objective"], config.pretrained.objective) == (fam.objective, fam.objective)
    assert (config.pooling, config.pretrained.objective_options, config.family) == (fam.pooling, fam.objective_options,
                                                                          model_type)
    # its objective scores text (T5's test tokenizer has 4 sentinels: 32 positions need 2)
    report = sesame.evaluate(str(tmp_path / "run"), [str(corpus)], seq_len=32)
    assert math.isfinite(report["loss"]) and report["loss"] > 0


def test_a_converted_t5_run_continues_pre_training_and_is_not_resumed(corpus, tmp_path, capsys):
    checkpoint("t5", tmp_path / "hf")
    from_hf(tmp_path / "hf", tmp_path / "run")
    metrics = sesame.pretrain([str(corpus)], str(tmp_path / "more"), family="t5", base=str(tmp_path / "run"),
                              seq_len=32, batch_size=4, max_steps=2, eval_every=2, progress=False)
    assert math.isfinite(metrics["loss"])
    config = read_config(tmp_path / "more", "--model")
    assert (config.pretrained.objective, config.base, config.model.hidden) == ("span_corruption",
                                                                               str(tmp_path / "run"), 32)
    # T5's table is wider than its tokenizer (unused rows): continuing keeps it, as it adds no words
    assert config.model.vocab_size == read_config(tmp_path / "run", "--model").model.vocab_size > len(
        json.loads((tmp_path / "run" / "tokenizer.json").read_text())["model"]["vocab"])
    assert config.pretrained.added_words == 0
    refused(["pretrain", "--resume", "--out", str(tmp_path / "run"), "--corpus", str(corpus), "--family", "t5"],
            capsys, tmp_path, "--resume: ", "converted from transformers", "sesame pretrain --from")


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_a_run_written_before_gated_and_tied_existed_still_exports(model_type, tmp_path):
    sesame_run(model_type, tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["model"] = {k: v for k, v in config["model"].items() if k not in ("gated", "tied")}
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    assert to_hf(tmp_path / "run", tmp_path / "hf")["architecture"].endswith("ForConditionalGeneration")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"] is True


@pytest.mark.parametrize("family", ["t5", "t5v1_1"])
def test_more_noise_spans_than_sentinels_are_refused_with_the_spec(family, corpus, tmp_path, capsys):
    """300 ids give a trained tokenizer 30 sentinels; 1024 positions need 57 (refused at once, naming the longest
    --seq-len that fits); a tokenizer read from a file is checked once read, before the run is written."""
    line = refused(["pretrain", "--family", family, "--size", "tiny", "--corpus", str(corpus), "--vocab-size", "300",
                    "--seq-len", "1024", "--out", str(tmp_path / "run")], capsys, tmp_path,
                   "--seq-len 1024: ", "57 noise spans", "has 30", "--vocab-size")
    fits = int(line.split("use --seq-len ")[1].split()[0])
    assert SpanCorruption.sentinels_needed(fits) <= 30 < SpanCorruption.sentinels_needed(fits + 1)
    assert not (tmp_path / "run").exists()
    refused(["pretrain", "--family", family, "--size", "tiny", "--corpus", str(corpus), "--vocab-size", "200",
             "--seq-len", "32", "--final-seq-len", "512", "--out", str(tmp_path / "run")], capsys, tmp_path,
            "--final-seq-len 512: ", "has 20", "use --final-seq-len")  # BERT's second phase: the longest examples

    tok = train_tokenizer(sentences(200), "unigram", 300, sentinels=SENTINELS)
    tok.save(tmp_path / "tok.json")
    refused(["pretrain", "--family", family, "--size", "tiny", "--corpus", str(corpus), "--tokenizer",
             str(tmp_path / "tok.json"), "--seq-len", "128", "--out", str(tmp_path / "run")], capsys, tmp_path,
            "--seq-len 128: ", f"the tokenizer {tmp_path / 'tok.json'} has {SENTINELS}", "--sentinels")
    assert not (tmp_path / "run").exists()


def test_span_corruption_without_sentinels_is_refused_before_anything_is_written(corpus, tmp_path, capsys):
    """BART's tokenizer, trained on the way or read from a file, has no sentinel tokens for span corruption: refused
    before the run directory exists (it was refused once config.json had been written)."""
    refused(["pretrain", "--family", "bart", "--objective", "span_corruption", "--size", "tiny", "--corpus",
             str(corpus), "--seq-len", "32", "--out", str(tmp_path / "run")], capsys, tmp_path,
            "--objective span_corruption: ", "--family bart trains has none", "--sentinels 100", "t5")
    train_tokenizer(sentences(200), "bpe", 300).save(tmp_path / "bpe.json")
    refused(["pretrain", "--family", "bart", "--objective", "span_corruption", "--size", "tiny", "--corpus",
             str(corpus), "--tokenizer", str(tmp_path / "bpe.json"), "--seq-len", "32", "--out", str(tmp_path / "run")],
            capsys, tmp_path, f"the tokenizer {tmp_path / 'bpe.json'} has none", "--kind bpe --sentinels 100")
    assert not (tmp_path / "run").exists()


def test_final_seq_len_past_max_positions_is_t5s_but_not_barts(corpus, tmp_path, monkeypatch, capsys):
    """--final-seq-len: T5's relative positions train on examples longer than its max_positions (512), BART's learned
    ones are capped at theirs (1024)."""
    widths, make_batch = [], SpanCorruption.make_batch

    def recorded(self, *args, **kwargs) -> dict:
        batch = make_batch(self, *args, **kwargs)
        widths.append(batch["ids"].shape[1])
        return batch

    monkeypatch.setattr(SpanCorruption, "make_batch", recorded)
    metrics = sesame.pretrain([str(corpus)], str(tmp_path / "t5"), family="t5", size="tiny", vocab_size=400,
                              seq_len=32, final_seq_len=600, batch_size=2, max_steps=10, eval_every=10, progress=False)
    assert math.isfinite(metrics["loss"])
    assert read_config(tmp_path / "t5", "--model").model.max_positions == 512
    assert 512 < max(widths) <= 600  # 600 less the </s> a window held, which T5's joined documents drop
    refused(["pretrain", "--family", "bart", "--size", "tiny", "--corpus", str(corpus), "--seq-len", "32",
             "--final-seq-len", "1025", "--out", str(tmp_path / "bart")], capsys, tmp_path,
            "--final-seq-len 1025: must exceed --seq-len 32 and be at most 1024 (the model's positions)")


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Tiny t5 and bart runs, pre-trained a step at 32 positions (T5's tokenizer has 40 sentinels)."""
    made = {}
    for family in ("t5", "bart"):
        made[family] = tmp_path_factory.mktemp(family) / "run"
        sesame.pretrain([str(corpus)], str(made[family]), family=family, size="tiny", vocab_size=400, seq_len=32,
                        batch_size=4, max_steps=1, eval_every=1, progress=False)
    return made


def test_evaluate_reads_t5_past_max_positions_with_its_relative_positions(runs, corpus):
    config = read_config(runs["t5"], "--model")
    longer = config.model.max_positions + 88  # 600 positions: 33 noise spans, within the 40 sentinels
    assert SpanCorruption.sentinels_needed(longer) <= 40
    report = sesame.evaluate(str(runs["t5"]), [str(corpus)], seq_len=longer)
    assert math.isfinite(report["loss"]) and report["tokens"] > 0
    with pytest.raises(SesameError, match=r"--seq-len 1200: .* noise spans.*has 40; use --seq-len"):
        sesame.evaluate(str(runs["t5"]), [str(corpus)], seq_len=1200)


def test_evaluate_caps_bart_at_its_learned_positions(runs, corpus, capsys):
    positions = read_config(runs["bart"], "--model").model.max_positions
    assert sesame.evaluate(str(runs["bart"]), [str(corpus)], seq_len=positions)["tokens"] > 0
    refused(["evaluate", "--model", str(runs["bart"]), "--data", str(corpus), "--seq-len", str(positions + 1)],
            capsys, runs["bart"], f"--seq-len {positions + 1}: ", f"has {positions} positions")
