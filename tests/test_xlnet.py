"""XLNet (Yang et al. 2019) on Transformer-XL (Dai et al. 2019): relative attention against a brute-force
computation, the permutation masks' defining properties, the query stream's blindness to its own token, the
identity order as a causal LM, memory as the two segments together, and the family end to end."""
import json

import pytest
import torch

from sesame.cli import main
from sesame.families import FAMILIES, backbone_config
from sesame.models import XLNet, XLNetConfig, build_model
from sesame.models.xlnet import distances, relative_encodings, relative_shift, sinusoids, target_mapping
from sesame.objectives import OBJECTIVES
from sesame.objectives.plm import PermutationLM, factorisation_order, permutation_masks, select_targets
from sesame.run import load_tokenizer
from sesame.tokenizer import SpecialIds

from .conftest import documents, sentences

pytestmark = pytest.mark.usefixtures("one_thread")

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def model(mem_len: int = 16, seed: int = 0) -> XLNet:
    torch.manual_seed(seed)
    net = XLNet(XLNetConfig(vocab_size=40, hidden=16, layers=2, heads=2, intermediate=32, dropout=0.0,
                            mem_len=mem_len)).eval()
    torch.nn.init.normal_(net.embed.tokens.weight)  # N(0, 1): tokens, and so logits, far apart
    return net


def draws(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_relative_shift_against_brute_force():
    scores = torch.randn(3, 2, 5, 8 + 5 - 1)  # 5 queries after 3 memory keys: 8 keys
    positions = torch.tensor([[0, 1, 2, 3, 4], [4, 0, 2, 2, 1], [3, 3, 0, 1, 4]])
    shifted = relative_shift(scores, positions, 8)
    table = distances(5, 8, scores.device).tolist()  # the distance each score column stands for
    for b in range(3):
        for i in range(5):
            for k in range(8):
                column = table.index(3 + int(positions[b, i]) - k)  # query at 3 + p, key k
                assert torch.equal(shifted[b, :, i, k], scores[b, :, i, column])


def test_attention_scores_are_transformer_xl_and_segment_terms_brute_force():
    """One layer's output against the scores written out per (query, key) pair: (q_i + u)·k_j + (q_i + v)·W_r R_{i−j}
    + (q_i + b)·s_{ij} (Dai et al. 2019, §3.3; Yang et al. 2019, §2.5), softmax over the visible keys."""
    net = model()
    att = net.attention[0]
    with torch.no_grad():
        for p in (att.r_w_bias, att.r_r_bias, att.r_s_bias):
            p.normal_()  # non-zero biases, so each term shows
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 3, 16)
    types = torch.tensor([[0, 0, 1, 2], [1, 0, 0, 0]])
    mask = torch.rand(2, 4, 7) < 0.7
    mask[:, torch.arange(4), 3 + torch.arange(4)] = True  # each sees itself
    positions = torch.arange(4)[None]
    context = torch.cat([memory, x], 1)
    relative = relative_encodings(4, 7, 16)  # (1, R, hidden)
    different = types[:, :, None] != torch.cat([torch.zeros(2, 3, dtype=torch.long), types], 1)[:, None, :]
    out = att(x, att.keys_of(context, relative), positions, different, mask)

    q, k, v = (att.split(f(y)) for f, y in ((att.q, x), (att.k, context), (att.v, context)))
    expected = torch.zeros(2, 2, 4, 8)
    for b in range(2):
        for n in range(2):
            for i in range(4):
                scores = torch.full((7,), float("-inf"))
                for j in range(7):
                    r = att.split(att.r(sinusoids(torch.tensor([3 + i - j]), 16))[None])[0, n, 0]
                    s = att.seg_embed[int(different[b, i, j]), n]
                    score = ((q[b, n, i] + att.r_w_bias[n]) @ k[b, n, j] + (q[b, n, i] + att.r_r_bias[n]) @ r
                             + (q[b, n, i] + att.r_s_bias[n]) @ s) / 8 ** 0.5
                    scores[j] = score if mask[b, i, j] else float("-inf")
                expected[b, n, i] = torch.softmax(scores, 0) @ v[b, n]
    reference = att.norm(x + att.o(expected.transpose(1, 2).flatten(2)))
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)


