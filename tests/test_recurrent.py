"""The recurrent backbone (sesame/models/recurrent.py): AWD-LSTM's regularisers, causality, padding,
pooling, and the recurrent families through pretrain and finetune."""
import csv

import numpy as np
import pytest
import torch

import sesame
from sesame.cli import main
from sesame.data.shards import Shards
from sesame.families import head_dropouts
from sesame.models import Recurrent, RecurrentConfig, TransformerConfig
from sesame.models.recurrent import embedding_dropout, locked_dropout
from sesame.objectives.clm import AwdLM
from sesame.tasks import TASKS
from sesame.tasks.classify import SequenceModel, pool
from sesame.tokenizer import SpecialIds
from sesame.resume import resumed_finetuning
from sesame.run import load_tokenizer, read_config
from sesame.specs import FinetuneSpec
from sesame.train import recipes


def tiny(**options) -> Recurrent:
    torch.manual_seed(0)
    return Recurrent(RecurrentConfig(**{"vocab_size": 40, "embedding_size": 6, "hidden_size": 8, "layers": 2,
                                        **options}))


def unrolled_lstm(rnn: torch.nn.LSTM, x: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
    """One LSTM layer step by step, with ``w_hh`` as its hidden-to-hidden weights at every step."""
    h = c = x.new_zeros(x.shape[0], rnn.hidden_size)
    out = []
    for t in range(x.shape[1]):
        gates = x[:, t] @ rnn.weight_ih_l0.t() + rnn.bias_ih_l0 + h @ w_hh.t() + rnn.bias_hh_l0
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        out.append(h)
    return torch.stack(out, 1)


def test_dropconnect_mask_is_shared_by_all_time_steps_and_redrawn_per_batch():
    layer = tiny(weight_dropout=0.5).layers[0].train()
    drawn = []
    original = layer.dropped_weights

    def record():
        weights = original()
        drawn.extend(w.detach() for w in weights.values())
        return weights

    layer.dropped_weights = record
    x = torch.randn(3, 9, 6)
    first = layer(x, None)
    # the whole sequence is what one fixed dropped matrix gives at every step
    assert torch.allclose(first, unrolled_lstm(layer.rnn, x, drawn[0]), atol=1e-5)
    zeros = drawn[0] == 0
    assert 0.35 < zeros.float().mean() < 0.65  # p = 0.5 of the weights dropped
    kept = layer.rnn.weight_hh_l0.detach()[~zeros]
    assert torch.allclose(drawn[0][~zeros], kept * 2)  # survivors scaled by 1 / (1 - p)
    layer(x, None)
    assert not torch.equal(drawn[0] == 0, drawn[1] == 0)  # the next batch draws a new mask
    layer.eval()
    assert torch.allclose(layer(x, None), unrolled_lstm(layer.rnn, x, layer.rnn.weight_hh_l0), atol=1e-5)
    assert len(drawn) == 2  # no mask at inference


def test_locked_dropout_shares_its_mask_across_time():
    torch.manual_seed(1)
    out = locked_dropout(torch.ones(4, 12, 10), 0.5, training=True)
    assert torch.equal(out, out[:, :1].expand_as(out))  # every time step has row's mask
    assert set(out.unique().tolist()) == {0.0, 2.0}
    assert not torch.equal(out[0, 0], out[1, 0])  # rows differ
    assert torch.equal(locked_dropout(torch.ones(2, 3, 4), 0.5, training=False), torch.ones(2, 3, 4))


def test_embedding_dropout_drops_whole_words():
    torch.manual_seed(2)
    weight = torch.randn(200, 5)
    dropped = embedding_dropout(weight, 0.3, training=True)
    gone = (dropped == 0).all(1)
    assert 0.15 < gone.float().mean() < 0.45
    assert torch.allclose(dropped[~gone], weight[~gone] / 0.7)
    ids = torch.tensor([[3, 3, 7]])
    model = tiny(embedding_dropout=0.5).train()
    torch.manual_seed(3)
    vectors = torch.nn.functional.embedding(ids, embedding_dropout(model.embed.tokens.weight, 0.5, True))
    assert torch.equal(vectors[0, 0], vectors[0, 1])  # a word is dropped (or kept) wherever it occurs


def test_concat_pooling_ignores_padding():
    torch.manual_seed(4)
    hidden = torch.randn(1, 4, 3)
    real = torch.tensor([[True, True, True, False]])
    padded = hidden.clone()
    padded[0, 3] = 100.0  # garbage at the padded position
    pooled = pool(padded, real, "concat")
    expected = torch.cat([hidden[0, 2], hidden[0, :3].amax(0), hidden[0, :3].mean(0)])
    assert torch.allclose(pooled[0], expected)
    assert torch.allclose(pool(padded, real, "max"), hidden[:, :3].amax(1))


def test_layer_groups_are_embeddings_then_one_per_layer_then_head():
    model = tiny(layers=3)
    head = torch.nn.Linear(8, 2)
    whole = torch.nn.ModuleDict({"backbone": model, "head": head})
    groups = recipes.layer_groups(whole, model)
    assert [len(g) for g in groups] == [1, 4, 4, 4, 2]  # embedding; each LSTM layer's 4 tensors; the head's
    assert groups[0][0] is model.embed.tokens.weight


def rate_of(param_groups: list[dict]) -> dict[int, float]:
    return {id(p): d["lr"] for d in param_groups for p in d["params"]}


def test_a_language_models_tied_embedding_trains_at_the_peak_rate():
    """fastai's awd_lstm_lm_split: each LSTM layer, then the tied encoder/decoder as the LAST group, so ULMFiT's
    target-task LM (§3.2) trains its softmax (and the task's new words) at the peak rate, the top LSTM at lr/2.6."""
    lm = AwdLM(tiny(layers=3, tied=True), SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))
    groups = recipes.layer_groups(lm, lm.backbone)
    assert groups[-1] == [lm.backbone.embed.tokens.weight] and not groups[0]
    rates = rate_of(recipes.discriminative_param_groups(groups, 1e-2, 0.0, 2.6))
    assert rates[id(lm.backbone.embed.tokens.weight)] == 1e-2
    for depth, layer in enumerate(reversed(lm.backbone.layers), 1):
        assert {rates[id(p)] for p in layer.parameters()} == {1e-2 / 2.6 ** depth}
    classifier = SequenceModel(lm.backbone, 2, "concat")  # a head of its own: the embedding stays at the bottom
    rates = rate_of(recipes.discriminative_param_groups(recipes.layer_groups(classifier, lm.backbone), 1e-2, 0.0))
    assert rates[id(lm.backbone.embed.tokens.weight)] == 1e-2 / 2.6 ** 4
    assert {rates[id(p)] for p in classifier.head.parameters()} == {1e-2}


