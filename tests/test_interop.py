"""Hugging Face interop: tiny seeded transformers models of every supported architecture convert to
sesame runs with the same hidden states, and back to directories transformers loads with no missing or
unexpected weights; tokenizers tokenize as AutoTokenizer does; bad checkpoints fail naming what is wrong."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from sesame import api  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.pipelines.finetune import load_pretrained, starting_point  # noqa: E402
from sesame.sources import resolve_source  # noqa: E402
from sesame.specs import FinetuneSpec  # noqa: E402
from sesame.interop import from_hf, to_hf  # noqa: E402
from sesame.run import build_backbone, load_backbone, load_tokenizer  # noqa: E402
from sesame.tasks import make_task  # noqa: E402
from sesame.tasks.classify import SequenceModel  # noqa: E402
from sesame.train.checkpoint import load_weights, read_json, save_weights, write_json  # noqa: E402

from .conftest import config_reads, sentences, shared_data  # noqa: E402

HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 2, 64, 64
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
ALBERT_SPECIALS = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
BERT_SIZES = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN)


def write_wordpiece(folder: Path) -> int:
    tokens = BERT_SPECIALS + [f"w{i}" for i in range(95)]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return len(tokens)


def write_byte_level(folder: Path, first: list[str], last: list[str]) -> int:
    """vocab.json: the special tokens around the 256 byte symbols; no merges."""
    tokens = first + sorted(pre_tokenizers.ByteLevel.alphabet()) + last
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return len(tokens)


def write_unigram(folder: Path) -> int:
    pieces = [(t, 0.0) for t in ALBERT_SPECIALS] + [(f"\u2581w{i}", -1.0 - i / 100) for i in range(95)]
    transformers.AlbertTokenizer(vocab=pieces).save_pretrained(folder)
    return len(pieces)


def hf_config(model_type: str, vocab: int, **extra) -> transformers.PretrainedConfig:
    if model_type == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN,
                                       n_positions=POSITIONS, bos_token_id=vocab - 1, eos_token_id=vocab - 1, **extra)
    if model_type == "distilbert":
        return transformers.DistilBertConfig(vocab_size=vocab, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                             hidden_dim=FFN, max_position_embeddings=POSITIONS, **extra)
    cls = transformers.AutoConfig.for_model(model_type).__class__
    options = {"roberta": dict(type_vocab_size=1, pad_token_id=1, max_position_embeddings=POSITIONS + 2),
               "electra": dict(embedding_size=16), "albert": dict(embedding_size=16)}.get(model_type, {})
    return cls(vocab_size=vocab, **BERT_SIZES, **{"max_position_embeddings": POSITIONS, **options, **extra})


TOKENIZERS = {
    "bert": write_wordpiece, "electra": write_wordpiece, "distilbert": write_wordpiece, "albert": write_unigram,
    "roberta": lambda folder: write_byte_level(folder, ROBERTA_SPECIALS[:4], ["<mask>"]),
    "gpt2": lambda folder: write_byte_level(folder, [], ["<|endoftext|>"]),
}
CASES = {  # name: (model_type, config options)
    "bert": ("bert", {}), "roberta": ("roberta", {}), "electra": ("electra", {}), "albert": ("albert", {}),
    "albert-unshared": ("albert", {"num_hidden_groups": LAYERS}), "distilbert": ("distilbert", {}),
    "gpt2": ("gpt2", {}),
}


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter moved off its initial value (biases are zero and LayerNorms one at init, which
    would hide a bias or LayerNorm mapped to the wrong place)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def make_hf(folder: Path, model_type: str, head: str = "AutoModel", **options) -> torch.nn.Module:
    """A seeded tiny transformers model of ``model_type`` with its tokenizer files, saved in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = TOKENIZERS[model_type](folder)
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, head).from_config(hf_config(model_type, vocab, **options)))
    model.save_pretrained(folder)
    return model