def sampled(n: int = 12, perm_size: int = 5, k: int = 3, rows: int = 4):
    keys = torch.stack([torch.rand(n, generator=g) for g in draws(rows)])
    rank = factorisation_order(keys, perm_size)
    target = select_targets(rank, perm_size, k)
    return keys, rank, target


def test_order_is_blocks_in_turn_each_in_its_keys_order_and_the_last_k_th_of_each_is_predicted():
    keys, rank, target = sampled()
    for row in range(4):
        blocks = [list(range(s, min(s + 5, 12))) for s in range(0, 12, 5)]
        order = [p for block in blocks for p in sorted(block, key=lambda p: float(keys[row, p]))]
        assert [order.index(p) for p in range(12)] == rank[row].tolist()
        predicted = [p for block in blocks for p in sorted(block, key=lambda p: float(keys[row, p]))[
            len(block) - max(1, round(len(block) / 3)):]]  # 5 → 2, 5 → 2, 2 → 1
        assert sorted(predicted) == target[row].nonzero().flatten().tolist()


@pytest.mark.parametrize("past", [0, 3])
def test_permutation_masks_order_the_targets_strictly_and_show_every_non_target(past):
    _, rank, target = sampled()
    predict = target.nonzero()[:, 1].view(4, -1)
    content, query = permutation_masks(torch.where(target, rank, -1), predict, past)
    assert content.shape == (4, 12, past + 12) and query.shape == (4, predict.shape[1], past + 12)
    assert content[..., :past].all() and query[..., :past].all()  # memory is seen by all
    content, query = content[..., past:], query[..., past:]
    for row in range(4):
        t, nt = predict[row], (~target[row]).nonzero().flatten()
        among = query[row][:, t]  # the query mask restricted to the targets
        earlier = rank[row, t][None, :] < rank[row, t][:, None]  # j before i in the sampled order
        assert torch.equal(among, earlier)
        assert not among.diagonal().any()  # strict: irreflexive
        assert torch.equal(among | among.T | torch.eye(len(t), dtype=torch.bool), torch.ones_like(among))  # total
        assert not (among & among.T).any()  # antisymmetric
        assert torch.equal((among.float() @ among.float() > 0) & ~among, torch.zeros_like(among))  # transitive
        assert query[row][:, nt].all() and content[row][:, nt].all()  # every position sees every non-target
        assert content[row].diagonal().all()  # the content stream sees itself
        assert not content[row][nt][:, t].any()  # the context does not see the predicted tokens
        assert torch.equal(content[row][t][:, t], among | torch.eye(len(t), dtype=torch.bool))


def logits(net: XLNet, ids, content, query, predict, memory=None, types=None) -> torch.Tensor:
    out = net.streams(ids, types=types, memory=memory, content_mask=content, query_mask=query, targets=predict)
    return out.query @ net.embed.tokens.weight.T


def test_a_targets_own_token_never_changes_its_query_stream_logit():
    net = model()
    ids = torch.randint(5, 40, (3, 12))
    _, rank, target = sampled(rows=3)
    predict = target.nonzero()[:, 1].view(3, -1)
    memory = [torch.randn(3, 4, 16) for _ in range(3)]
    content, query = permutation_masks(torch.where(target, rank, -1), predict, past=4)
    before = logits(net, ids, content, query, predict, memory)
    for slot in range(predict.shape[1]):
        changed = ids.clone()
        rows = torch.arange(3)
        changed[rows, predict[:, slot]] = (ids[rows, predict[:, slot]] + 7) % 40
        after = logits(net, changed, content, query, predict, memory)
        torch.testing.assert_close(after[:, slot], before[:, slot], atol=1e-6, rtol=0)
        later = rank.gather(1, predict) > rank.gather(1, predict[:, slot:slot + 1])  # targets after it in the order
        assert ((after - before).abs().amax(-1)[later] > 1e-3).all()  # ... read it: the perturbation reaches them


