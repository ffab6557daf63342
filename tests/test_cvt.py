"""Cross-view training for tagging (Clark et al. 2018): what each auxiliary view may see, the fixed
primary targets of the unlabeled loss, the labeled/unlabeled alternation, the backbone check, and a
fine-tuned run that predicts without its unlabeled file."""
import json
import random

import pytest
import torch
import torch.nn.functional as F

import sesame
from sesame.errors import SesameError
from sesame.models import Recurrent, RecurrentConfig, Transformer, TransformerConfig
from sesame.tasks import make_task
from sesame.tasks.cvt import CVT_VIEWS, CrossViewModel, unlabeled_batch
from sesame.tokenizer import train_tokenizer

from .conftest import sentences

TAGS = {"cat": "B-ANIMAL", "dog": "B-ANIMAL", "bird": "B-ANIMAL", "city": "B-PLACE", "garden": "B-PLACE"}


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(200), "word", 200, min_frequency=1)


def bilstm(vocab_size: int, layers: int = 2, causal: bool = False, dropout: float = 0.0) -> Recurrent:
    torch.manual_seed(0)
    return Recurrent(RecurrentConfig(vocab_size=vocab_size, causal=causal, layers=layers, embedding_size=12,
                                     hidden_size=10, dropout=dropout, hidden_dropout=dropout))


def cvt_task(tmp_path, n: int = 20):
    path = tmp_path / "unlabeled.txt"
    path.write_text("\n".join(sentences(n, seed=5)) + "\n\n")
    return make_task("tag", {"cvt_unlabeled": str(path)})


def unlabeled(tok, n: int = 3):
    words = [s.split() for s in sentences(n, seed=9)]
    return unlabeled_batch(words, tok, 64)


def test_each_view_sees_only_its_side_of_the_word(tmp_path, tok):
    task = cvt_task(tmp_path)
    model = task.build(bilstm(tok.vocab_size), 3, "max", 0.1).eval()
    batch = unlabeled(tok)
    length = int(batch["padding"][0].sum())
    p = length // 2  # a word in the middle of row 0 (word tokenizer: one token per word, <s> first)
    assert batch["after"][0, p] == p + 1 and batch["after"][0, 0] == -1 and batch["counts"]["loss"] > 0
    gen = random.Random(0)

    def changed(positions) -> dict:
        other = dict(batch, ids=batch["ids"].clone())
        for q in positions:
            other["ids"][0, q] = (int(other["ids"][0, q]) - 5 + gen.randint(1, tok.vocab_size - 6)) % \
                (tok.vocab_size - 5) + 5  # another word, never a special token
        return other

    def same(view: str, other: dict, at: slice) -> bool:
        """Are the view's predictions the same in row 0 at the words (where it predicts) of positions ``at``?"""
        (logits, valid), (changed_logits, _) = model.views(batch)[view], model.views(other)[view]
        return torch.allclose(logits[0, at][valid[0, at]], changed_logits[0, at][valid[0, at]], atol=1e-6)

    later, earlier = changed(range(p + 1, length - 1)), changed(range(1, p))
    here_and_later, here_and_earlier = changed(range(p, length - 1)), changed(range(1, p + 1))
    assert same("fwd", later, slice(0, p + 1)) and not same("fwd", earlier, slice(p, p + 1))
    assert same("bwd", earlier, slice(p, length)) and not same("bwd", later, slice(p, p + 1))
    assert same("future", here_and_later, slice(1, p + 1)) and not same("future", changed([p - 1]), slice(p, p + 1))
    assert same("past", here_and_earlier, slice(p, length - 1)) and not same("past", changed([p + 1]), slice(p, p + 1))
    primary = model.outputs(batch)[0, p]
    assert not torch.allclose(primary, model.outputs(later)[0, p]) and not torch.allclose(primary,
                                                                                           model.outputs(earlier)[0, p])
    views = model.views(batch)
    assert not views["future"][1][0, 0] and views["past"][1][0, p]  # <s> is no word; inside rows the views exist


def test_unlabeled_loss_trains_the_views_against_a_fixed_dropout_free_primary(tmp_path, tok):
    task = cvt_task(tmp_path)
    model = task.build(bilstm(tok.vocab_size, dropout=0.5), 3, "max", 0.5).train()
    batch = unlabeled(tok)
    first, second = model.soft_targets(batch), model.soft_targets(batch)
    assert torch.equal(first, second) and model.training and model.backbone.training  # eval mode, restored after
    assert not torch.allclose(model.views(batch)["fwd"][0], model.views(batch)["fwd"][0])  # dropout is on
    model(batch).backward()
    assert all(p.grad is None or not p.grad.any() for p in model.primary.parameters())
    assert all(p.grad is not None and p.grad.any() for p in model.auxiliary.parameters())
    assert model.backbone.layers[0].rnn.weight_ih_l0.grad.any()  # the shared encoder learns from the views
    assert model.backbone.layers[1].rnn.weight_ih_l0.grad is None  # the top layer feeds only the primary
    labeled = {**batch, "targets": torch.where(batch["after"] >= 0, 1, -100)}
    del labeled["after"]
    model.zero_grad()
    model(labeled).backward()  # labeled batches train the primary alone (the paper's L_sup)
    assert all(p.grad is None for p in model.auxiliary.parameters())
    assert all(p.grad.any() for p in model.primary.parameters())


