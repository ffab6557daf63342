"""``sesame pretrain --teacher``: DistilBERT's pre-training distillation (Sanh et al. 2019): the student's layers
copied from the teacher's, the loss against a hand computation, a student equal to its teacher, whole runs that
resume and fine-tune, and the real MiniLM teacher."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from sesame.cli import main
from sesame.families import backbone_config
from sesame.models import build_model
from sesame.objectives import MaskedLM
from sesame.objectives.distillation import MaskedLMDistillation, every_other_layer, frozen_teacher, student_weights
from sesame.run import load_tokenizer
from sesame.tokenizer import SpecialIds
from sesame.train.checkpoint import load_weights, read_json
from sesame.train.trainer import mean_loss

from .conftest import documents, refused, sentences

Q = ["--no-progress"]
PLAIN = {"counts": None, "smoothing": 0.0, "train_positions": True}  # BERT's masking, every weight trained
SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def masked_lm(layers: int, seed: int) -> MaskedLM:
    """A tiny BERT masked LM of ``layers`` layers over 40 tokens, its weights drawn from ``seed`` (the head's bias and
    norms too, so a copy that missed them would show)."""
    torch.manual_seed(seed)
    config = backbone_config("bert", "tiny", 40, 0, 0.0)
    config.layers = layers
    model = MaskedLM(build_model(config.to_dict()), SPECIALS)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.ndim == 1:
                tensor.normal_()
    return model.eval()


def a_batch(model: MaskedLM | MaskedLMDistillation) -> dict:
    windows = torch.randint(5, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    return model.make_batch(windows, [torch.Generator().manual_seed(10 + i) for i in range(3)])


def test_the_student_starts_from_every_other_layer_of_its_teacher() -> None:
    """Student layer i is teacher layer map[i], tensor for tensor, bitwise; the embeddings and the masked-LM head are
    the teacher's; DistilBERT's default is one layer out of two. A teacher without a head leaves the student's own."""
    assert every_other_layer(12) == [0, 2, 4, 6, 8, 10] and every_other_layer(6) == [0, 2, 4]
    teacher, student = masked_lm(4, seed=0), masked_lm(2, seed=1)
    layers = [3, 1]  # any order: student layer 0 is teacher layer 3
    student.load_state_dict(student_weights(teacher.state_dict(), student.state_dict(), layers))
    for i, t in enumerate(layers):
        for stack in ("attention", "feed_forward"):
            ours, theirs = getattr(student.backbone, stack)[i], getattr(teacher.backbone, stack)[t]
            assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
            other = getattr(teacher.backbone, stack)[t - 1]  # a neighbour's weights differ: the map matters
            assert not torch.equal(ours.norm.weight, other.norm.weight)
    for name in ("backbone.embed.tokens.weight", "backbone.embed.positions.weight", "backbone.embed.norm.bias",
                 "transform.0.weight", "transform.2.weight", "bias"):
        assert torch.equal(student.state_dict()[name], teacher.state_dict()[name]), name
    fresh = masked_lm(2, seed=2)
    bare = {name: value for name, value in teacher.state_dict().items() if name.startswith("backbone.")}
    kept = student_weights(bare, fresh.state_dict(), layers)
    assert torch.equal(kept["bias"], fresh.state_dict()["bias"])
    assert torch.equal(kept["backbone.attention.0.qkv.weight"], teacher.state_dict()["backbone.attention.3.qkv.weight"])


def test_the_loss_is_the_weighted_sum_of_the_three_terms_computed_by_hand() -> None:
    """5·T²·KL + 2·MLM + 1·cosine, each a mean (KL and MLM over the masked positions, cosine over every token), from
    the heads' arithmetic written out: dense → GELU → LayerNorm → tied embeddings + bias."""
    student, teacher = masked_lm(2, seed=3), masked_lm(4, seed=4)
    loss = MaskedLMDistillation(student, frozen_teacher(teacher), soft_targets=True,
                                weights={"mlm": 2.0, "kl": 5.0, "cosine": 1.0}, temperature=2.0, **PLAIN)
    batch = a_batch(loss)
    n, tokens = batch["masked"], batch["ids"].numel()  # 3 windows of 10 tokens, each between [CLS] and [SEP]
    assert n > 0 and tokens == 36 and batch["counts"] == {"mlm": n, "kl": n, "cosine": tokens}

    def logits(model: MaskedLM) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = model.backbone(batch["ids"])
        rows = hidden.reshape(-1, hidden.shape[-1])[batch["positions"][:n]]
        dense, norm = model.transform[0], model.transform[2]
        h = F.layer_norm(F.gelu(rows @ dense.weight.T + dense.bias), (rows.shape[-1],), norm.weight, norm.bias,
                         norm.eps)
        return hidden, h @ model.backbone.embed.tokens.weight.T + model.bias

    with torch.no_grad():
        (hs, s), (ht, t) = logits(student), logits(teacher)
        targets = batch["targets"][:n]
        mlm = -s.log_softmax(-1)[torch.arange(n), targets].sum()
        p, q = (t / 2).softmax(-1), (s / 2).softmax(-1)
        kl = 4 * (p * (p.log() - q.log())).sum()
        cosine = sum(1 - float(a @ b) / math.sqrt(float(a @ a) * float(b @ b))
                     for a, b in zip(hs.reshape(tokens, -1), ht.reshape(tokens, -1)))
        parts = loss(batch)
        assert float(parts["mlm"]) == pytest.approx(float(mlm), rel=1e-4)
        assert float(parts["kl"]) == pytest.approx(float(kl), rel=1e-4)
        assert float(parts["cosine"]) == pytest.approx(cosine, rel=1e-4)
        by_hand = 5 * float(kl) / n + 2 * float(mlm) / n + cosine / tokens
        assert float(mean_loss(loss, batch)) == pytest.approx(by_hand, rel=1e-4)