def batch(vocab: int, avoid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three right-padded sequences (lengths 9, 6, 3) of random ids other than ``avoid`` (the pad id)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab - 1, (3, 9), generator=generator)
    ids[ids == avoid] = 5
    mask = torch.arange(9) < torch.tensor([9, 6, 3])[:, None]
    return ids.masked_fill(~mask, avoid), mask


def hf_hidden(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).last_hidden_state


def close_at(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, tol: float = 1e-4) -> float:
    diff = float((a - b)[mask].abs().max())
    assert diff <= tol, diff
    return diff


def loaded(folder: Path, head: str = "AutoModel") -> torch.nn.Module:
    model, info = getattr(transformers, head).from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


@pytest.mark.parametrize("case", CASES)
def test_round_trip_parity(tmp_path: Path, case: str, one_thread) -> None:
    model_type, options = CASES[case]
    original = make_hf(tmp_path / "hf", model_type, **options)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert summary["model_type"] == model_type
    ids, mask = batch(original.config.vocab_size, original.config.pad_token_id or 0)
    expected = hf_hidden(original, ids, mask)
    with torch.no_grad():
        ours = load_backbone(tmp_path / "run")(ids, padding=mask)
    close_at(ours, expected, mask)

    to_hf(tmp_path / "run", tmp_path / "back")
    back = loaded(tmp_path / "back")
    assert back.config.vocab_size == original.config.vocab_size
    close_at(hf_hidden(back, ids, mask), expected, mask, 1e-5)


def test_albert_without_factorisation(tmp_path: Path, one_thread) -> None:
    """E == H: AlbertModel still has its embedding projection, sesame none. An identity projection
    imports (and is written back on export, so transformers finds no missing weight); another is refused."""
    original = make_hf(tmp_path / "hf", "albert", embedding_size=HIDDEN)
    mapping = original.encoder.embedding_hidden_mapping_in
    with torch.no_grad():
        mapping.weight.copy_(torch.eye(HIDDEN))
        mapping.bias.zero_()
    original.save_pretrained(tmp_path / "hf")
    from_hf(tmp_path / "hf", tmp_path / "run")
    ids, mask = batch(original.config.vocab_size, 0)
    expected = hf_hidden(original, ids, mask)
    with torch.no_grad():
        close_at(load_backbone(tmp_path / "run")(ids, padding=mask), expected, mask)
    to_hf(tmp_path / "run", tmp_path / "back")
    close_at(hf_hidden(loaded(tmp_path / "back"), ids, mask), expected, mask, 1e-5)  # loaded: nothing missing

    with torch.no_grad():
        mapping.weight.mul_(2)
    original.save_pretrained(tmp_path / "hf")
    with pytest.raises(SesameError, match="embedding_hidden_mapping_in is not the identity"):
        from_hf(tmp_path / "hf", tmp_path / "refused")


def test_roberta_positions_and_types(tmp_path: Path) -> None:
    """RoBERTa's position table loses its padding_idx + 1 leading rows and its one token-type row is doubled."""
    make_hf(tmp_path / "hf", "roberta")
    from_hf(tmp_path / "hf", tmp_path / "run")
    config = read_json(tmp_path / "run" / "config.json")["model"]
    assert config["max_positions"] == POSITIONS and config["type_vocab_size"] == 2 and config["pad_id"] == 1
    to_hf(tmp_path / "run", tmp_path / "back")
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["max_position_embeddings"] == POSITIONS + 2 and back["type_vocab_size"] == 1


def test_gpt2_gets_sesame_roles_and_loses_them_on_export(tmp_path: Path) -> None:
    """GPT-2 has one special token: sesame's five roles are appended as copies of it and dropped on the way back."""
    original = make_hf(tmp_path / "hf", "gpt2")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert summary["appended_tokens"] == ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
    tok = load_tokenizer(tmp_path / "run")
    eot = tok.backend.token_to_id("<|endoftext|>")
    rows = load_weights(tmp_path / "run" / "model.safetensors")["backbone.embed.tokens.weight"]
    assert rows.shape[0] == original.config.vocab_size + 5
    assert all(torch.equal(rows[i], rows[eot]) for i in tok.specials.all)
    to_hf(tmp_path / "run", tmp_path / "back")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert len(hf_tok) == original.config.vocab_size and hf_tok.pad_token is None
    assert hf_tok.eos_token == "<|endoftext|>"