def test_the_unlabeled_loss_is_each_views_kl_summed_over_its_valid_positions(tmp_path, tok):
    """Every position is scored and the invalid ones zeroed, as selecting them would make a GPU's host wait for the
    device (issue 35): the loss is Σ over views of KL(primary ‖ view) at that view's valid positions (§3.1)."""
    model = cvt_task(tmp_path).build(bilstm(tok.vocab_size), 3, "max", 0.0)
    batch = unlabeled(tok)
    targets = model.soft_targets(batch)
    assert not all(valid.all() for _, valid in model.views(batch).values())  # some positions are left out
    expected = sum(F.kl_div(F.log_softmax(logits[valid], -1), targets[valid], log_target=True, reduction="sum")
                   for logits, valid in model.views(batch).values())
    torch.testing.assert_close(model(batch), expected)


def test_trainer_steps_alternate_labeled_and_unlabeled_and_repeat_on_resume(tmp_path, tok):
    task = cvt_task(tmp_path, n=10)
    labeled_steps = []

    def labeled(k: int, progress: float) -> list[dict]:
        labeled_steps.append(k)
        return [{"labeled": k}]

    batches, stride = task.training_batches(labeled, tok, 64, 4, seed=3)
    assert stride == 2
    kinds = ["after" in batches(step, 0.0)[0] for step in range(6)]
    assert kinds == [False, True] * 3 and labeled_steps == [0, 1, 2]
    again, _ = cvt_task(tmp_path, n=10).training_batches(labeled, tok, 64, 4, seed=3)  # a resumed run
    for step in (1, 3, 7, 9):
        assert torch.equal(batches(step, 0.5)[0]["ids"], again(step, 0.5)[0]["ids"])
    assert not torch.equal(batches(1, 0.0)[0]["ids"], batches(3, 0.0)[0]["ids"])
    seen = torch.cat([batches(step, 0.0)[0]["ids"][:, 1] for step in (1, 3, 5, 7, 9)])[:10]  # one pass: 10 sentences
    first_words = torch.tensor([tok.backend.token_to_id(s.split()[0]) for s in sentences(10, seed=5)])
    assert sorted(seen.tolist()) == sorted(first_words.tolist())


def test_the_backbone_must_be_a_bidirectional_recurrent_stack_of_two_layers(tmp_path, tok):
    task = cvt_task(tmp_path)
    transformer = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=16, layers=2, heads=2,
                                                intermediate=32, max_positions=64))
    for backbone, kind in ((transformer, "a transformer"), (bilstm(tok.vocab_size, causal=True), "a causal 2-layer"),
                           (bilstm(tok.vocab_size, layers=1), "a bidirectional 1-layer")):
        with pytest.raises(SesameError, match=f"--from: cross-view training .* but the backbone is {kind}"):
            task.build(backbone, 3, "max", 0.1)
    # building (as prediction does) never reads the unlabeled file
    model = make_task("tag", {"cvt_unlabeled": str(tmp_path / "gone.txt")}).build(bilstm(tok.vocab_size), 3, "", 0.1)
    assert isinstance(model, CrossViewModel) and set(model.auxiliary) == set(CVT_VIEWS)
    alone = make_task("tag", {"head": "mlp"}).build(transformer, 3, "", 0.1)  # the supervised baseline
    assert isinstance(alone, CrossViewModel) and not len(alone.auxiliary)
    with pytest.raises(SesameError, match="head=linear: cross-view training"):
        make_task("tag", {"head": "linear", "cvt_unlabeled": "text.txt"})
    bad = tmp_path / "bad.txt"
    bad.write_text("a sentence here\n-DOCSTART- -X- O\n")
    with pytest.raises(SesameError, match=r"bad.txt:2: a CoNLL document line"):
        make_task("tag", {"cvt_unlabeled": str(bad)}).labels([{"tags": ["O", "B-X"]}], "train.txt")
    with pytest.raises(SesameError, match=r"missing.txt: no such file"):
        make_task("tag", {"cvt_unlabeled": str(tmp_path / "missing.txt")}).labels([{"tags": ["O", "B-X"]}], "t")


def conll(n: int, seed: int) -> str:
    blocks = []
    for text in sentences(n, seed):
        blocks.append("\n".join(f"{w} {TAGS.get(w.lower().strip('.'), 'O')}" for w in text.split()))
    return "\n\n".join(blocks) + "\n"


def test_a_cvt_run_trains_alternately_and_predicts_without_its_unlabeled_file(tmp_path, one_thread):
    (tmp_path / "train.txt").write_text(conll(24, 1))
    (tmp_path / "dev.txt").write_text(conll(8, 2))
    text = tmp_path / "unlabeled.txt"
    text.write_text("\n".join(sentences(40, seed=3)) + "\n")
    run = tmp_path / "run"
    metrics = sesame.finetune("scratch:bilstm:tiny", str(tmp_path / "train.txt"), str(tmp_path / "dev.txt"), str(run),
                              task="tag", epochs=2, batch_size=8, lr=3e-3, progress=False,
                              task_options={"cvt_unlabeled": str(text)})
    assert "f1" in metrics
    config = json.loads((run / "config.json").read_text())
    assert config["task_options"]["cvt_unlabeled"] == str(text)
    state = json.loads((run / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 2 * 2 * 3  # epochs × stride × labeled steps (24 sentences in batches of 8)
    text.unlink()
    predicted = sesame.load(run).predict(["the cat sleeps in the city"])
    assert len(predicted[0]["tags"]) == 6
