"""An ELECTRA discriminator and generator checkpoint import as one ``electra`` run whose discriminator and
generator give transformers' logits, and the run exports back as both; pairs that do not fit sesame's
electra objective are refused, saying what differs."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import sesame  # noqa: E402
from sesame.cli import main  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.interop import from_hf, to_hf  # noqa: E402
from sesame.objectives import Electra  # noqa: E402

from .test_interop import HIDDEN, LAYERS, POSITIONS, batch, close_at, loaded, perturbed, write_wordpiece  # noqa: E402
from .test_interop_heads import objective_of  # noqa: E402

EMBEDDING = 16
# sesame's generator of a discriminator of width 32 at generator_fraction 0.25: width 8, one head, FFN 32
GENERATOR = dict(hidden_size=8, num_attention_heads=1, intermediate_size=32)


def electra(cls: str, vocab: int, **sizes) -> torch.nn.Module:
    """A tiny random ELECTRA model of class ``cls``, every parameter off its initial value."""
    sizes = {"hidden_size": HIDDEN, "num_attention_heads": 2, "intermediate_size": 64, "num_hidden_layers": LAYERS,
             **sizes}
    config = transformers.ElectraConfig(vocab_size=vocab, embedding_size=EMBEDDING, max_position_embeddings=POSITIONS,
                                        **sizes)
    return perturbed(getattr(transformers, cls)(config))


def make_pair(folder: Path, generator: dict | None = None, tied: bool = True, disc: dict | None = None
              ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A seeded discriminator (``folder/disc``) and generator (``folder/gen``) saved with their tokenizer; the
    generator's embeddings are the discriminator's (the released pairs' tying) when ``tied``."""
    dirs = folder / "disc", folder / "gen"
    for d in dirs:
        d.mkdir(parents=True)
        vocab = write_wordpiece(d)
    torch.manual_seed(0)
    disc_model = electra("ElectraForPreTraining", vocab, **(disc or {}))
    gen_model = electra("ElectraForMaskedLM", vocab, **(GENERATOR if generator is None else generator))
    if tied:
        gen_model.electra.embeddings.load_state_dict(disc_model.electra.embeddings.state_dict())
    for model, d in zip((disc_model, gen_model), dirs):
        model.save_pretrained(d)
    return disc_model, gen_model


def sesame_logits(obj: Electra, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the discriminator's logits, the generator's vocabulary logits) of sesame's electra objective."""
    with torch.no_grad():
        disc = obj.discriminator_head(obj.backbone(ids, padding=mask)).squeeze(-1)
        hidden = obj.generator(ids, padding=mask, embedded=obj.backbone.embed(ids, None))
        gen = obj.generator_head(hidden) @ obj.backbone.embed.tokens.weight.t() + obj.generator_bias
    return disc, gen


def hf_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).logits


def test_a_pair_imports_as_one_electra_run_and_exports_back(tmp_path: Path, one_thread) -> None:
    disc_model, gen_model = make_pair(tmp_path)
    summary = from_hf(tmp_path / "disc", tmp_path / "run", generator=tmp_path / "gen")
    assert (summary["objective"], summary["generator_fraction"], summary["dropped_heads"]) == ("electra", 0.25, [])
    assert summary["notes"] == []
    obj = objective_of(tmp_path / "run")  # strict: exactly the objective's tensors
    assert isinstance(obj, Electra) and obj.generator.config.hidden == 8
    ids, mask = batch(disc_model.config.vocab_size, 0)
    disc, gen = sesame_logits(obj, ids, mask)
    close_at(disc, hf_logits(disc_model, ids, mask), mask)
    close_at(gen, hf_logits(gen_model, ids, mask), mask)

    assert to_hf(tmp_path / "run", tmp_path / "back") == {
        "model_type": "electra", "architecture": "ElectraForPreTraining", "vocab_size": 100, "notes": [],
        "generator": str(tmp_path / "back" / "generator")}
    for original, folder, cls in ((disc_model, "back", "ElectraForPreTraining"),
                                  (gen_model, "back/generator", "ElectraForMaskedLM")):
        back = loaded(tmp_path / folder, cls).state_dict()
        assert back.keys() == original.state_dict().keys()
        assert all(torch.equal(back[k], t) for k, t in original.state_dict().items()), folder
    # and the exported pair imports again
    assert from_hf(tmp_path / "back", tmp_path / "again", tmp_path / "back" / "generator")["objective"] == "electra"


