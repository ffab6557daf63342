"""Pre-training heads in and out of transformers: a *ForMaskedLM, *ForPreTraining or GPT2LMHeadModel
imports as a run whose objective gives transformers' logits and loss, so ``sesame.evaluate`` reports its
perplexity; sesame's pre-trained runs export as those classes with the same logits; heads that do not
compute what sesame's do are left behind with the reason."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

import sesame  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.interop import from_hf, to_hf  # noqa: E402
from sesame.objectives import CausalLM, Electra, Objective, build_objective  # noqa: E402
from sesame.objectives.mlm import masked_entries  # noqa: E402
from sesame.objectives.pairs import SentencePairs  # noqa: E402
from sesame.run import build_backbone, load_tokenizer, read_config  # noqa: E402
from sesame.train.checkpoint import load_weights, read_json, write_json  # noqa: E402

from .test_interop import batch, close_at, loaded, make_hf  # noqa: E402

GELU_NEW = {"hidden_act": "gelu_new"}  # a backbone activation RoBERTa's head (always exact GELU) does not share
IMPORTS = {  # name: (model_type, transformers class, config options, objective)
    "bert-mlm": ("bert", "BertForMaskedLM", {}, "mlm"),
    "bert-pretraining": ("bert", "BertForPreTraining", {}, "mlm_nsp"),
    "roberta": ("roberta", "RobertaForMaskedLM", {}, "mlm"),
    "albert-mlm": ("albert", "AlbertForMaskedLM", {}, "mlm"),  # ALBERT's default gelu_new, head included
    "albert-pretraining": ("albert", "AlbertForPreTraining", {}, "mlm_sop"),
    "albert-gelu": ("albert", "AlbertForMaskedLM", {"hidden_act": "gelu"}, "mlm"),
    "electra-generator": ("electra", "ElectraForMaskedLM", {}, "mlm"),
    "distilbert": ("distilbert", "DistilBertForMaskedLM", {}, "mlm"),
    "gpt2": ("gpt2", "GPT2LMHeadModel", {}, "clm"),
    "bert-untied": ("bert", "BertForMaskedLM", {"tie_word_embeddings": False}, "mlm"),  # decoder=untied
    "bert-pretraining-untied": ("bert", "BertForPreTraining", {"tie_word_embeddings": False}, "mlm_nsp"),
}

AUTO = {"ForMaskedLM": "AutoModelForMaskedLM", "ForPreTraining": "AutoModelForPreTraining",
        "LMHeadModel": "AutoModelForCausalLM"}


def make_head(folder: Path, model_type: str, cls: str, **options) -> torch.nn.Module:
    """``make_hf`` for the transformers class ``cls``, made through its Auto class."""
    model = make_hf(folder, model_type, head=next(a for end, a in AUTO.items() if cls.endswith(end)), **options)
    assert type(model).__name__ == cls
    return model


def objective_of(run: Path) -> Objective:
    """The run's objective with its weights, as ``sesame.evaluate`` builds it."""
    config = read_config(run, "--model")
    obj = build_objective(config.pretrained.objective, build_backbone(config), load_tokenizer(run),
                          config.pretrained.objective_options)
    obj.load_state_dict(load_weights(run / "model.safetensors"))
    return obj.eval()