def airline_like(path, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    good, bad = ["great", "lovely", "thanks", "smooth"], ["delayed", "lost", "rude", "awful"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(n):
            positive = bool(torch.randint(2, (1,), generator=g))
            words = [["the", "flight", "was", "ok"][int(i)] for i in torch.randint(4, (5,), generator=g)]
            pick = good if positive else bad
            words.insert(int(torch.randint(5, (1,), generator=g)), pick[int(torch.randint(4, (1,), generator=g))])
            writer.writerow([" ".join(words), "pos" if positive else "neg"])


@pytest.mark.parametrize("family", ["lstm", "bilstm", "gru"])
def test_baselines_learn_a_word_cue_from_scratch(tmp_path, family):
    airline_like(tmp_path / "train.csv", 320, 0)
    airline_like(tmp_path / "dev.csv", 60, 1)
    result = sesame.finetune(f"scratch:{family}:tiny", str(tmp_path / "train.csv"), str(tmp_path / "dev.csv"),
                             str(tmp_path / "run"), epochs=5, progress=False, batch_size=16)
    assert result["accuracy"] > 0.9
    assert sesame.load(tmp_path / "run").predict(["the flight was awful"])[0]["label"] == "neg"


def test_word_vectors_initialise_the_embedding(tmp_path):
    airline_like(tmp_path / "train.csv", 40, 0)
    airline_like(tmp_path / "dev.csv", 20, 1)
    (tmp_path / "vectors.txt").write_text("great 1 2 3\nawful -1 -2 -3\n")
    result = sesame.finetune("scratch:bilstm:tiny", str(tmp_path / "train.csv"), str(tmp_path / "dev.csv"),
                             str(tmp_path / "run"), epochs=1, progress=False, vectors=str(tmp_path / "vectors.txt"),
                             lr=1e-9)
    assert 0 < result["vectors_coverage"] < 0.5
    run = read_config(tmp_path / "run", "--model", ("finetuned",))
    assert run.model.embedding_size == 3
    tok = load_tokenizer(tmp_path / "run")
    weights = sesame.train.checkpoint.load_weights(tmp_path / "run" / "model.safetensors")
    row = weights["backbone.embed.tokens.weight"][tok.backend.token_to_id("awful")]
    assert torch.allclose(row, torch.tensor([-1.0, -2.0, -3.0]), atol=1e-4)  # lr 1e-9: still the vector


def test_vectors_need_a_recurrent_scratch_model(tmp_path):
    airline_like(tmp_path / "train.csv", 20, 0)
    (tmp_path / "vectors.txt").write_text("great 1 2 3\n")
    with pytest.raises(sesame.SesameError, match="--vectors"):
        sesame.finetune("scratch:bert:tiny", str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                        str(tmp_path / "run"), epochs=1, progress=False, vectors=str(tmp_path / "vectors.txt"))
    assert not (tmp_path / "run").exists()


def test_baselines_have_no_pretraining(tmp_path):
    (tmp_path / "c.txt").write_text("a b c\n" * 50)
    with pytest.raises(sesame.SesameError, match="scratch:lstm:SIZE"):
        sesame.pretrain([str(tmp_path / "c.txt")], str(tmp_path / "run"), family="lstm", size="tiny")


def test_continuing_an_lm_adds_the_new_corpus_words_at_the_mean_embedding(tmp_path):
    """ULMFiT's target-task LM fine-tuning (Howard & Ruder 2018, §3.2) on the target vocabulary: words of the
    new corpus seen twice or more join the vocabulary after the old ones, each starting at the mean embedding."""
    (tmp_path / "general.txt").write_text("the cat sat on the mat .\n" * 60)
    (tmp_path / "target.txt").write_text("the plane was late again .\nthe crew was rude .\n" * 30 + "once\n")
    common = dict(family="ulmfit", size="tiny", seq_len=8, batch_size=4, progress=False, eval_every=2, save_every=2)
    sesame.pretrain([str(tmp_path / "general.txt")], str(tmp_path / "lm"), max_steps=2, **common)
    sesame.pretrain([str(tmp_path / "target.txt")], str(tmp_path / "target"), max_steps=1, lr=1e-12,
                    base=str(tmp_path / "lm"), **common)
    old, new = (load_tokenizer(tmp_path / run) for run in ("lm", "target"))
    added = sorted(set(new.backend.get_vocab()) - set(old.backend.get_vocab()))
    assert added == ["again", "crew", "late", "plane", "rude", "was"]  # "once" is seen once: still <unk>
    assert all(new.backend.token_to_id(w) == i for w, i in old.backend.get_vocab().items())  # old ids kept
    config = read_config(tmp_path / "target", "--model", ("pretrained",))
    assert config.pretrained.added_words == 6 and config.model.vocab_size == old.vocab_size + 6
    before, after = (sesame.train.checkpoint.load_weights(tmp_path / run / "model.safetensors")
                     ["backbone.embed.tokens.weight"] for run in ("lm", "target"))
    assert torch.allclose(after[new.backend.token_to_id("plane")], before.mean(0), atol=1e-5)  # lr 1e-12: unmoved


def test_the_command_line_offers_vectors_and_every_pooling(tmp_path, capsys):
    """`sesame finetune --vectors` (docs/recurrent.md) reaches the task model, and --pooling offers every
    pooling the classifier has (its own table, POOLINGS), ULMFiT's concat included."""
    from sesame.cli import _parser
    from sesame.tasks.classify import POOLINGS

    required = ["finetune", "--from", "x", "--train", "t", "--dev", "d", "--out", "o"]
    assert [_parser().parse_args(required + ["--pooling", name]).pooling for name in POOLINGS] == list(POOLINGS)
    airline_like(tmp_path / "train.csv", 40, 0)
    airline_like(tmp_path / "dev.csv", 20, 1)
    (tmp_path / "vectors.txt").write_text("great 1 2 3\nawful -1 -2 -3\n")
    assert main(["--no-progress", "finetune", "--from", "scratch:bilstm:tiny", "--train", str(tmp_path / "train.csv"),
                 "--dev", str(tmp_path / "dev.csv"), "--out", str(tmp_path / "run"), "--epochs", "1",
                 "--vectors", str(tmp_path / "vectors.txt"), "--pooling", "concat", "--batch-size", "8"]) == 0
    run = read_config(tmp_path / "run", "--model", ("finetuned",))
    assert run.model.embedding_size == 3 and run.pooling == "concat" and run.finetuned.recipe.vectors


def test_drop_mult_scales_all_five_awd_lstm_dropouts_and_is_recorded(tmp_path):
    """fastai's drop_mult: one multiplier for AWD-LSTM's output, hidden, input, embedding and weight dropouts,
    relative to the family's row at each stage (no compounding), recorded in config.json's model."""
    row = sesame.families.get_family("ulmfit").model_options
    names = ("dropout", "hidden_dropout", "input_dropout", "embedding_dropout", "weight_dropout")
    (tmp_path / "general.txt").write_text("the cat sat on the mat .\n" * 60)
    airline_like(tmp_path / "train.csv", 20, 0)
    common = dict(batch_size=4, progress=False, max_steps=1)
    sesame.pretrain([str(tmp_path / "general.txt")], str(tmp_path / "lm"), family="ulmfit", size="tiny", seq_len=8,
                    drop_mult=0.5, **common)
    lm = read_config(tmp_path / "lm", "--model", ("pretrained",)).model.to_dict()
    assert {n: lm[n] for n in names} == {n: row[n] * 0.5 for n in names}
    sesame.finetune(str(tmp_path / "lm"), str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                    str(tmp_path / "clf"), epochs=1, dropout=0.4, drop_mult=0.3, **common)
    clf = read_config(tmp_path / "clf", "--model", ("finetuned",)).model.to_dict()
    inside = names[1:]  # the output dropout is the concat head's (fastai's get_text_classifier), applied once
    assert {n: clf[n] for n in inside} == pytest.approx({n: row[n] * 0.3 for n in inside})  # not 0.5 × 0.3
    assert clf["dropout"] == 0.0
    rebuilt = sesame.load(tmp_path / "clf").model.backbone.config  # evaluate and predict rebuild it as trained
    assert rebuilt.weight_dropout == pytest.approx(row["weight_dropout"] * 0.3) and rebuilt.dropout == 0.0
    again = FinetuneSpec.of(str(tmp_path / "lm"), str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                            str(tmp_path / "clf"), dropout=0.4, drop_mult=0.3, resume=True)
    assert resumed_finetuning(again).head_dropout == pytest.approx(0.4 * 0.3)  # --resume keeps the head's, unscaled
    with pytest.raises(sesame.SesameError, match="--drop-mult: scales the five dropouts of a recurrent"):
        sesame.finetune("scratch:bert:tiny", str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                        str(tmp_path / "bert"), epochs=1, drop_mult=0.5, **common)
    assert not (tmp_path / "bert").exists()


def test_a_ulmfit_classifier_reads_a_text_as_its_lm_read_each_document(tmp_path):
    """The LM trains on shards where each document follows </s> and no <s> occurs; its classifier's inputs
    start with that </s> (as LanguageModel.encode starts a prompt), not with <s>, which the LM never saw."""
    (tmp_path / "general.txt").write_text("the cat sat on the mat .\nthe flight was ok .\n" * 30)
    airline_like(tmp_path / "train.csv", 20, 0)
    common = dict(batch_size=4, progress=False, max_steps=1)
    sesame.pretrain([str(tmp_path / "general.txt")], str(tmp_path / "lm"), family="ulmfit", size="tiny", seq_len=8,
                    **common)
    sesame.finetune(str(tmp_path / "lm"), str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                    str(tmp_path / "clf"), epochs=1, **common)
    lm, clf = read_config(tmp_path / "lm", "--model", ("pretrained",)), sesame.load(tmp_path / "clf")
    seen = set(np.concatenate(Shards(lm.pretrained.shards).arrays).tolist())
    tok = clf.tokenizer
    (feature,) = clf.task.features([{"text": "the flight was awful"}], tok, 16, clf.labels, True)
    assert feature["ids"] == [tok.specials.sep] + tok.encode(["the flight was awful"], special=False)[0]
    assert feature["ids"][0] in seen and tok.specials.cls not in seen


@pytest.mark.parametrize("family", ["lstm", "bilstm"])
def test_a_recurrent_baselines_output_dropout_is_applied_once_by_the_head(family, tmp_path):
    """Under last or max pooling the head's dropout before its linear layer is the encoder's output dropout: the
    backbone's locked dropout after its last layer is 0, not the same rate applied a second time."""
    airline_like(tmp_path / "train.csv", 20, 0)
    sesame.finetune(f"scratch:{family}:tiny", str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                    str(tmp_path / "clf"), epochs=1, dropout=0.3, batch_size=4, progress=False, max_steps=1)
    assert read_config(tmp_path / "clf", "--model", ("finetuned",)).model.dropout == 0.0
    again = FinetuneSpec.of(f"scratch:{family}:tiny", str(tmp_path / "train.csv"), str(tmp_path / "train.csv"),
                            str(tmp_path / "clf"), dropout=0.3, resume=True)
    assert resumed_finetuning(again).head_dropout == 0.3  # the head's SequenceModel dropout


def test_a_head_without_dropout_of_its_own_leaves_the_encoders():
    recurrent = RecurrentConfig(vocab_size=8, dropout=0.3)
    assert not TASKS["span_qa"].head_drops and head_dropouts(recurrent, head_drops=False) == {}
    assert head_dropouts(recurrent, head_drops=True) == {"dropout": 0.0}
    assert head_dropouts(TransformerConfig(vocab_size=8, dropout=0.1), head_drops=True) == {}