def test_identity_order_with_every_token_a_target_is_a_causal_lm():
    """"Causal LM" here: the same weights as Transformer-XL's one-directional model (XLNet's ``attn_type="uni"``),
    its content stream under the causal mask (position i sees 0..i) and its query stream predicting x_i from
    positions 0..i−1, every position a target. The identity order with K = 1 makes exactly those masks, so the
    predictions are equal; and prediction i reads only x_<i (changing x_i..x_end leaves it as it was)."""
    net = model()
    ids = torch.randint(5, 40, (2, 9))
    rank = factorisation_order(torch.arange(9.0)[None].expand(2, -1) / 9, perm_size=9)
    target = select_targets(rank, perm_size=9, k=1)
    assert rank[0].tolist() == list(range(9)) and target.all()
    predict = target.nonzero()[:, 1].view(2, -1)
    content, query = permutation_masks(torch.where(target, rank, -1), predict)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    plm = logits(net, ids, content, query, predict)
    clm = logits(net, ids, causal.expand(2, -1, -1), causal.tril(-1).expand(2, -1, -1), torch.arange(9).expand(2, -1))
    torch.testing.assert_close(plm, clm, atol=0, rtol=0)
    for i in range(9):
        future = ids.clone()
        future[:, i:] = (ids[:, i:] + 11) % 40
        torch.testing.assert_close(logits(net, future, content, query, predict)[:, i], plm[:, i], atol=1e-6, rtol=0)


@pytest.mark.parametrize("mem_len", [7, 4])
def test_memory_gives_the_content_states_of_both_segments_together(mem_len):
    """Segment 2 after the memory of segment 1 = both as one sequence where segment 1's positions see only segment 1
    and segment 2's see the last ``mem_len`` positions of segment 1 and segment 2 (relative positions match)."""
    net = model(mem_len)
    ids = torch.randint(5, 40, (2, 14))
    types = torch.zeros(2, 14, dtype=torch.long)
    types[:, -1] = 2
    first = net.streams(ids[:, :7], types=types[:, :7], content_mask=torch.ones(2, 7, 7, dtype=torch.bool))
    memory = net.remember(None, first.layers)
    assert [m.shape for m in memory] == [(2, mem_len, 16)] * 2 and not any(m.requires_grad for m in memory)
    second = net.streams(ids[:, 7:], types=types[:, 7:], memory=memory,
                         content_mask=torch.ones(2, 7, mem_len + 7, dtype=torch.bool))
    together = torch.zeros(14, 14, dtype=torch.bool)
    together[:7, :7] = True
    together[7:, 7 - mem_len:] = True
    both = net.streams(ids, types=types, content_mask=together.expand(2, -1, -1))
    for layer_apart, layer_together in zip(second.layers, both.layers):
        torch.testing.assert_close(layer_apart, layer_together[:, 7:], atol=1e-5, rtol=1e-5)


def test_remember_keeps_the_text_part_and_the_last_mem_len_states():
    net = model(mem_len=5)
    layers = [torch.arange(6.0)[None, :, None].expand(1, 6, 16) + 10 * i for i in range(3)]
    first = net.remember(None, layers, keep=4)  # positions 0..3 (4 and 5: <sep> <cls>)
    assert first[1][0, :, 0].tolist() == [10, 11, 12, 13]
    second = net.remember(first, [x + 100 for x in layers], keep=4)
    assert second[0][0, :, 0].tolist() == [3, 100, 101, 102, 103]


def objective(**options) -> PermutationLM:
    return PermutationLM(model(mem_len=8), SPECIALS, **options)


def test_batches_leave_the_input_unmasked_and_predict_only_the_targets():
    obj = objective(k=4, segments=3)
    n = obj.window_length(10, segments=3)
    assert n == 3 * 8
    windows = torch.randint(5, 40, (2, n))
    batch = obj.make_batch(windows, draws(2))
    ids = batch["ids"]
    assert ids.shape == (2, 3, 10)
    assert torch.equal(ids[..., :8].flatten(1), windows)  # no token replaced: the order is in the masks alone
    assert (ids[..., 8] == SPECIALS.sep).all() and (ids[..., 9] == SPECIALS.cls).all()
    assert batch["predict"].shape == (2, 3, 2) and (batch["predict"] < 8).all()  # round(8/4) of the text
    assert torch.equal(batch["targets"], ids.gather(-1, batch["predict"]))
    assert (batch["rank"][..., 8:] == -1).all()  # <sep> <cls>: context, never predicted
    assert torch.equal(obj.make_batch(windows[1:], draws(1, seed=1))["rank"][0], batch["rank"][1])  # per example
    assert target_mapping(batch["predict"][:, 0], 10).shape == (2, 2, 10)  # transformers' (batch, P, length)


