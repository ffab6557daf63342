"""Count-based token vectors (sesame.data.ppmi, Levy, Goldberg & Dagan 2015), `sesame pretrain --embedding-init
ppmi`, which starts a new model's token embeddings from them, `--embedding-rate`, the table's share of the rate
(0 keeps it as it started), and the masked LM's `--objective-option decoder=untied`, which trains the output layer
apart from the table."""
import json
import random

import numpy as np
import pytest
import torch
from scipy import sparse

import sesame
from sesame.data.ppmi import cooccurrence_counts, ppmi, ppmi_vectors, shard_cooccurrence, svd_vectors
from sesame.data.shards import Shards
from sesame.objectives import build_objective
from sesame.pipelines.starts import ppmi_embedding
from sesame.run import build_backbone, load_tokenizer, read_config
from sesame.specs import COUNTED_TRAINING, PRETRAIN_TRAINING
from sesame.train.checkpoint import load_weights
from sesame.train.recipes import table_share

from .conftest import refused


def test_counts_weigh_a_pair_by_its_distance_within_a_segment_and_leave_out_skipped_ids():
    ids = np.array([2, 3, 4, 5, 2, 3])
    segments = np.array([0, 0, 0, 0, 1, 1])
    counts = cooccurrence_counts(ids, segments, 6, 2, skip=[5]).toarray()
    expected = np.zeros((6, 6))
    for i, j, weight in ((2, 3, 1.0), (3, 4, 1.0), (2, 4, 0.5), (2, 3, 1.0)):  # 4-5 and 3-5: 5 is skipped
        expected[i, j] += weight
        expected[j, i] += weight
    np.testing.assert_allclose(counts, expected)  # 5-2 and 4-2 straddle the segments: not counted


def test_ppmi_is_the_positive_part_of_pmi_with_smoothed_contexts():
    draw = np.random.default_rng(0)
    dense = draw.integers(0, 5, (7, 7)).astype(float)
    dense = dense + dense.T
    got = ppmi(sparse.csr_matrix(dense), alpha=0.75).toarray()
    contexts = dense.sum(0) ** 0.75
    with np.errstate(divide="ignore"):  # log 0 where a pair never co-occurs
        pmi = np.log((dense / dense.sum()) / (dense.sum(1, keepdims=True) / dense.sum() * contexts / contexts.sum()))
    expected = np.where(dense > 0, np.maximum(pmi, 0), 0)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert (got >= 0).all() and (got > 0).sum() < (dense > 0).sum()  # some PMI was negative, and dropped


def test_svd_vectors_with_half_powers_factor_a_symmetric_low_rank_matrix():
    draw = np.random.default_rng(1)
    factor = draw.normal(size=(40, 3))
    matrix = factor @ factor.T  # rank 3, positive semi-definite: U Σ^½ (U Σ^½)ᵀ = U Σ Uᵀ is the matrix
    vectors = svd_vectors(sparse.csr_matrix(matrix), 3, seed=0)
    assert vectors.shape == (40, 3)
    np.testing.assert_allclose(vectors @ vectors.T, matrix, atol=1e-3)
    assert svd_vectors(sparse.csr_matrix(matrix), 64, seed=0).shape == (40, 39)  # no wider than the rank allows