def ours(obj: Objective, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """sesame's head outputs: vocabulary logits ``lm``, pair logits ``pair``, discriminator logits ``disc``."""
    with torch.no_grad():
        hidden = obj.backbone(ids, padding=mask)
        if isinstance(obj, Electra):
            return {"disc": obj.discriminator_head(hidden).squeeze(-1)}
        if isinstance(obj, CausalLM):
            return {"lm": obj.tied_logits(hidden)}
        out = {"lm": obj.transform(hidden) @ obj.output_weight.t() + obj.bias}
        if isinstance(obj, SentencePairs):
            out["pair"] = obj.get_submodule(obj.task)(obj.pooler(hidden[:, 0]))
        return out


def theirs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' outputs under the same names."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask.long())
    if isinstance(model, transformers.ElectraForPreTraining):
        return {"disc": out.logits}
    names = {"logits": "lm", "prediction_logits": "lm", "seq_relationship_logits": "pair", "sop_logits": "pair"}
    return {names[k]: v for k, v in out.items() if k in names}


def assert_same_outputs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Equal within 1e-4 at every real position (the first ``vocab`` columns of sesame's logits)."""
    assert a.keys() == b.keys()
    for name, expected in b.items():
        got = a[name][..., : expected.shape[-1]] if name == "lm" else a[name]
        close_at(got, expected, mask if name != "pair" else torch.ones(len(mask), dtype=torch.bool))


@pytest.mark.parametrize("case", IMPORTS)
def test_lm_heads_import_exactly_and_go_back_unchanged(tmp_path: Path, case: str, one_thread) -> None:
    model_type, cls, options, objective = IMPORTS[case]
    original = make_head(tmp_path / "hf", model_type, cls, **options)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["objective"], summary["dropped_heads"]) == (objective, [])
    assert summary["pooler"] == (objective in ("mlm_nsp", "mlm_sop"))
    untied = options.get("tie_word_embeddings") is False
    assert read_config(tmp_path / "run", "--model").pretrained.objective_options == ({"decoder": "untied"} if untied
                                                                                     else {})
    vocab, pad = original.config.vocab_size, original.config.pad_token_id or 0
    ids, mask = batch(vocab, pad)
    obj = objective_of(tmp_path / "run")
    mine = ours(obj, ids, mask)
    assert_same_outputs(mine, theirs(original, ids, mask), mask)
    if model_type == "gpt2":  # the five appended roles share <|endoftext|>'s output row
        assert torch.equal(mine["lm"][..., vocab:], mine["lm"][..., vocab - 1:vocab].expand(-1, -1, 5))
        assert "slightly above transformers'" in summary["notes"][-1]
    else:
        assert summary["notes"] == []

    assert to_hf(tmp_path / "run", tmp_path / "back")["architecture"] == cls
    expected, back = original.state_dict(), loaded(tmp_path / "back", cls).state_dict()
    assert back.keys() == expected.keys()
    skip = pad + 1 if model_type == "roberta" else 0  # rows before RoBERTa's first position come back as zeros
    for name, tensor in expected.items():
        if untied and name == "cls.predictions.bias":  # transformers' untied head reads its decoder's bias alone
            continue
        rows = slice(skip, None) if name.endswith("position_embeddings.weight") else slice(None)
        assert torch.equal(back[name][rows], tensor[rows]), name


@pytest.mark.parametrize("model_type, cls", [("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM")])
def test_masked_lm_loss_is_transformers_loss(tmp_path: Path, model_type: str, cls: str) -> None:
    """On one masked batch drawn by sesame's objective, its summed loss is transformers' mean × count."""
    original = make_head(tmp_path / "hf", model_type, cls)
    from_hf(tmp_path / "hf", tmp_path / "run")
    obj = objective_of(tmp_path / "run")
    windows = torch.randint(5, original.config.vocab_size - 1, (2, 20), generator=torch.Generator().manual_seed(3))
    masked = obj.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(2)])
    labels = torch.full_like(masked["ids"], -100).flatten()
    labels[masked_entries(masked, "positions")] = masked_entries(masked, "targets")
    assert masked["masked"] > 0
    with torch.no_grad():
        loss = obj(masked)
        expected = original(input_ids=masked["ids"], labels=labels.view_as(masked["ids"])).loss
    assert float(loss) == pytest.approx(float(expected) * masked["masked"], rel=1e-5)


def test_gpt2_loss_differs_from_transformers_only_by_the_appended_rows(tmp_path: Path) -> None:
    """sesame's CLM loss is transformers' softmax with five more copies of <|endoftext|>'s logit, as the note says."""
    original = make_head(tmp_path / "hf", "gpt2", "GPT2LMHeadModel")
    from_hf(tmp_path / "hf", tmp_path / "run")
    obj = objective_of(tmp_path / "run")
    vocab = original.config.vocab_size
    windows = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        loss = obj(obj.make_batch(windows, []))
        logits = original(input_ids=windows[:, :-1]).logits
    extended = torch.cat([logits, logits[..., -1:].expand(-1, -1, 5)], -1)
    targets = windows[:, 1:].flatten()
    expected = F.cross_entropy(extended.flatten(0, 1), targets, reduction="sum")
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(loss) > float(F.cross_entropy(logits.flatten(0, 1), targets, reduction="sum"))