def test_loss_sums_every_segment_after_the_memory_of_those_before_and_goes_down():
    obj = objective(k=3, segments=2).train()
    windows = torch.randint(5, 40, (4, obj.window_length(12, segments=2)))
    batch = obj.make_batch(windows, draws(4))
    single = objective(k=3, segments=1)
    single.load_state_dict(obj.state_dict())
    alone = [{key: value[:, s:s + 1] for key, value in batch.items()} for s in range(2)]
    net, types = obj.backbone, torch.tensor([0] * 11 + [2]).expand(4, -1)
    with torch.no_grad():
        first = net.streams(batch["ids"][:, 0], types=types, content_mask=torch.ones(4, 12, 12, dtype=torch.bool))
        memory = net.remember(None, first.layers, keep=10)  # the text: not <sep> <cls>
        content, query = permutation_masks(batch["rank"][:, 1], batch["predict"][:, 1], past=8)
        out = net.streams(batch["ids"][:, 1], types=types, memory=memory, content_mask=content, query_mask=query,
                          targets=batch["predict"][:, 1])
        logit = out.query @ net.embed.tokens.weight.T + obj.bias
        after_memory = torch.nn.functional.cross_entropy(logit.flatten(0, 1), batch["targets"][:, 1].flatten(),
                                                         reduction="sum")
        content, query = permutation_masks(batch["rank"][:, 1], batch["predict"][:, 1])
        forgetful = net.streams(batch["ids"][:, 1], types=types, content_mask=content, query_mask=query,
                                targets=batch["predict"][:, 1])
        together, first_alone = obj(batch), single(alone[0])
    assert together.item() == pytest.approx((first_alone + after_memory).item(), rel=1e-5)
    assert (out.query - forgetful.query).abs().max() > 1e-2  # segment 2 read segment 1's memory
    optimizer = torch.optim.Adam(obj.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = obj(batch) / batch["targets"].numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_xlnet_row_tokenizer_ends_with_sep_cls():
    cfg = backbone_config("xlnet", "mini", 500, 0)
    assert isinstance(cfg, XLNetConfig) and cfg.to_dict()["arch"] == "xlnet" and not cfg.learned_positions
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.intermediate, cfg.norm, cfg.activation) == (
        4, 256, 4, 1024, "post", "gelu_tanh")  # XLNet's code's GELU: the tanh approximation
    assert isinstance(build_model(cfg.to_dict()), XLNet)
    assert OBJECTIVES["plm"].trains("xlnet") and not OBJECTIVES["mlm"].trains("xlnet")
    assert not OBJECTIVES["plm"].trains("transformer")
    assert FAMILIES["xlnet"].pooling == "last"