@pytest.mark.parametrize("model_type", ["bert", "electra"])
def test_pytorch_bin_and_masked_lm_checkpoint(tmp_path: Path, model_type: str) -> None:
    """pytorch_model.bin (read with weights_only) of a *ForMaskedLM (for ELECTRA: its generator), with
    TensorFlow-era LayerNorm names: the base model's prefix is dropped and the MLM head imported as the
    mlm objective (tests/test_interop_heads.py checks its logits)."""
    model = make_hf(tmp_path / "hf", model_type, head="AutoModelForMaskedLM")
    (tmp_path / "hf" / "model.safetensors").unlink()
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in model.state_dict().items()}
    torch.save(legacy, tmp_path / "hf" / "pytorch_model.bin")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["objective"], summary["dropped_heads"], summary["pooler"]) == ("mlm", [], False)
    ids, mask = batch(100, 0)
    with torch.no_grad():
        ours = load_backbone(tmp_path / "run")(ids, padding=mask)
    close_at(ours, hf_hidden(model.base_model, ids, mask), mask)


def test_sharded_safetensors(tmp_path: Path) -> None:
    model = make_hf(tmp_path / "hf", "bert")
    (tmp_path / "hf" / "model.safetensors").unlink()
    model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1
    from_hf(tmp_path / "hf", tmp_path / "run")
    ids, mask = batch(100, 0)
    with torch.no_grad():
        ours = load_backbone(tmp_path / "run")(ids, padding=mask)
    close_at(ours, hf_hidden(model, ids, mask), mask)


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_finetune_starts_from_a_converted_run(tmp_path: Path, model_type: str) -> None:
    """What ``finetune --from RUN`` does before training: the run's config and tokenizer, then its
    backbone (and BERT's pooler, for a cls head) copied into the task model."""
    make_hf(tmp_path / "hf", model_type)
    from_hf(tmp_path / "hf", tmp_path / "run")
    spec = FinetuneSpec.of(str(tmp_path / "run"), "train.csv", "dev.csv", str(tmp_path / "tuned"), dropout=0.1)
    config, tok = starting_point(resolve_source(spec.base, "--from"), tmp_path / "run", spec, [])
    model = make_task("classify").build(build_backbone(config), 2, config.pooling, 0.1)
    load_pretrained(model, tmp_path / "run")
    weights = load_weights(tmp_path / "run" / "model.safetensors")
    assert torch.equal(model.backbone.embed.tokens.weight, weights["backbone.embed.tokens.weight"])
    if model_type == "bert":
        assert torch.equal(model.pooler[0].weight, weights["pooler.0.weight"])
    assert config.pooling == ("cls" if model_type == "bert" else "last")


def test_a_transformers_source_s_config_json_is_read_once(tmp_path: Path, monkeypatch) -> None:
    """``--from DIR`` resolves the source and converts it on reading its config.json once; so does ``convert``."""
    make_hf(tmp_path / "hf", "bert")
    reads = config_reads(monkeypatch, tmp_path / "hf")
    source = resolve_source(str(tmp_path / "hf"), "--from")
    with source.open() as run:
        assert (run / "model.safetensors").is_file() and source.hf["model_type"] == "bert"
    assert len(reads) == 1
    from_hf(tmp_path / "hf", tmp_path / "run")
    assert len(reads) == 2


def test_a_converted_run_fine_tunes_and_remembers_its_source(tmp_path: Path, labeled, one_thread) -> None:
    make_hf(tmp_path / "hf", "distilbert")
    from_hf(tmp_path / "hf", tmp_path / "run")
    with pytest.raises(SesameError, match="converted from distilbert without its pre-training heads"):
        api.evaluate(str(tmp_path / "run"), [str(labeled[0])])
    train, dev = labeled
    api.finetune(str(tmp_path / "run"), str(train), str(dev), str(tmp_path / "tuned"), epochs=1, batch_size=16,
                 max_length=32, progress=False)
    assert read_json(tmp_path / "tuned" / "config.json")["hf"]["model_type"] == "distilbert"


