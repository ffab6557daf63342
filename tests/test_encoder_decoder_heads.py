"""Sequence heads on T5 and BART (issue 19): classify and regress fine-tune, evaluate and predict through the CLI;
BART's head (Lewis et al. 2020, §3.1) reads the decoder's state at each row's last end token, so padding changes
nothing; and the runs convert to and from transformers' *ForSequenceClassification with the same logits."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from sesame.cli import main
from sesame.errors import SesameError
from sesame.families import backbone_config
from sesame.models import build_model
from sesame.models.encoder_decoder import EncoderDecoderConfig
from sesame.run import FinetunedPart, RunConfig, load_tokenizer, read_config, write_config
from sesame.tasks import make_task
from sesame.tokenizer import train_tokenizer
from sesame.train.checkpoint import save_weights, write_json

from .conftest import sentences

ANIMALS = {"cat", "dog", "bird", "fish"}
KINDS = {"t5": "unigram", "bart": "bpe"}


def animals(text: str) -> int:
    return sum(w in ANIMALS for w in text.lower()[:-1].split())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """train/dev CSVs: a label (does the text name an animal?) and a score (how many animals it names)."""
    root = tmp_path_factory.mktemp("heads")
    for split, seed in (("train", 1), ("dev", 2)):
        texts = sentences(24, seed)
        (root / f"{split}-classify.csv").write_text("text,label\n" + "".join(
            f"{t},{'animal' if animals(t) else 'none'}\n" for t in texts))
        (root / f"{split}-regress.csv").write_text("text,label\n" + "".join(f"{t},{animals(t)}\n" for t in texts))
    return root


@pytest.mark.parametrize("task", ["classify", "regress"])
@pytest.mark.parametrize("family", ["t5", "bart"])
def test_finetune_evaluate_and_predict_through_the_cli(family, task, files, tmp_path, capsys, one_thread):
    train, dev, run = files / f"train-{task}.csv", files / f"dev-{task}.csv", tmp_path / "run"
    main(["--no-progress", "finetune", "--from", f"scratch:{family}:tiny", "--task", task, "--train", str(train),
          "--dev", str(dev), "--out", str(run), "--epochs", "1", "--batch-size", "8", "--max-length", "24", "--json"])
    tuned = json.loads(capsys.readouterr().out)
    config = read_config(run, "--model", ("finetuned",))
    assert (config.family, config.finetuned.task, config.pooling, config.model.arch) == (family, task, "last",
                                                                                  "encoder_decoder")
    tok = load_tokenizer(run)  # T5 reads "a </s>", as its pre-training's inputs end, never <s>; BART "<s> a </s>"
    ids = tok.encode(["a dog"])[0]
    assert ids[-1] == tok.specials.sep and (ids[0] == tok.specials.cls) == (family == "bart")
    assert tok.specials.cls not in ids[1:]
    main(["evaluate", "--model", str(run), "--data", str(dev), "--json"])
    select = "accuracy" if task == "classify" else "pearson"
    assert json.loads(capsys.readouterr().out)[select] == pytest.approx(tuned[select], abs=1e-6)
    main(["predict", "--model", str(run), "--input", str(dev)])
    predictions = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(predictions) == 24
    if task == "classify":
        assert {p["label"] for p in predictions} <= {"animal", "none"}
        assert all(sum(p["probabilities"].values()) == pytest.approx(1, abs=1e-5) for p in predictions)
    else:
        assert all(isinstance(p["score"], float) for p in predictions)


def test_other_tasks_still_refuse_an_encoder_decoder(files, tmp_path):
    with pytest.raises(SesameError, match="--task tag's head reads one stack's states"):
        make_task("tag").check_model(EncoderDecoderConfig(vocab_size=8))
    make_task("pair").check_model(EncoderDecoderConfig(vocab_size=8))  # classify, pair and regress read one


def small_model(family: str, tok) -> dict:
    """The config of a random encoder-decoder of ``family``'s row, narrower than ``tiny`` (32 wide; as the row says,
    ``decoder_layers`` None: as deep as the encoder)."""
    model = backbone_config(family, "tiny", tok.vocab_size, tok.specials.pad, 0.0, specials=tok.specials).to_dict()
    return EncoderDecoderConfig(**{**model, "hidden": 32, "heads": 4, "intermediate": 64, "max_positions": 128}
                                ).to_dict()


def head_model(family: str, *, task: str = "classify", n_out: int = 3, pooling: str = "last"):
    """A tiny random classifier (or regressor) of ``family`` in eval mode, every weight moved off its start (so that
    outputs are far from 0), and its tokenizer."""
    tok = train_tokenizer(sentences(60), KINDS[family], vocab_size=150)
    torch.manual_seed(3)
    model = make_task(task).build(build_model(small_model(family, tok)), n_out, pooling, 0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval(), tok


def batch(tok, texts: list[str], pad_columns: int = 0) -> dict[str, torch.Tensor]:
    task = make_task("classify")
    features = task.features([{"text": t} for t in texts], tok, 64, [], False)
    out = task.collate(features, tok.specials.pad)
    if pad_columns:
        out["ids"] = torch.cat([out["ids"], out["ids"].new_full((len(texts), pad_columns), tok.specials.pad)], 1)
        out["padding"] = torch.cat([out["padding"], out["padding"].new_zeros(len(texts), pad_columns)], 1)
    return out


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_the_head_reads_the_decoders_state_at_the_last_end_token(family, one_thread):
    model, tok = head_model(family)
    texts = sentences(4, seed=9)
    b = batch(tok, texts)
    assert not b["padding"].all()  # rows of different lengths
    with torch.no_grad():
        memory = model.backbone.encode(b["ids"], b["padding"])
        states = model.backbone.decode(model.backbone.decoder_inputs(b["ids"]), memory)
        ends = [max(i for i, t in enumerate(row) if t == tok.specials.sep) for row in b["ids"].tolist()]
        read = states[torch.arange(len(texts)), torch.tensor(ends)]
        assert torch.allclose(model.pool(b["ids"], None, b["padding"]), model.pooler(read), atol=1e-6)
        # the state one position earlier is another one: the end token's is what is read
        assert not torch.allclose(model.pooler(read), model.pooler(states[torch.arange(4), torch.tensor(ends) - 1]))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_padding_changes_nothing(family, one_thread):
    """Alone, batched beside longer rows, with pad columns appended, or with other ids in the padded positions:
    the same outputs; a token before the end token changes them."""
    model, tok = head_model(family)
    texts = sentences(5, seed=11)
    with torch.no_grad():
        together = model.outputs(batch(tok, texts))
        alone = torch.cat([model.outputs(batch(tok, [t])) for t in texts])
        wider = model.outputs(batch(tok, texts, pad_columns=7))
        b = batch(tok, texts, pad_columns=3)
        b["ids"] = b["ids"].masked_fill(~b["padding"], tok.specials.unk)  # what sits under the padding is not read
        masked = model.outputs(b)
        b = batch(tok, texts)
        b["ids"][:, 1] = tok.specials.unk
        changed = model.outputs(b)
    assert together.abs().max() > 0.01
    for other in (alone, wider, masked):
        torch.testing.assert_close(other, together, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(changed, together, atol=1e-4)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_every_input_ends_with_the_end_token_even_truncated_pairs(family):
    _, tok = head_model(family)
    a, b = sentences(6, seed=3), sentences(6, seed=4)
    for length in (8, 64):
        for feature in make_task("pair").features([{"text": x, "pair": y} for x, y in zip(a, b)], tok, length, [],
                                                  False):
            assert feature["ids"][-1] == tok.specials.sep and len(feature["ids"]) <= length


def test_other_poolings_read_the_encoder(one_thread):
    """--pooling mean on an encoder-decoder averages its encoder's states over the real tokens (an older t5 run
    records mean), whatever the padding."""
    model, tok = head_model("t5", pooling="mean")
    texts = sentences(3, seed=5)
    b = batch(tok, texts, pad_columns=2)
    with torch.no_grad():
        states = model.backbone.encode(b["ids"], b["padding"]).states
        mean = torch.stack([states[i, b["padding"][i]].mean(0) for i in range(3)])
        torch.testing.assert_close(model.pool(b["ids"], None, b["padding"]), mean)
        torch.testing.assert_close(model.outputs(b), torch.cat([model.outputs(batch(tok, [t])) for t in texts]),
                                   atol=1e-5, rtol=1e-5)


# -- transformers' T5ForSequenceClassification and BartForSequenceClassification ------------------------------------

def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    return ids, torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])


def sesame_classifier(family: str, folder, task: str = "classify"):
    """A fine-tuned run written by hand (:func:`head_model`, its labels and tokenizer); returns the model and
    tokenizer."""
    labels = ["negative", "neutral", "positive"] if task == "classify" else []
    head, tok = head_model(family, task=task, n_out=len(labels) or 1)
    folder.mkdir()
    tok.save(folder / "tokenizer.json")
    save_weights(folder / "model.safetensors", head.state_dict())
    if labels:
        write_json(folder / "labels.json", labels)
    job = make_task(task)
    write_config(folder, RunConfig(kind="finetuned", family=family, pooling="last", model=head.backbone.config,
                                   max_length=40,
                                   finetuned=FinetunedPart(task=task, task_options=job.options(), select=job.select)))
    return head, tok


def hf_logits(directory, ids, padding):
    transformers = pytest.importorskip("transformers")
    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(directory,
                                                                                    output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with torch.no_grad():
        return theirs.eval()(input_ids=ids, attention_mask=padding.long()).logits, theirs


@pytest.mark.parametrize("family, task", [("t5", "classify"), ("bart", "classify"), ("bart", "regress")])
def test_a_run_exports_to_transformers_classifier_and_back_with_the_same_logits(family, task, tmp_path):
    from sesame.interop import from_hf, to_hf
    from sesame.pipelines.evaluate import load

    ours, tok = sesame_classifier(family, tmp_path / "run", task)
    summary = to_hf(tmp_path / "run", tmp_path / "hf")
    assert summary["architecture"] == ("T5" if family == "t5" else "Bart") + "ForSequenceClassification"
    ids, padding = padded(tok.encode(sentences(4, seed=7)), tok.specials.pad)
    assert not padding.all()
    expected, theirs = hf_logits(tmp_path / "hf", ids, padding)
    with torch.no_grad():
        got = ours.outputs({"ids": ids, "padding": padding})
    assert expected.abs().max() > 1e-2
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    if task == "classify":
        assert theirs.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    else:
        assert (theirs.config.num_labels, theirs.config.problem_type) == (1, "regression")
    assert from_hf(tmp_path / "hf", tmp_path / "back")["task"] == task
    back = load(tmp_path / "back")
    assert (back.config.pooling, back.config.max_length, back.labels) == ("last", 40, read_labels(tmp_path / "run"))
    with torch.no_grad():
        torch.testing.assert_close(back.model.outputs({"ids": ids, "padding": padding}), expected, atol=1e-4,
                                   rtol=1e-4)


def read_labels(run) -> list[str]:
    path = run / "labels.json"
    return json.loads(path.read_text()) if path.exists() else []


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_a_transformers_classifier_imports_and_predicts_with_its_logits(family, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from sesame.pipelines.evaluate import load

    from .test_encoder_decoder_interop import SPARE, bart_tokenizer, t5_tokenizer

    folder = tmp_path / "hf"
    folder.mkdir()
    size = t5_tokenizer(folder) + SPARE if family == "t5" else bart_tokenizer(folder)
    torch.manual_seed(0)
    if family == "t5":
        config = transformers.T5Config(vocab_size=size, d_model=32, d_ff=64, num_layers=2, num_decoder_layers=3,
                                       num_heads=4, d_kv=8, relative_attention_num_buckets=16,
                                       relative_attention_max_distance=40, dropout_rate=0.0, pad_token_id=0,
                                       eos_token_id=1, decoder_start_token_id=0, num_labels=2)
    else:
        config = transformers.BartConfig(vocab_size=size, d_model=32, encoder_layers=2, decoder_layers=3,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, num_labels=2)
    theirs = transformers.AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    theirs.save_pretrained(folder)
    main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "run"), "--json"])
    assert json.loads(capsys.readouterr().out)["task"] == "classify"
    predictor = load(tmp_path / "run")
    texts = sentences(4, seed=8)
    ids, padding = padded(predictor.tokenizer.encode(texts), predictor.tokenizer.specials.pad)
    assert not padding.all()
    with torch.no_grad():
        expected = theirs.eval()(input_ids=ids, attention_mask=padding.long()).logits
        torch.testing.assert_close(predictor.model.outputs({"ids": ids, "padding": padding}), expected, atol=1e-4,
                                   rtol=1e-4)
    labels = [["LABEL_0", "LABEL_1"][i] for i in expected.argmax(1).tolist()]
    assert [p["label"] for p in predictor.predict(texts)] == labels
    assert [p["label"] for p in load(folder).predict(texts)] == labels  # the directory itself, converted on the way


def test_a_head_transformers_cannot_hold_is_refused(tmp_path):
    from sesame.interop import to_hf

    sesame_classifier("bart", tmp_path / "run")
    config = read_config(tmp_path / "run", "--model", ("finetuned",))
    write_config(tmp_path / "run", replace(config, pooling="mean"))
    with pytest.raises(SesameError, match=r"pooling 'mean'; transformers' classifier reads the decoder's state at "
                                          r"the last end token of one sequence \(pooling last\)"):
        to_hf(tmp_path / "run", tmp_path / "hf")