def test_a_student_equal_to_its_teacher_has_no_kl_or_cosine_loss() -> None:
    """Every layer copied (dropout off): the soft targets and the states are the student's own, so the KL and cosine
    terms are 0 while the masked LM's loss is not; a teacher without a head has no KL part."""
    teacher, student = masked_lm(2, seed=5), masked_lm(2, seed=6)
    student.load_state_dict(student_weights(teacher.state_dict(), student.state_dict(), [0, 1]))
    weights = {"mlm": 2.0, "kl": 5.0, "cosine": 1.0}
    same = MaskedLMDistillation(student, frozen_teacher(teacher), soft_targets=True, weights=weights, temperature=2.0,
                                **PLAIN)
    with torch.no_grad():
        parts = same(a_batch(same))
        assert float(parts["kl"]) == pytest.approx(0.0, abs=1e-5)
        assert float(parts["cosine"]) == pytest.approx(0.0, abs=1e-4)
        assert float(parts["mlm"]) > 1.0
        bare = MaskedLMDistillation(student, frozen_teacher(masked_lm(2, seed=7).backbone), soft_targets=False,
                                    weights=weights, temperature=2.0, **PLAIN)
        assert bare.part_names == ("mlm", "cosine") and bare.part_weights == {"mlm": 2.0, "cosine": 1.0}
        assert float(bare(a_batch(bare))["cosine"]) > 0.1  # another model's states


def test_rare_tokens_are_masked_in_proportion_to_count_to_the_minus_0_7() -> None:
    """DistilBERT's smoothing: a token's weight is max(count, 1)^-0.7, 0 for special tokens; a sequence of six
    selectable tokens has one masked position (round(0.15·6)), which falls on the rare token with probability
    w_rare / (w_rare + 5·w_common), 0.96 here, where uniform masking picks it 1 time in 6."""
    from sesame.objectives.masking import mask_weighted_rows, replacement_pool, smoothed_weights

    counts = torch.zeros(40, dtype=torch.long)
    counts[10], counts[11] = 1000, 1  # a common token and a rare one; 12: never seen, weighted as a count of 1
    weights = smoothed_weights(counts, 0.7, torch.tensor(SPECIALS.all))
    assert weights[11] == weights[12] == 1.0 and weights[10] == pytest.approx(1000 ** -0.7)
    assert (weights[torch.tensor(SPECIALS.all)] == 0).all()
    ids = torch.tensor([SPECIALS.cls, 10, 10, 11, 10, 10, 10, SPECIALS.sep])
    pool, draws = replacement_pool(40, torch.tensor(SPECIALS.all)), 2000
    _, selected = mask_weighted_rows(ids.repeat(draws, 1), weights, SPECIALS.mask, pool,
                                     [torch.Generator().manual_seed(seed) for seed in range(draws)])
    assert (selected.sum(1) == 1).all()
    picked = selected.sum(0)
    expected = 1 / (1 + 5 * 1000 ** -0.7)
    assert picked[3] / draws == pytest.approx(expected, abs=0.02)  # binomial sd 0.004
    assert picked[0] == picked[-1] == 0


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> tuple:
    """A corpus and a 2-layer bert run pre-trained on it (mlm_nsp: a masked LM with NSP beside)."""
    root = tmp_path_factory.mktemp("distilbert")
    (root / "corpus.txt").write_text(documents(sentences(300)))
    assert main(Q + ["pretrain", "--family", "bert", "--size", "tiny", "--corpus", str(root / "corpus.txt"),
                     "--vocab-size", "200", "--seq-len", "32", "--max-steps", "2", "--batch-size", "8",
                     "--out", str(root / "teacher")]) == 0
    return root, root / "teacher"