def test_words_that_share_contexts_get_close_vectors():
    """The distributional hypothesis the method rests on: 'cat' and 'dog' take the same neighbours, 'car' others."""
    draw = random.Random(0)
    animal, vehicle = ["feeds", "pets", "the", "furry", "sleepy"], ["drives", "parks", "the", "fast", "red"]
    words = {w: i for i, w in enumerate(sorted({"cat", "dog", "car", "bus", *animal, *vehicle}))}
    stream = []
    for _ in range(400):
        head, context = draw.choice([("cat", animal), ("dog", animal), ("car", vehicle), ("bus", vehicle)])
        stream += [draw.choice(context), head, draw.choice(context)]
    ids = np.array([words[w] for w in stream])
    vectors = svd_vectors(ppmi(cooccurrence_counts(ids, np.zeros_like(ids), len(words), 2)), 4, seed=0)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cos = lambda a, b: float(unit[words[a]] @ unit[words[b]])  # noqa: E731
    assert cos("cat", "dog") > 0.9 and cos("car", "bus") > 0.9 and cos("cat", "car") < 0.5


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny BERT pre-trained one step with --embedding-init ppmi on three documents of repeated words."""
    folder = tmp_path_factory.mktemp("ppmi")
    draw = random.Random(2)
    words = "apple banana cherry grape lemon mango melon olive peach pear plum".split()
    (folder / "corpus.txt").write_text("\n\n".join(" ".join(draw.choice(words) for _ in range(300))
                                                   for _ in range(6)))
    sesame.pretrain([str(folder / "corpus.txt")], str(folder / "run"), size="tiny", vocab_size=120, seq_len=32,
                    batch_size=4, max_steps=1, objective="mlm", embedding_init="ppmi", progress=False)
    return folder


def test_shard_counts_keep_windows_inside_documents(tiny_run):
    run = tiny_run / "run"
    shards, tok = Shards(read_config(run, "--out").pretrained.shards), load_tokenizer(run)
    ids = np.concatenate([np.asarray(a, dtype=np.int64) for a in shards.arrays])
    documents = np.searchsorted(shards.doc_ends, np.arange(len(ids)), side="right")
    whole = cooccurrence_counts(ids, documents, tok.vocab_size, 10, tok.specials.all)
    assert len(set(documents.tolist())) > 1
    assert (shard_cooccurrence(shards, tok.vocab_size, 10, tok.specials.all) != whole).nnz == 0
    assert (cooccurrence_counts(ids, np.zeros_like(ids), tok.vocab_size, 10, tok.specials.all) != whole).nnz > 0


def test_the_embedding_starts_from_the_centred_vectors_at_the_random_rows_norm(tiny_run):
    run = tiny_run / "run"
    config, tok = read_config(run, "--out"), load_tokenizer(run)
    assert config.pretrained.embedding_init == "ppmi"
    assert json.loads((run / "config.json").read_text())["embedding_init"] == "ppmi"
    shards = Shards(config.pretrained.shards)
    torch.manual_seed(0)
    backbone = build_backbone(config)
    before = backbone.embed.tokens.weight.detach().clone()
    ppmi_embedding(backbone, shards, skip=tok.specials.all, seed=0, progress=False)
    after = backbone.embed.tokens.weight.detach()
    vectors, counted = ppmi_vectors(shards, *before.shape, skip=tok.specials.all, seed=0)
    ids = torch.from_numpy(np.flatnonzero(counted))
    assert 0 < len(ids) < before.shape[0] and not counted[tok.specials.all].any()
    width = vectors.shape[1]
    assert width < before.shape[1]  # the tiny vocabulary's rank: the other columns are zero
    centred = torch.from_numpy(vectors[counted] - vectors[counted].mean(0))
    new = after[ids]
    torch.testing.assert_close(new[:, :width], centred / centred.norm(dim=1, keepdim=True) * new.norm(dim=1, keepdim=True))
    torch.testing.assert_close(new.norm(dim=1), before.norm(dim=1).mean().expand(len(ids)))
    assert not new[:, width:].any()
    kept = torch.ones(before.shape[0], dtype=torch.bool)
    kept[ids] = False
    assert after[kept].equal(before[kept])  # the specials and the ids never seen stay random


def tiny_pretrain(corpus, out, **options):
    return sesame.pretrain([str(corpus)], str(out), **{"size": "tiny", "vocab_size": 120, "seq_len": 32,
                                                       "batch_size": 4, "max_steps": 1, "progress": False, **options})


def test_bert_roberta_and_albert_start_from_the_counts_and_other_starts_keep_theirs(tiny_run, tmp_path, capsys):
    """BERT's, RoBERTa's and ALBERT's default (the 15-minute ablations', docs/results/time_to_quality.md), at the
    counted start's peak rate (sesame.specs.COUNTED_TRAINING, the 60-minute runs') and its table drawn at 0.1 (the
    family's ``counted_embedding_std``; --model-option embedding_std wins); every other family's random start at
    pre-training's rate and scale; a continued run's embeddings are its base's; a run records its start and a resume
    refuses another."""
    corpus = tiny_run / "corpus.txt"
    tiny_pretrain(corpus, tmp_path / "bert", objective="mlm")
    tiny_pretrain(corpus, tmp_path / "roberta", family="roberta", vocab_size=300)  # (byte-level: 256 to start)
    tiny_pretrain(corpus, tmp_path / "albert", family="albert")
    for name in ("bert", "roberta", "albert"):
        config = read_config(tmp_path / name, "--out")
        assert config.pretrained.embedding_init == "ppmi"
        assert config.train["lr"] == COUNTED_TRAINING["lr"] == 3e-4
        assert config.model.embedding_std == 0.1
    tiny_pretrain(corpus, tmp_path / "given", objective="mlm", model_options={"embedding_std": 0.05})
    assert read_config(tmp_path / "given", "--out").model.embedding_std == 0.05
    assert "sesame: token embeddings from the corpus's PPMI-SVD" in capsys.readouterr().err
    for name, options in (("gpt", {"family": "gpt"}), ("random", {"embedding_init": "random"}),
                          ("continued", {"base": str(tmp_path / "bert"), "objective": "mlm"})):
        tiny_pretrain(corpus, tmp_path / name, **options)
        assert "embedding_init" not in json.loads((tmp_path / name / "config.json").read_text())  # as runs before
        assert read_config(tmp_path / name, "--out").pretrained.embedding_init == "random"
        assert read_config(tmp_path / name, "--out").train["lr"] == PRETRAIN_TRAINING["lr"] == 1e-3
        assert read_config(tmp_path / name, "--out").model.embedding_std == (0.1 if name == "continued" else 0.02)
        assert "PPMI" not in capsys.readouterr().err
    refused(["pretrain", "--resume", "--corpus", str(corpus), "--out", str(tmp_path / "random"), "--embedding-init",
             "ppmi"], capsys, tmp_path, "--embedding-init ppmi", "was made with random")


def test_the_counted_rate_yields_to_lr_and_to_a_run_made_before_it(tiny_run, tmp_path):
    """`--lr` wins over the counted start's rate, and a counted run made at 1e-3 (as every run before the counted
    rate was) resumes at the rate it recorded, not at today's default."""
    corpus = tiny_run / "corpus.txt"
    tiny_pretrain(corpus, tmp_path / "run", objective="mlm", lr=1e-3)
    assert read_config(tmp_path / "run", "--out").train["lr"] == 1e-3
    tiny_pretrain(corpus, tmp_path / "run", objective="mlm", max_steps=2, resume=True)
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["config"]["lr"] == 1e-3