def test_evaluate_reports_both_losses_of_an_imported_pair(tmp_path: Path, one_thread) -> None:
    make_pair(tmp_path)
    assert main(["convert", "--from-hf", str(tmp_path / "disc"), "--generator", str(tmp_path / "gen"),
                 "--out", str(tmp_path / "run")]) == 0
    generator = torch.Generator().manual_seed(5)
    lines = [" ".join(f"w{int(i)}" for i in torch.randint(0, 95, (8,), generator=generator)) for _ in range(100)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n")
    report = sesame.evaluate(str(tmp_path / "run"), [str(tmp_path / "text.txt")])
    assert math.isfinite(report["mlm_loss"]) and math.isfinite(report["disc_loss"]) and report["tokens"] > 0


def test_a_pretrained_electra_run_exports_its_generator(tmp_path: Path, corpus: Path, one_thread) -> None:
    run = tmp_path / "run"
    sesame.pretrain([str(corpus)], str(run), family="electra", size="tiny", vocab_size=300, seq_len=32, max_steps=2,
                    batch_size=4, progress=False)
    to_hf(run, tmp_path / "out")
    obj = objective_of(run)
    ids, mask = batch(obj.backbone.config.vocab_size, obj.specials.pad)
    disc, gen = sesame_logits(obj, ids, mask)
    close_at(gen, hf_logits(loaded(tmp_path / "out" / "generator", "ElectraForMaskedLM"), ids, mask), mask)
    close_at(disc, hf_logits(loaded(tmp_path / "out", "ElectraForPreTraining"), ids, mask), mask)


@pytest.mark.parametrize("case, message", [
    ("untied", r"the generator's embeddings differ from the discriminator's \(embeddings.word_embeddings.weight, "
               r"embeddings.position_embeddings.weight"),
    ("sizes", r"does not fit sesame's electra generator of this discriminator \(generator_fraction 0.5.*: heads 2 "
              r"\(needs 1\); intermediate 32 \(needs 64\); import the two separately"),
    ("layers", r"layers 1 \(needs 2\)"),
    ("not a generator", r"the generator is ElectraForPreTraining, not an ElectraForMaskedLM whose head imports"),
    ("gelu_new", r"hidden_act 'gelu_new': ElectraForPreTraining's head applies it where sesame's electra "
                 r"discriminator head applies exact GELU"),
])
def test_pairs_that_do_not_fit_are_refused(tmp_path: Path, case: str, message: str) -> None:
    generator = {"sizes": dict(hidden_size=16, num_attention_heads=2, intermediate_size=32),
                 "layers": {**GENERATOR, "num_hidden_layers": 1},
                 "gelu_new": {**GENERATOR, "hidden_act": "gelu_new"}}.get(case)
    make_pair(tmp_path, generator, tied=case != "untied",
              disc={"hidden_act": "gelu_new"} if case == "gelu_new" else None)
    gen = tmp_path / ("disc" if case == "not a generator" else "gen")
    with pytest.raises(SesameError, match=message):
        from_hf(tmp_path / "disc", tmp_path / "run", generator=gen)
    assert not (tmp_path / "run").exists()


def test_generator_needs_an_electra_discriminator(tmp_path: Path, capsys) -> None:
    make_pair(tmp_path)
    transformers.ElectraModel.from_pretrained(tmp_path / "disc").save_pretrained(tmp_path / "base")
    write_wordpiece(tmp_path / "base")
    with pytest.raises(SesameError, match="ElectraModel has no ELECTRA discriminator head"):
        from_hf(tmp_path / "base", tmp_path / "run", generator=tmp_path / "gen")
    bert = transformers.BertConfig(vocab_size=100, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=2,
                                   intermediate_size=64)
    transformers.BertModel(bert).save_pretrained(tmp_path / "bert")
    write_wordpiece(tmp_path / "bert")
    with pytest.raises(SesameError, match="a bert checkpoint; --generator pairs an ELECTRA discriminator"):
        from_hf(tmp_path / "bert", tmp_path / "run", generator=tmp_path / "gen")
    assert main(["convert", "--to-hf", str(tmp_path / "disc"), "--generator", str(tmp_path / "gen"),
                 "--out", str(tmp_path / "out")]) == 2
    assert "--generator: only with --from-hf" in capsys.readouterr().err