@pytest.mark.parametrize("model_type, cls", [("bert", "BertForPreTraining"), ("gpt2", "GPT2LMHeadModel")])
def test_evaluate_reports_a_converted_models_perplexity(tmp_path: Path, model_type: str, cls: str,
                                                        one_thread) -> None:
    make_head(tmp_path / "hf", model_type, cls)
    from_hf(tmp_path / "hf", tmp_path / "run")
    generator = torch.Generator().manual_seed(5)
    lines = [" ".join(f"w{int(i)}" for i in torch.randint(0, 95, (8,), generator=generator)) for _ in range(300)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n")
    report = sesame.evaluate(str(tmp_path / "run"), [str(tmp_path / "text.txt")])
    assert math.isfinite(report["perplexity"]) and report["perplexity"] > 1 and report["tokens"] > 0
    assert sesame.evaluate(str(tmp_path / "hf"), [str(tmp_path / "text.txt")]) == report  # the directory directly
    if model_type == "bert":
        assert math.isfinite(report["nsp_loss"])


def test_mlm_head_without_nsp_leaves_the_pooler_behind(tmp_path: Path) -> None:
    """A checkpoint with BERT's pooler and MLM head but no NSP head: an ``mlm`` run, which has no pooler."""
    make_head(tmp_path / "hf", "bert", "BertForPreTraining")
    path = str(tmp_path / "hf" / "model.safetensors")
    save_file({k: v for k, v in load_file(path).items() if "seq_relationship" not in k}, path)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["objective"], summary["pooler"]) == ("mlm", False)
    assert summary["notes"][0].startswith("the [CLS] pooler is left behind: sesame's mlm objective has none")
    objective_of(tmp_path / "run")  # loads: no stray pooler weights


def test_pytorch_bin_with_stored_tied_copies(tmp_path: Path) -> None:
    """A pytorch_model.bin stores the tied decoder's weight and bias (and TensorFlow-era LayerNorm names):
    they must equal the embeddings and the bias, and then import as the head."""
    model = make_head(tmp_path / "hf", "bert", "BertForMaskedLM")
    (tmp_path / "hf" / "model.safetensors").unlink()
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma"): v for k, v in model.state_dict().items()}
    assert "cls.predictions.decoder.weight" in state
    torch.save(state, tmp_path / "hf" / "pytorch_model.bin")
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["objective"], summary["dropped_heads"]) == ("mlm", [])
    ids, mask = batch(100, 0)
    assert_same_outputs(ours(objective_of(tmp_path / "run"), ids, mask), theirs(model, ids, mask), mask)


@pytest.mark.parametrize("model_type, cls, options, dropped, reason", [
    ("roberta", "RobertaForMaskedLM", GELU_NEW, ["lm_head"],
     "RobertaForMaskedLM's language-model head is left behind: its head applies 'gelu' where sesame's mlm head "
     "applies the backbone's 'gelu_new'"),
    ("gpt2", "GPT2LMHeadModel", {"tie_word_embeddings": False}, ["lm_head"],
     "GPT2LMHeadModel's language-model head is left behind: its output layer is not tied to the token embeddings"),
    ("electra", "ElectraForPreTraining", {}, ["discriminator_predictions"],
     "ELECTRA's discriminator head is left behind: sesame's electra objective also needs the generator"),
])
def test_heads_that_do_not_map_are_left_behind(tmp_path: Path, model_type: str, cls: str, options: dict,
                                              dropped: list[str], reason: str) -> None:
    make_head(tmp_path / "hf", model_type, cls, **options)
    summary = from_hf(tmp_path / "hf", tmp_path / "run")
    assert (summary["objective"], summary["dropped_heads"]) == (None, dropped)
    assert len(summary["notes"]) == 1 and summary["notes"][0].startswith(reason)
    with pytest.raises(SesameError, match=f"converted from {model_type} without its pre-training heads"):
        sesame.evaluate(str(tmp_path / "run"), [str(tmp_path / "text.txt")])  # refused before reading it