def distil(root, teacher, out, *extra: str) -> list[str]:
    return Q + ["pretrain", "--teacher", str(teacher), "--corpus", str(root / "corpus.txt"), "--seq-len", "32",
                "--batch-size", "8", "--out", str(out), *extra]


def test_a_distilled_student_resumes_exactly_and_fine_tunes(teacher, tmp_path, capsys, monkeypatch,
                                                             one_thread) -> None:
    """The student is an mlm run of the teacher's family with one layer (one out of two of 2), the teacher's
    tokenizer and the three loss parts; a run killed after its step-2 checkpoint refuses other layers on --resume and,
    resumed without --teacher (the run's own), ends with the uninterrupted run's weights, bitwise; the student
    fine-tunes."""
    from .test_interrupted import Killed, kill_at_step

    root, run = teacher
    budget = ["--max-steps", "4", "--save-every", "2"]
    assert main(distil(root, run, tmp_path / "straight", *budget, "--json")) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"mlm_loss", "kl_loss", "cosine_loss", "perplexity"} <= metrics.keys()
    config = read_json(tmp_path / "straight" / "config.json")
    assert (config["family"], config["objective"], config["model"]["layers"]) == ("bert", "mlm", 1)
    assert config["setup"]["student_layers"] == [0] and config["setup"]["kl_weight"] == 5.0
    assert load_tokenizer(tmp_path / "straight").backend.to_str() == load_tokenizer(run).backend.to_str()
    assert not any(k.startswith("student.") for k in load_weights(tmp_path / "straight" / "model.safetensors"))
    # DistilBERT's recipe: the positions stay the teacher's (frozen) while the words move; masks smoothed by 0.7
    assert (config["setup"]["train_positions"], config["setup"]["mlm_smoothing"]) == (False, 0.7)
    taught, learnt = load_weights(run / "model.safetensors"), load_weights(tmp_path / "straight" / "model.safetensors")
    assert torch.equal(learnt["backbone.embed.positions.weight"], taught["backbone.embed.positions.weight"])
    assert not torch.equal(learnt["backbone.embed.tokens.weight"], taught["backbone.embed.tokens.weight"])

    out = tmp_path / "student"
    kill_at_step(monkeypatch, 3)
    with pytest.raises(Killed):
        main(distil(root, run, out, *budget))
    monkeypatch.undo()
    refused(distil(root, run, out, *budget, "--resume", "--student-layers", "1"), capsys, tmp_path,
            "--student-layers 1", "0")
    assert main(Q + ["pretrain", "--corpus", str(root / "corpus.txt"), "--out", str(out), *budget, "--resume"]) == 0
    ours, straight = load_weights(out / "model.safetensors"), load_weights(tmp_path / "straight" / "model.safetensors")
    assert ours.keys() == straight.keys() and all(torch.equal(ours[k], straight[k]) for k in ours)

    rows = ["text,label"] + [f'"{s}",{"animal" if {"cat", "dog"} & set(s.lower().split()) else "none"}'
                             for s in sentences(40)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    assert main(Q + ["finetune", "--from", str(out), "--train", str(tmp_path / "train.csv"), "--dev",
                     str(tmp_path / "train.csv"), "--epochs", "1", "--batch-size", "8", "--max-length", "32",
                     "--out", str(tmp_path / "tuned")]) == 0
    assert read_json(tmp_path / "tuned" / "config.json")["model"]["layers"] == 1


def test_positions_train_when_asked_and_older_runs_resume_as_they_were_made(teacher, tmp_path) -> None:
    """--train-positions moves the positions; a run made before the recipe's frozen positions and smoothed masks
    (its config.json's setup without them) resumes with both off, as it was made."""
    from sesame.resume import resumed_pretraining
    from sesame.specs import PretrainSpec

    root, run = teacher
    out = tmp_path / "student"
    assert main(distil(root, run, out, "--max-steps", "2", "--train-positions")) == 0
    learnt, taught = load_weights(out / "model.safetensors"), load_weights(run / "model.safetensors")
    assert not torch.equal(learnt["backbone.embed.positions.weight"], taught["backbone.embed.positions.weight"])
    config = read_json(out / "config.json")
    assert (config["setup"]["train_positions"], config["setup"]["mlm_smoothing"]) == (True, 0.7)
    for name in ("train_positions", "mlm_smoothing"):
        del config["setup"][name]
    (out / "config.json").write_text(json.dumps(config))
    spec = resumed_pretraining(PretrainSpec(corpus=[str(root / "corpus.txt")], out=str(out), resume=True))
    taught = spec.distillation
    assert (taught.train_positions, taught.mlm_smoothing, spec.teacher) == (True, 0.0, str(run.resolve()))


def test_distilberts_options_are_one_typed_part_of_the_spec(monkeypatch, tmp_path) -> None:
    """The spec carries DistilBERT's options as its ``distillation`` (frozen; None without a teacher), from
    ``sesame.pretrain``'s keywords and from the command's flags alike."""
    from dataclasses import FrozenInstanceError

    import sesame.pipelines
    from sesame.objectives.distillation import Distillation
    from sesame.specs import PretrainSpec

    assert PretrainSpec.of(["corpus.txt"], "out").distillation is None
    assert PretrainSpec.of(["corpus.txt"], "out", teacher="run").distillation == Distillation()
    spec = PretrainSpec.of(["corpus.txt"], "out", teacher="run", kl_weight=0.0, student_layers=[0])
    assert spec.distillation == Distillation(kl_weight=0.0, student_layers=[0])
    assert {"teacher", "kl_weight", "student_layers"} <= spec.given_fields()
    with pytest.raises(FrozenInstanceError):
        spec.distillation.kl_weight = 1.0
    specs = []
    monkeypatch.setattr(sesame.pipelines, "pretrain", lambda given: specs.append(given) or {})
    assert main(Q + ["pretrain", "--corpus", "corpus.txt", "--out", str(tmp_path / "o"), "--teacher", "run",
                     "--kl-weight", "0", "--student-layers", "0", "--train-positions"]) == 0
    assert main(Q + ["pretrain", "--corpus", "corpus.txt", "--out", str(tmp_path / "o")]) == 0
    assert specs[0].distillation == Distillation(kl_weight=0.0, student_layers=[0], train_positions=True)
    assert specs[0].explicit >= {"kl_weight", "student_layers", "train_positions"} and specs[1].distillation is None


def test_what_a_student_cannot_change_is_refused(teacher, tmp_path, capsys) -> None:
    root, run = teacher
    out = tmp_path / "student"
    refused(distil(root, run, out, "--student-layers", "2"), capsys, tmp_path, "--student-layers 2", "0 to 1")
    refused(distil(root, run, out, "--vocab-size", "300"), capsys, tmp_path, "--vocab-size 300", "teacher")
    refused(distil(root, run, out, "--objective", "mlm_nsp"), capsys, tmp_path, "--objective mlm_nsp")
    refused(distil(root, run, out, "--seq-len", "600"), capsys, tmp_path, "--seq-len 600", "512 positions")
    refused(distil(root, run, out, "--masking", "whole_word"), capsys, tmp_path, "--mlm-smoothing 0.7",
            "--masking whole_word")
    refused(distil(root, run, out, "--mlm-smoothing", "-1"), capsys, tmp_path, "--mlm-smoothing -1", "0.7")
    refused(Q + ["pretrain", "--corpus", str(root / "corpus.txt"), "--out", str(out), "--kl-weight", "1"], capsys,
            tmp_path, "--kl-weight", "--teacher")
    refused(distil(root, tmp_path / "nothing", out), capsys, tmp_path, "--teacher")


def test_minilm_teaches_without_soft_targets(tmp_path, capsys) -> None:
    """all-MiniLM-L6-v2 has no masked-LM head: the default --kl-weight is refused naming the fix; its student copies
    layers 0, 2 and 4 of its 6."""
    from sesame.pipelines.distilbert import PretrainTeacher
    from sesame.specs import PretrainSpec

    from .conftest import minilm

    minilm()
    (tmp_path / "corpus.txt").write_text(documents(sentences(50)))
    refused(Q + ["pretrain", "--teacher", "minilm", "--corpus", str(tmp_path / "corpus.txt"), "--out",
                 str(tmp_path / "student")], capsys, tmp_path, "--kl-weight 5.0", "minilm", "--kl-weight 0")
    teacher = PretrainTeacher("minilm")
    spec = teacher.taught(PretrainSpec.of([str(tmp_path)], str(tmp_path / "s"), teacher="minilm", kl_weight=0.0))
    assert (spec.family, spec.distillation.student_layers, teacher.soft_targets) == ("bert", [0, 2, 4], False)
    student = MaskedLM(build_model(teacher.student_model(spec, 0.0)), teacher.tok.specials)
    teacher.initialise(student, spec)
    for i, t in enumerate([0, 2, 4]):
        assert torch.equal(student.backbone.feed_forward[i].inp.weight, teacher.model.feed_forward[t].inp.weight)