def test_what_the_start_cannot_do_is_refused_in_one_line(tiny_run, tmp_path, capsys):
    corpus = ["pretrain", "--corpus", str(tiny_run / "corpus.txt"), "--out", str(tmp_path / "run"), "--embedding-init",
              "ppmi"]
    refused([*corpus, "--family", "elmo"], capsys, tmp_path, "--embedding-init ppmi: elmo spells its tokens from "
            "characters")
    refused([*corpus, "--from", str(tiny_run / "run")], capsys, tmp_path, "--embedding-init ppmi: --from",
            "brings its own embeddings")
    refused([*corpus[:-2], "--family", "elmo", "--embedding-rate", "0"], capsys, tmp_path, "--embedding-rate 0: elmo "
            "spells its tokens from characters")
    refused([*corpus[:-2], "--embedding-rate", "-1"], capsys, tmp_path, "--embedding-rate -1.0: must be at least 0")


TABLE = "backbone.embed.tokens.weight"


def test_a_table_at_rate_0_stays_as_it_started_while_the_layers_learn_and_a_resume_keeps_it(tiny_run, tmp_path):
    corpus, run = tiny_run / "corpus.txt", tmp_path / "frozen"
    tiny_pretrain(corpus, run, objective="mlm", embedding_rate=0.0, max_steps=2)
    assert json.loads((run / "config.json").read_text())["embedding_rate"] == 0.0
    config, tok = read_config(run, "--out"), load_tokenizer(run)
    torch.manual_seed(0)  # the run's first weights: its seed's random draws, then the counts
    backbone = build_backbone(config)
    ppmi_embedding(backbone, Shards(config.pretrained.shards), skip=tok.specials.all, seed=0, progress=False)
    at_2 = load_weights(run / "model.safetensors")
    assert at_2[TABLE].equal(backbone.embed.tokens.weight.detach())
    sesame.pretrain([str(corpus)], str(run), resume=True, max_steps=4, progress=False)
    at_4 = load_weights(run / "model.safetensors")
    assert at_4[TABLE].equal(at_2[TABLE])
    moved = [name for name in at_2 if name != TABLE and not at_4[name].equal(at_2[name])]
    assert len(moved) > len(at_2) // 2  # the layers (and the output bias) trained on