def fine_tuned(run: Path, base: Path, labels: tuple[str, ...] = ("neg", "pos")) -> None:
    """A fine-tuned classify run with the config.json keys ``finetune`` writes, made by hand from
    ``base`` (no training)."""
    config = read_json(base / "config.json")
    run.mkdir()
    (run / "tokenizer.json").write_bytes((base / "tokenizer.json").read_bytes())
    write_json(run / "labels.json", list(labels))
    write_json(run / "config.json", {
        "kind": "finetuned", "task": "classify", "task_options": make_task("classify").options(),
        "family": config["family"], "size": config["size"], "pooling": "cls", "model": config["model"],
        "base": str(base), "max_length": 32, "select": "accuracy", "hf": config["hf"]})
    weights = load_weights(base / "model.safetensors")
    torch.manual_seed(2)
    hidden = config["model"]["hidden"]
    weights.setdefault("pooler.0.weight", torch.randn(hidden, hidden) * 0.1)
    weights.setdefault("pooler.0.bias", torch.randn(hidden) * 0.1)
    save_weights(run / "model.safetensors", {**weights, "head.weight": torch.randn(len(labels), hidden) * 0.1,
                                             "head.bias": torch.randn(len(labels)) * 0.1})


@pytest.mark.parametrize("model_type", ["bert", "roberta", "albert"])
def test_classifier_export(tmp_path: Path, model_type: str, one_thread) -> None:
    make_hf(tmp_path / "hf", model_type)
    from_hf(tmp_path / "hf", tmp_path / "base")
    fine_tuned(tmp_path / "run", tmp_path / "base")
    config = read_json(tmp_path / "run" / "config.json")
    model = SequenceModel(load_backbone(tmp_path / "run"), 2, "cls", 0.0)
    model.load_state_dict(load_weights(tmp_path / "run" / "model.safetensors"))
    ids, mask = batch(config["model"]["vocab_size"], config["model"]["pad_id"])
    with torch.no_grad():
        ours = model.eval().outputs({"ids": ids, "padding": mask})
    summary = to_hf(tmp_path / "run", tmp_path / "out")
    assert summary["architecture"].endswith("ForSequenceClassification")
    hf = loaded(tmp_path / "out", "AutoModelForSequenceClassification")
    assert hf.config.id2label == {0: "neg", 1: "pos"}
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask.long()).logits
    assert float((ours - theirs).abs().max()) <= 1e-5


