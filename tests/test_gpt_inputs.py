"""GPT's input transformations (Radford et al. 2018, §3.3): start, delimiter and extract tokens added
when a gpt run is fine-tuned, and nothing added for other families or twice."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import sesame
from sesame.pipelines.finetune import load_pretrained as _load_pretrained
from sesame.errors import SesameError
from sesame.families import get_family
from sesame.inputs import INPUT_TOKENS, grow_token_embedding
from sesame.models import TransformerConfig
from sesame.run import RunConfig, build_backbone, load_tokenizer, read_config
from sesame.tasks import make_task
from sesame.tasks.classify import SequenceModel
from sesame.tokenizer import train_tokenizer
from sesame.train.checkpoint import load_weights

from .conftest import sentences

FAST = dict(epochs=1, batch_size=8, max_length=24, lr=1e-3, progress=False)


def add_input_tokens(config: RunConfig, tok) -> tuple[bool, RunConfig]:
    """What fine-tuning does to a new task model's tokenizer: its family's input format frames it; whether its
    vocabulary grew, and ``config`` with the backbone config framed for it."""
    framed = get_family(config.family).inputs.frame(config.model, tok)
    return framed.vocab_size != config.model.vocab_size, replace(config, model=framed)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A tiny pretrained gpt run (``gpt``) and pair files whose label says whether the first text is longer."""
    root = tmp_path_factory.mktemp("gpt-inputs")
    (root / "corpus.txt").write_text("\n".join(sentences(400, seed=3)) + "\n")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sesame.pretrain([str(root / "corpus.txt")], str(root / "gpt"), family="gpt", size="tiny", vocab_size=200,
                    seq_len=32, batch_size=8, max_steps=2, progress=False)
    torch.set_num_threads(threads)
    for split, seed, n in (("train", 20, 48), ("dev", 21, 16)):
        a, b = sentences(n, seed), sentences(n, seed + 100)
        rows = [f'"{x}","{y}",{"longer" if len(x) > len(y) else "not"}' for x, y in zip(a, b)]
        (root / f"{split}.csv").write_text("sentence1,sentence2,label\n" + "\n".join(rows) + "\n")
    return root


def test_gpt_fine_tuning_adds_the_three_tokens_and_reloads(data, tmp_path, one_thread):
    """A symmetric pair run with the auxiliary LM: the template, the grown vocabulary, --resume, predict."""
    base_vocab = load_tokenizer(data / "gpt").vocab_size
    run = tmp_path / "pair"
    sesame.finetune(str(data / "gpt"), str(data / "train.csv"), str(data / "dev.csv"), str(run), task="pair",
                    task_options={"symmetric": True}, lm_weight=0.5, **FAST)
    tok = load_tokenizer(run)
    start, delim, extract = ids = [tok.backend.token_to_id(t) for t in INPUT_TOKENS]
    assert ids == [base_vocab, base_vocab + 1, base_vocab + 2] and tok.vocab_size == base_vocab + 3
    a, b = (tok.encode([t], special=False)[0] for t in ("The cat sleeps.", "A dog runs."))
    assert tok.encode(["The cat sleeps."]) == [[start, *a, extract]]
    assert tok.encode(["The cat sleeps."], ["A dog runs."]) == [[start, *a, delim, *b, extract]]
    assert tok.encode(["The cat sleeps."], ["A dog runs."], max_length=5)[0][-1] == extract  # kept when truncating
    config = read_config(run, "--model", ("finetuned",))
    assert config.model.vocab_size == base_vocab + 3
    assert load_weights(run / "model.safetensors")["backbone.embed.tokens.weight"].shape[0] == base_vocab + 3
    tokenizer_json = (run / "tokenizer.json").read_text()

    sesame.finetune(str(data / "gpt"), str(data / "train.csv"), str(data / "dev.csv"), str(run), task="pair",
                    task_options={"symmetric": True}, lm_weight=0.5, resume=True, **{**FAST, "epochs": 2})
    assert (run / "tokenizer.json").read_text() == tokenizer_json  # --resume adds nothing
    assert read_config(run, "--model", ("finetuned",)).model.vocab_size == base_vocab + 3
    predictions = sesame.load(run).predict([{"text": "The cat sleeps.", "pair": "The dog runs."}])
    assert set(predictions[0]["probabilities"]) == {"longer", "not"}

    again = tmp_path / "again"  # a fine-tuned gpt run fine-tuned again already has the tokens
    sesame.finetune(str(run), str(data / "train.csv"), str(data / "dev.csv"), str(again), task="pair", **FAST)
    assert load_tokenizer(again).vocab_size == base_vocab + 3
    assert read_config(again, "--model", ("finetuned",)).model.vocab_size == base_vocab + 3