def test_a_share_of_the_rate_moves_the_table_to_a_group_of_its_own_at_that_share():
    table, weight, bias = (torch.nn.Parameter(torch.zeros(shape)) for shape in ((8, 4), (4, 4), (4,)))
    groups = [{"params": [table, weight], "lr": 1e-3, "base_lr": 1e-3, "weight_decay": 0.01},
              {"params": [bias], "lr": 1e-3, "base_lr": 1e-3, "weight_decay": 0.0}]
    shared = table_share(groups, table, 0.25)
    assert [g["params"] for g in shared] == [[weight], [bias], [table]]  # the peak's group stays first
    assert (shared[-1]["lr"], shared[-1]["base_lr"], shared[-1]["weight_decay"]) == (2.5e-4, 2.5e-4, 0.01)
    assert shared[0] == {**groups[0], "params": [weight]} and shared[1] == groups[1]


def test_a_run_records_its_table_rate_and_a_resume_refuses_another(tiny_run, tmp_path, capsys):
    corpus = tiny_run / "corpus.txt"
    tiny_pretrain(corpus, tmp_path / "half", objective="mlm", embedding_rate=0.5)
    assert read_config(tmp_path / "half", "--out").pretrained.embedding_rate == 0.5
    tiny_pretrain(corpus, tmp_path / "one", objective="mlm")
    assert "embedding_rate" not in json.loads((tmp_path / "one" / "config.json").read_text())  # as runs before
    refused(["pretrain", "--resume", "--corpus", str(corpus), "--out", str(tmp_path / "half"), "--embedding-rate",
             "1"], capsys, tmp_path, "--embedding-rate 1", "was made with 0.5")


def test_an_untied_decoder_starts_as_the_counted_table_and_leaves_it_the_inputs_gradients_alone(tiny_run, tmp_path):
    """The decoder is copied after the counts are (one step at a rate of 1e-9 leaves both where they started); then
    a table no longer read at the output gets no gradient for the ids the batch's inputs do not hold, where the tied
    table gets one for every id (the softmax's)."""
    corpus, run = tiny_run / "corpus.txt", tmp_path / "untied"
    tiny_pretrain(corpus, run, objective="mlm", objective_options={"decoder": "untied"}, lr=1e-9)
    weights = load_weights(run / "model.safetensors")
    torch.testing.assert_close(weights["decoder"], weights[TABLE])
    config, tok = read_config(run, "--out"), load_tokenizer(run)
    assert config.pretrained.objective_options == {"decoder": "untied"}
    shards = Shards(config.pretrained.shards)
    windows = torch.as_tensor(np.asarray(shards.arrays[0][:60], dtype=np.int64)).reshape(2, 30)
    grads = {}
    for decoder in ("untied", "tied"):
        obj = build_objective("mlm", build_backbone(config), tok, {"decoder": decoder})
        obj.load_state_dict({k: v for k, v in weights.items() if decoder == "untied" or k != "decoder"})
        batch = obj.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(2)])
        obj(batch).backward()
        unseen = ~torch.isin(torch.arange(tok.vocab_size), batch["ids"])
        grads[decoder] = obj.backbone.embed.tokens.weight.grad[unseen]
        if decoder == "untied":
            assert obj.decoder.grad[unseen].abs().sum() > 0
    assert unseen.any() and not grads["untied"].any() and grads["tied"].abs().sum() > 0


def test_a_tied_run_continues_untied_from_its_table_and_an_untied_run_only_untied(tiny_run, tmp_path, capsys):
    corpus, tied = tiny_run / "corpus.txt", tiny_run / "run"
    tiny_pretrain(corpus, tmp_path / "untied", base=str(tied), objective="mlm", objective_options={"decoder": "untied"},
                  lr=1e-9)
    weights = load_weights(tmp_path / "untied" / "model.safetensors")
    torch.testing.assert_close(weights["decoder"], load_weights(tied / "model.safetensors")[TABLE])
    base = ["pretrain", "--corpus", str(corpus), "--objective", "mlm", "--max-steps", "1"]
    refused([*base, "--from", str(tmp_path / "untied"), "--out", str(tmp_path / "again")], capsys, tmp_path,
            f"--from {tmp_path / 'untied'}: its masked LM's decoder is untied", "--objective-option decoder=untied")
    refused([*base, "--objective-option", "decoder=loose", "--out", str(tmp_path / "loose")], capsys, tmp_path,
            "--objective-option decoder=loose: the mlm objective's decoder is one of tied, untied")
    refused([*base, "--objective-option", "masking=span", "--out", str(tmp_path / "span")], capsys, tmp_path,
            "--objective-option masking=span: the mlm objective's masking is one of token, whole_word, phrase")