@pytest.mark.parametrize("model_type, reason", [
    ("electra", "electra's sequence classifier does not match sesame's: its head applies GELU"),
    ("gpt2", "gpt2's sequence classifier does not match sesame's: GPT2ForSequenceClassification's score layer"),
    ("distilbert", "distilbert's sequence classifier does not match sesame's: its head is a dense layer with ReLU"),
])
def test_classifier_export_refused_where_heads_differ(tmp_path: Path, model_type: str, reason: str) -> None:
    make_hf(tmp_path / "hf", model_type)
    from_hf(tmp_path / "hf", tmp_path / "base")
    fine_tuned(tmp_path / "run", tmp_path / "base")
    with pytest.raises(SesameError, match=reason):
        to_hf(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- tokenizers on real text -------------------------------------------------------------------------

def airline_texts() -> list[str]:
    path = shared_data() / "airline" / "dev.csv"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    column = "text" if "text" in rows[0] else next(iter(rows[0]))
    return [row[column] for row in rows[:40]] + ["Special tokens <mask>, [MASK], <s> and <|endoftext|> stay whole."]


def squad_sample(n: int = 200) -> tuple[list[str], list[str]]:
    """(questions, their contexts): the first question of every third paragraph of SQuAD dev, at most n
    (Wikipedia prose: accents, Greek, Cyrillic, IPA, long passages)."""
    path = shared_data() / "squad" / "dev.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    chosen = [p for article in articles for p in article["paragraphs"]][::3][:n]
    return [p["qas"][0]["question"] for p in chosen], [p["context"] for p in chosen]


def trained(kind: str, texts: list[str], specials: list[str]) -> Tokenizer:
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([t.lower() for t in texts] if kind == "wordpiece" else texts, trainer)
    return tok


@pytest.mark.parametrize("model_type, options", [("bert", {}), ("bert", {"do_lower_case": False}),
                                                 ("roberta", {}), ("gpt2", {}), ("gpt2", {"add_bos_token": True})])
def test_tokenizer_parity_on_real_text(tmp_path: Path, model_type: str, options: dict, one_thread) -> None:
    """WordPiece from vocab.txt (uncased and cased), byte-level BPE from vocab.json + merges.txt:
    sesame's tokenizer gives AutoTokenizer's ids for texts and pairs (airline tweets; SQuAD questions
    and contexts, as pairs in both orders); so does the exported tokenizer, and a run imported again
    from its tokenizer.json."""
    texts = airline_texts()
    questions, contexts = squad_sample()
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps(options))
    specials = {"bert": BERT_SPECIALS, "roberta": ROBERTA_SPECIALS, "gpt2": ["<|endoftext|>"]}[model_type]
    tok = trained("wordpiece" if model_type == "bert" else "bpe", texts[:20] + contexts[:20], specials)
    tok.model.save(str(folder))
    vocab = tok.get_vocab_size()
    torch.manual_seed(0)
    transformers.AutoModel.from_config(hf_config(model_type, vocab)).save_pretrained(folder)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    from_hf(folder, tmp_path / "run")
    ours = load_tokenizer(tmp_path / "run")
    texts, pairs = texts + questions + contexts, texts[1:] + texts[:1] + contexts + questions
    assert ours.encode(texts) == reference(texts)["input_ids"]
    expected_pairs = reference(texts, pairs)["input_ids"]
    assert ours.encode(texts, pairs) == expected_pairs
    to_hf(tmp_path / "run", tmp_path / "back")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert exported(texts)["input_ids"] == reference(texts)["input_ids"]
    assert exported(texts, pairs)["input_ids"] == expected_pairs
    from_hf(tmp_path / "back", tmp_path / "again")  # from tokenizer.json this time
    assert load_tokenizer(tmp_path / "again").encode(texts, pairs) == expected_pairs


def test_tokenizer_json_with_albert_role_names(tmp_path: Path) -> None:
    """ALBERT's [CLS]/[SEP]/[MASK] become sesame's <s>/</s>/<mask> under the same ids, and get their names back."""
    make_hf(tmp_path / "hf", "albert")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert summary["renamed_tokens"] == {"[CLS]": "<s>", "[SEP]": "</s>", "[MASK]": "<mask>"}
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = ["w1 w2 w33", "w4 w90"]
    ours = load_tokenizer(tmp_path / "run")
    assert ours.encode(texts) == reference(texts)["input_ids"]
    assert (ours.specials.cls, ours.specials.sep, ours.specials.mask) == (2, 3, 4)
    to_hf(tmp_path / "run", tmp_path / "back")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert exported.cls_token == "[CLS]" and exported(texts)["input_ids"] == reference(texts)["input_ids"]


# -- bad input ---------------------------------------------------------------------------------------