def test_pretrained_rows_are_copied_and_the_new_rows_are_fresh(data, tmp_path):
    config = read_config(data / "gpt", "--from", ("pretrained",))
    tok = load_tokenizer(data / "gpt")
    vocab = tok.vocab_size
    grew, config = add_input_tokens(config, tok)
    assert grew and config.model.vocab_size == vocab + 3
    assert not add_input_tokens(config, tok)[0]  # once only
    model = SequenceModel(build_backbone(config), 2, "last")
    _load_pretrained(model, data / "gpt")
    pretrained = load_weights(data / "gpt" / "model.safetensors")["backbone.embed.tokens.weight"]
    grown = model.backbone.embed.tokens.weight.detach()
    assert grown.shape[0] == vocab + 3 and torch.equal(grown[:vocab], pretrained)
    new = grown[vocab:]
    assert not (new[:, None] == pretrained[None]).all(-1).any()  # no new row equals an old one
    assert 0.005 < new.std().item() < 0.05  # N(0, 0.02)
    weights = {"embed.tokens.weight": pretrained}
    assert grow_token_embedding(weights, vocab + 5) is weights  # only the input tokens' rows are added


def test_the_classifier_reads_the_extract_token(data):
    config = read_config(data / "gpt", "--from", ("pretrained",))
    tok = load_tokenizer(data / "gpt")
    _, config = add_input_tokens(config, tok)
    extract = tok.backend.token_to_id("<extract>")
    task = make_task("pair")
    rows = [{"text": "The cat sleeps.", "pair": "A dog runs over the old stone road.", "label": "x"},
            {"text": "Birds sing.", "pair": "Fish.", "label": "x"}]
    batch = task.collate(task.features(rows, tok, 32, ["x"], causal=True), tok.specials.pad)
    torch.manual_seed(0)
    model = SequenceModel(build_backbone(config), 2, "last", 0.0).eval()
    hidden = model.backbone(batch["ids"], padding=batch["padding"])
    pooled = model.pool(batch["ids"], None, batch["padding"])
    for i in range(len(rows)):
        at = int((batch["ids"][i] == extract).nonzero())
        assert batch["padding"][i].sum() == at + 1 and torch.allclose(pooled[i], hidden[i, at])


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_other_families_keep_their_encoding(family):
    tok = train_tokenizer(sentences(100), "wordpiece" if family == "bert" else "bpe", 200)
    before = tok.backend.to_str()
    config = RunConfig(kind="pretrained", family=family, model=TransformerConfig(vocab_size=tok.vocab_size))
    grew, config = add_input_tokens(config, tok)
    assert not grew
    assert tok.backend.to_str() == before and config.model.vocab_size == tok.vocab_size


def test_a_tokenizer_holding_one_of_the_tokens_is_refused():
    tok = train_tokenizer(sentences(100), "bpe", 200)
    tok.backend.add_tokens(["<delim>"])
    with pytest.raises(SesameError, match="already holds some of <start>, <delim>, <extract>"):
        add_input_tokens(RunConfig(kind="pretrained", family="gpt",
                                   model=TransformerConfig(vocab_size=tok.vocab_size)), tok)


def test_scratch_gpt_multiple_choice_uses_the_tokens(tmp_path, one_thread):
    rows = [{"context": s, "choices": [s.split()[1], "stone", "cloud"], "label": 0} for s in sentences(24, seed=5)]
    for name, part in (("train", rows[:16]), ("dev", rows[16:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    run = tmp_path / "mc"
    sesame.finetune("scratch:gpt:tiny", str(tmp_path / "train.jsonl"), str(tmp_path / "dev.jsonl"), str(run),
                    task="multiple_choice", **FAST)
    tok = load_tokenizer(run)
    start, delim, extract = (tok.backend.token_to_id(t) for t in INPUT_TOKENS)
    assert read_config(run, "--model", ("finetuned",)).model.vocab_size == tok.vocab_size == extract + 1
    task = make_task("multiple_choice")
    feature = task.features(task.read(str(tmp_path / "dev.jsonl"))[:1], tok, 24, [], causal=True)[0]
    assert all(ids[0] == start and ids[-1] == extract and ids.count(delim) == 1 for ids in feature["ids"])
    prediction = sesame.load(run).predict([{"text": rows[0]["context"], "choices": rows[0]["choices"]}])[0]
    assert len(prediction["probabilities"]) == 3