def test_pretrain_evaluate_and_classify_end_to_end(tmp_path, labeled, capsys):
    """`sesame pretrain --family xlnet` → evaluate → fine-tune a classifier reading <cls> (last) → predict; a new
    run starts from the corpus's counts at their rate (the family's default after two 15-minute seeds)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(documents(sentences(300)))
    run, q = tmp_path / "run", ["--no-progress"]
    assert main(q + ["pretrain", "--family", "xlnet", "--size", "tiny", "--corpus", str(corpus), "--vocab-size",
                     "200", "--seq-len", "24", "--batch-size", "4", "--max-steps", "3", "--eval-every", "3",
                     "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert (config["objective"], config["model"]["arch"], config["pooling"]) == ("plm", "xlnet", "last")
    assert (config["embedding_init"], config["train"]["lr"]) == ("ppmi", 3e-4)
    tok = load_tokenizer(run)
    encoding = tok.encodings(["The cat sleeps."], ["A dog runs."])[0]
    assert encoding.ids[-2:] == [tok.specials.sep, tok.specials.cls] and tok.specials.cls not in encoding.ids[:-1]
    assert encoding.type_ids[-1] == 2 and set(encoding.type_ids[:-1]) == {0, 1}
    capsys.readouterr()
    read = []
    for memory in ([], ["--mem-len", "0"]):  # the text read left to right, with the run's memory and with none
        assert main(["evaluate", "--model", str(run), "--data", str(corpus), "--json", *memory]) == 0
        read.append(json.loads(capsys.readouterr().out))
    assert [r["mem_len"] for r in read] == [128, 0] and read[0]["tokens"] == read[1]["tokens"]
    assert read[0]["loss"] != read[1]["loss"] and all(r["bits_per_byte"] > 0 for r in read)
    train, dev = labeled
    tuned = tmp_path / "tuned"
    assert main(q + ["finetune", "--from", str(run), "--task", "classify", "--train", str(train), "--dev", str(dev),
                     "--epochs", "1", "--batch-size", "16", "--max-length", "32", "--out", str(tuned)]) == 0
    assert json.loads((tuned / "config.json").read_text())["pooling"] == "last"
    capsys.readouterr()
    assert main(["predict", "--model", str(tuned), "--input", str(dev)]) == 0
    predictions = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(predictions) == 40 and {p["label"] for p in predictions} <= {"animal", "none"}


def test_same_function_as_transformers_xlnet_under_a_table_of_names():
    """Parity is reachable: transformers' ``XLNetModel`` with these weights, renamed by the table in
    ``sesame.models.xlnet``'s docstring (reshaped, q/k/v/r transposed), gives the same content states without a
    permutation and the same query states with XLNet's ``perm_mask``, ``target_mapping`` and ``mems``."""
    transformers = pytest.importorskip("transformers")
    net = model(mem_len=4)
    hf = transformers.XLNetModel(transformers.XLNetConfig(vocab_size=40, d_model=16, n_layer=2, n_head=2, d_inner=32,
                                                          dropout=0.0, mem_len=4, layer_norm_eps=1e-12)).eval()
    ours = net.state_dict()
    weights = {"word_embedding.weight": ours["embed.tokens.weight"], "mask_emb": ours["embed.mask"].view(1, 1, 16)}
    for n in range(2):
        a, f, layer = f"attention.{n}.", f"feed_forward.{n}.", f"layer.{n}."
        weights |= {layer + f"rel_attn.{x}": ours[a + x + ".weight"].T.reshape(16, 2, 8) for x in "qkvr"}
        weights |= {layer + f"rel_attn.{x}": ours[a + x] for x in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")}
        weights |= {layer + "rel_attn.o": ours[a + "o.weight"].reshape(16, 2, 8)}
        for theirs, mine in (("rel_attn.layer_norm", a + "norm"), ("ff.layer_norm", f + "norm"),
                             ("ff.layer_1", f + "inp"), ("ff.layer_2", f + "out")):
            weights |= {f"{layer}{theirs}.{p}": ours[f"{mine}.{p}"] for p in ("weight", "bias")}
    assert not hf.load_state_dict(weights, strict=False).missing_keys
    ids, types = torch.randint(5, 40, (3, 12)), torch.tensor([0] * 6 + [1] * 5 + [2]).expand(3, -1)
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=types).last_hidden_state
        torch.testing.assert_close(net(ids, types), theirs, atol=1e-5, rtol=1e-5)
        _, rank, target = sampled(rows=3)
        predict = target.nonzero()[:, 1].view(3, -1)
        ranked = torch.where(target, rank, -1)
        memory = [torch.randn(3, 4, 16) for _ in range(2)]
        content, query = permutation_masks(ranked, predict, past=4)
        mine = net.streams(ids, types=types, memory=memory, content_mask=content, query_mask=query, targets=predict)
        perm_mask = (target[:, None, :] & (ranked[:, None, :] >= ranked[:, :, None])).float()  # 1: may not attend
        theirs = hf(ids, token_type_ids=types, perm_mask=perm_mask, target_mapping=target_mapping(predict, 12),
                    mems=[m.transpose(0, 1) for m in memory], use_mems=True)
        torch.testing.assert_close(mine.query, theirs.last_hidden_state, atol=1e-5, rtol=1e-5)
        for kept, given in zip(net.remember(memory, mine.layers), theirs.mems):  # the next segment's memory
            torch.testing.assert_close(kept, given.transpose(0, 1), atol=1e-5, rtol=1e-5)