def test_unknown_model_type(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "funnel"}))
    with pytest.raises(SesameError, match=r"config.json: model_type 'funnel' is not supported; sesame converts bert"):
        from_hf(tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_missing_unexpected_and_misshaped_tensors(tmp_path: Path) -> None:
    make_hf(tmp_path / "hf", "bert")
    path = tmp_path / "hf" / "model.safetensors"
    weights = load_file(str(path))
    del weights["encoder.layer.1.attention.self.key.bias"]
    weights["encoder.layer.0.extra.weight"] = torch.zeros(2)
    weights["pooler.dense.bias"] = torch.zeros(HIDDEN + 1)
    save_file(weights, str(path))
    with pytest.raises(SesameError) as err:
        from_hf(tmp_path / "hf", tmp_path / "run")
    message = str(err.value)
    assert message.startswith(f"{path} (bert): the tensors do not match config.json")
    assert "missing: encoder.layer.1.attention.self.key.bias" in message
    assert f"mis-shaped: pooler.dense.bias ({HIDDEN + 1},) (config.json implies ({HIDDEN},))" in message
    assert "unexpected: encoder.layer.0.extra.weight" in message
    assert not (tmp_path / "run").exists()


class Payload:
    """An object whose unpickling would run code (``print`` here)."""

    def __reduce__(self):
        return print, ("unpickled",)


def test_pickled_code_is_refused(tmp_path: Path, capsys) -> None:
    make_hf(tmp_path / "hf", "bert")
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2), "x": Payload()},
               tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(SesameError, match="pytorch_model.bin: unreadable as a weights file") as err:
        from_hf(tmp_path / "hf", tmp_path / "run")
    assert "unpickled" not in capsys.readouterr().out
    message = str(err.value)  # one line naming the file and the fix, not torch's lines about weights_only
    assert "\n" not in message and "weights_only=False" in message and "model.safetensors" in message


def test_config_the_weights_do_not_fit(tmp_path: Path) -> None:
    make_hf(tmp_path / "hf", "bert")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(SesameError, match=r"mis-shaped: encoder.layer.0.intermediate.dense.weight \(64, 32\) "
                                          r"\(config.json implies \(48, 32\)\)"):
        from_hf(tmp_path / "hf", tmp_path / "run")


def test_unsupported_config_values(tmp_path: Path) -> None:
    make_hf(tmp_path / "hf", "bert")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key",
                                                             "hidden_act": "relu"}))
    with pytest.raises(SesameError, match="position_embedding_type 'relative_key' .*hidden_act 'relu'"):
        from_hf(tmp_path / "hf", tmp_path / "run")


def test_no_tokenizer(tmp_path: Path) -> None:
    make_hf(tmp_path / "hf", "bert")
    (tmp_path / "hf" / "vocab.txt").unlink()
    with pytest.raises(SesameError, match="no tokenizer; give tokenizer.json, vocab.txt"):
        from_hf(tmp_path / "hf", tmp_path / "run")


def test_sesame_family_exports(tmp_path: Path, one_thread) -> None:
    """A sesame GPT-2 run (token types, which GPT-2 lacks) exports with type row 0 folded into the positions."""
    from sesame.families import backbone_config
    from sesame.models import Transformer
    from sesame.run import RunConfig, write_config
    from sesame.tokenizer import train_tokenizer

    tok = train_tokenizer(sentences(200), "bpe", 300)
    torch.manual_seed(0)
    cfg = backbone_config("gpt2", "tiny", tok.vocab_size, tok.specials.pad, 0.0, 64)
    backbone = perturbed(Transformer(cfg))
    run = tmp_path / "run"
    run.mkdir()
    tok.save(run / "tokenizer.json")
    save_weights(run / "model.safetensors", {"backbone." + k: v for k, v in backbone.state_dict().items()})
    write_config(run, RunConfig(kind="pretrained", family="gpt2", size="tiny", pooling="last", model=cfg))
    to_hf(run, tmp_path / "out")
    hf = loaded(tmp_path / "out")
    ids, mask = batch(tok.vocab_size, tok.specials.pad)
    with torch.no_grad():
        ours = backbone(ids, padding=mask)
    close_at(hf_hidden(hf, ids, mask), ours, mask, 1e-5)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf_tok(sentences(3))["input_ids"] == tok.encode(sentences(3))
    assert hf_tok.pad_token_id == tok.specials.pad


def test_cli_convert(tmp_path: Path, capsys) -> None:
    from sesame.cli import main

    make_hf(tmp_path / "hf", "roberta")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert "a pretrained run from roberta (2 layers, hidden 32, 261 tokens)" in capsys.readouterr().out
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"] == "RobertaModel"
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back")]) == 2
    assert "exists and holds other files" in capsys.readouterr().err
