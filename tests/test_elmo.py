"""ELMo's biLM (Peters et al. 2018): each direction sees only its side, padding changes nothing, the
scalar mix is eq. (1), the character table travels with the weights, and the biLM objective learns."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

import sesame
from sesame import models, objectives
from sesame.models.elmo import BOW, EOW, FIRST_SPECIAL, Elmo, ElmoConfig, word_chars
from sesame.objectives.bilm import BiLM, log_q, log_uniform_sample, sampled_cross_entropy
from sesame.tokenizer import SpecialIds, train_tokenizer
from sesame.run import load_backbone, load_tokenizer
from tests.conftest import sentences

VOCAB = 40
WORDS = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"] + [f"w{i}é" * (i % 7 + 1) for i in range(5, VOCAB)]


def tiny(scalar_mix: bool = False, dropout: float = 0.0) -> Elmo:
    torch.manual_seed(0)
    cfg = ElmoConfig.sized("tiny", VOCAB, 0, dropout)
    cfg.scalar_mix = scalar_mix
    model = Elmo(cfg)
    model.set_vocabulary(WORDS, [0, 1, 2, 3, 4])
    return model.eval()


def test_each_direction_sees_only_its_side():
    model = tiny()
    ids = torch.randint(5, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    forward, backward = model.directions(ids)
    for t in range(ids.shape[1]):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] - 5 + 1) % (VOCAB - 5) + 5  # another ordinary word at position t
        f, b = model.directions(changed)
        # the forward state at s (which predicts token s + 1) reads tokens ≤ s; the backward state at s, tokens ≥ s
        torch.testing.assert_close(f[:, :t], forward[:, :t])
        torch.testing.assert_close(b[:, t + 1:], backward[:, t + 1:])
        assert not torch.allclose(f[:, t], forward[:, t]) and not torch.allclose(b[:, t], backward[:, t])


def test_targets_are_the_neighbours():
    model = tiny()
    objective = BiLM(model, SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))
    window = torch.arange(10).unsqueeze(0) + 5
    batch = objective.make_batch(window, [torch.Generator()])
    assert batch["ids"].tolist() == [list(range(6, 14))]
    assert batch["targets"].tolist() == [list(range(7, 15))]  # next token
    assert batch["previous"].tolist() == [list(range(5, 13))]  # previous token
    assert batch["counts"] == {"forward": 8, "backward": 8}
    assert BiLM.window_length(8) == 10


def test_token_layer_is_duplicated_and_context_free():
    model = tiny()
    ids = torch.tensor([[7, 8, 9, 7], [9, 7, 5, 6]])
    x = model(ids, all_layers=True)[0]
    assert x.shape[-1] == model.config.hidden
    torch.testing.assert_close(x[..., :32], x[..., 32:])  # [x; x]
    torch.testing.assert_close(x[0, 0], x[1, 1])  # word 7 has one vector wherever it is
    with_long_word = model.tokens(torch.tensor([[7, 13]]))  # 13's spelling is the longest: the batch is cut to it
    torch.testing.assert_close(with_long_word[0, 0], model.tokens(torch.tensor([[7]]))[0, 0])


def test_off_the_cpu_the_token_layer_reads_nothing_back_and_gives_the_same_vectors(monkeypatch):
    """Issue 35: off the CPU the character CNN runs once per position at the full ``max_chars`` width, instead of
    once per distinct id cut to the batch's longest word (finding either would make the host wait for the device):
    the same states. ``meta`` stands in for a GPU: it has no values, so a forward pass that read one back would fail."""
    model = tiny()
    ids = torch.tensor([[7, 13, 9, 7], [9, 7, 5, 0]])
    padding = ids != 0
    on_the_cpu = model(ids, padding=padding, all_layers=True)
    monkeypatch.setattr(sesame.models.elmo, "host_can_read", lambda tensor: False)
    for got, expected in zip(model(ids, padding=padding, all_layers=True), on_the_cpu):
        torch.testing.assert_close(got, expected)
    monkeypatch.undo()
    states = tiny().to("meta")(ids.to("meta"), padding=padding.to("meta"))
    assert states.device.type == "meta" and states.shape == on_the_cpu[-1].shape


def test_scalar_mix_is_a_softmax_weighted_sum_times_gamma():
    model = tiny(scalar_mix=True)
    with torch.no_grad():
        model.mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
        model.mix.gamma.fill_(3.0)
    ids = torch.randint(5, VOCAB, (2, 5))
    layers = model(ids, all_layers=True)
    weights = torch.softmax(model.mix.scalars, 0).detach()
    assert abs(float(weights.sum()) - 1.0) < 1e-6
    expected = 3.0 * sum(w * h for w, h in zip(weights, layers))
    torch.testing.assert_close(model.features(ids), expected)
    torch.testing.assert_close(model(ids), expected)
    assert model.config.feature_width == model.features(ids).shape[-1]
    try:
        tiny().features(ids)
    except ValueError as err:
        assert "scalar_mix" in str(err)
    else:
        raise AssertionError("features without a scalar mix must fail")


def test_character_table_round_trips_through_safetensors(tmp_path):
    model = tiny()
    assert model.chars[2].tolist()[:3] == [BOW, FIRST_SPECIAL + 2, EOW]  # <s> has its reserved code
    assert model.chars[5].tolist() == word_chars(WORDS[5], 50)
    assert model.chars[5, 1:5].tolist() == [b + 1 for b in "w5é".encode()]  # UTF-8 bytes
    assert model.chars[39].tolist()[-1] == 0  # padded to max_chars
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    fresh = Elmo(ElmoConfig.sized("tiny", VOCAB, 0, 0.0))
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"))
    assert torch.equal(fresh.chars, model.chars)
    ids = torch.randint(0, VOCAB, (2, 6))
    torch.testing.assert_close(fresh.eval()(ids), model(ids))


def test_layer_groups_cover_every_parameter():
    model = tiny(scalar_mix=True)
    groups = model.layer_modules()
    assert len(groups) == model.config.layers + 1
    covered = {id(p) for group in groups for module in group for p in module.parameters()}
    assert covered == {id(p) for p in model.parameters()}


def test_bilm_loss_falls_on_a_repeated_corpus(one_thread):
    texts = sentences(40)
    tok = train_tokenizer(texts, "word", 100)
    model = Elmo(ElmoConfig.sized("tiny", tok.vocab_size, tok.specials.pad, 0.0))
    objective = BiLM.build(model, tok)
    assert model.chars[tok.backend.token_to_id("cat")].tolist()[:5] == [BOW] + [b + 1 for b in b"cat"] + [EOW]
    stream = torch.tensor([i for ids in tok.encode(texts) for i in ids])
    windows = stream[: 8 * 18].view(8, 18)
    batch = objective.make_batch(windows, [torch.Generator() for _ in range(8)])
    optimizer = torch.optim.Adam(objective.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        parts = objective(batch)
        loss = sum(parts[name] / batch["counts"][name] for name in BiLM.part_names)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append({name: parts[name].item() / batch["counts"][name] for name in BiLM.part_names})
    for name in BiLM.part_names:
        assert losses[-1][name] < 0.5 * losses[0][name], (name, losses[0], losses[-1])


def test_log_uniform_sampler_follows_q():
    torch.manual_seed(0)
    counts = torch.bincount(log_uniform_sample(100_000, 10, torch.device("cpu")), minlength=10)
    q = log_q(torch.arange(10), 10).exp()
    assert abs(float(q.sum()) - 1.0) < 1e-6
    torch.testing.assert_close(counts / 100_000, q, atol=0.01, rtol=0)


def test_sampled_softmax_leaves_out_accidental_hits_and_is_for_training_only():
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(4, 8), torch.randn(20, 8), torch.randn(20)
    targets = torch.tensor([3, 3, 3, 3])
    assert float(sampled_cross_entropy(hidden, weight, bias, targets, torch.tensor([3, 3]), 2)) == 0.0
    negatives = torch.tensor([5, 9, 3])
    q = log_q(torch.tensor([3, 5, 9]), 20) + torch.log(torch.tensor(3.0))
    logits = hidden @ weight[[3, 5, 9]].t() + bias[[3, 5, 9]] - q  # the hit (id 3 among the samples) is left out
    expected = torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long), reduction="sum")
    torch.testing.assert_close(sampled_cross_entropy(hidden, weight, bias, targets, negatives, 3), expected)
    model = tiny()
    objective = BiLM(model, SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4), samples=8).eval()
    batch = objective.make_batch(torch.randint(5, VOCAB, (2, 10)), [torch.Generator()] * 2)
    full = BiLM(model, SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)).eval()
    full.softmax.load_state_dict(objective.softmax.state_dict())
    assert objective(batch) == full(batch)  # evaluation scores the full softmax
    assert BiLM(model, SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4), samples=VOCAB).samples == 0


def test_pretrain_reports_both_directions(tmp_path, monkeypatch, one_thread):
    monkeypatch.setitem(models.ARCHITECTURES, "elmo", (ElmoConfig, Elmo))  # as the lead registers them
    monkeypatch.setitem(objectives.OBJECTIVES, "bilm", BiLM)
    corpus, run = tmp_path / "corpus.txt", tmp_path / "elmo"
    corpus.write_text("\n".join(sentences(6)) * 100 + "\n")  # a few sentences, repeated: learnable both ways
    sesame.pretrain([str(corpus)], str(run), family="elmo", size="tiny", vocab_size=100, seq_len=16, batch_size=8,
                    max_steps=50, eval_every=50, lr=1e-2, progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    dev = [r for r in records if r["split"] == "dev"][-1]
    assert train[-1] < 0.5 * train[0]
    assert dev["loss"] == dev["forward_loss"] + dev["backward_loss"]
    assert max(dev["forward_loss"], dev["backward_loss"]) < 0.5 * train[0] / 2
    backbone, tok = load_backbone(run), load_tokenizer(run)  # the character table came back with the weights
    assert backbone.chars[tok.backend.token_to_id("garden")].tolist()[:8] == [BOW] + [b + 1 for b in b"garden"] + [EOW]