EXPORTS = {  # family: (transformers class, notes)
    "bert": ("BertForPreTraining", []), "roberta": ("RobertaForMaskedLM", []),
    "albert": ("AlbertForPreTraining", []), "gpt2": ("GPT2LMHeadModel", []),
    "spanbert": ("BertForMaskedLM", ["its span-boundary (SBO) head is left behind: BertForMaskedLM has none"]),
    "electra": ("ElectraForPreTraining", []),  # its generator goes to DIR/generator (tests/test_interop_electra.py)
}


@pytest.mark.parametrize("family", EXPORTS)
def test_pretrained_runs_export_with_their_heads(tmp_path: Path, corpus: Path, family: str, one_thread) -> None:
    run = tmp_path / "run"
    size = "mini" if family == "albert" else "tiny"  # AlbertModel always projects E to H: E 128 < H 256
    sesame.pretrain([str(corpus)], str(run), family=family, size=size, vocab_size=300, seq_len=32, max_steps=2,
                    batch_size=4, progress=False)
    cls, notes = EXPORTS[family]
    summary = to_hf(run, tmp_path / "out")
    assert (summary["architecture"], summary["notes"]) == (cls, notes)
    model = loaded(tmp_path / "out", cls)
    obj = objective_of(run)
    ids, mask = batch(obj.backbone.config.vocab_size, obj.specials.pad)
    assert_same_outputs(ours(obj, ids, mask), theirs(model, ids, mask), mask)


def test_an_untied_decoder_exports_as_an_output_layer_of_its_own(tmp_path: Path, corpus: Path, one_thread) -> None:
    run = tmp_path / "run"
    sesame.pretrain([str(corpus)], str(run), family="bert", size="tiny", vocab_size=300, seq_len=32, max_steps=3,
                    batch_size=4, lr=1e-2, objective_options={"decoder": "untied"}, progress=False)
    obj = objective_of(run)
    assert not torch.allclose(obj.decoder, obj.backbone.embed.tokens.weight)  # trained apart from the table
    assert to_hf(run, tmp_path / "out")["architecture"] == "BertForPreTraining"
    assert read_json(tmp_path / "out" / "config.json")["tie_word_embeddings"] is False
    model = loaded(tmp_path / "out", "BertForPreTraining")
    ids, mask = batch(obj.backbone.config.vocab_size, obj.specials.pad)
    assert_same_outputs(ours(obj, ids, mask), theirs(model, ids, mask), mask)


def test_a_head_with_another_activation_is_not_exported(tmp_path: Path) -> None:
    """RoBERTa's head always applies exact GELU: a gelu_tanh run exports as RobertaModel, saying why;
    ALBERT's head applies the backbone's activation, so a gelu_tanh ALBERT exports with its heads."""
    for model_type, cls in (("roberta", "RobertaForMaskedLM"), ("albert", "AlbertForPreTraining")):
        make_head(tmp_path / model_type / "hf", model_type, cls)
        from_hf(tmp_path / model_type / "hf", tmp_path / model_type / "run")
        config = read_json(tmp_path / model_type / "run" / "config.json")
        config["model"]["activation"] = "gelu_tanh"
        write_json(tmp_path / model_type / "run" / "config.json", config)
        summary = to_hf(tmp_path / model_type / "run", tmp_path / model_type / "out")
        model = loaded(tmp_path / model_type / "out", summary["architecture"])
        if model_type == "roberta":
            assert summary["architecture"] == "RobertaModel"
            assert summary["notes"][0] == ("its mlm head is left behind: RobertaForMaskedLM's head applies exact GELU "
                                           "where sesame's applies the backbone's gelu_new")
        else:
            assert (summary["architecture"], summary["notes"]) == ("AlbertForPreTraining", [])
            obj = objective_of(tmp_path / model_type / "run")
            ids, mask = batch(obj.backbone.config.vocab_size, obj.specials.pad)
            assert_same_outputs(ours(obj, ids, mask), theirs(model, ids, mask), mask)
