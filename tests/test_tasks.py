"""Sequence-level tasks: metrics on hand-computed cases, readers, pair encoding, GPT's symmetric pairs, regression."""
import pytest
import torch

from sesame.data.labeled import read_fields
from sesame.errors import SesameError
from sesame.metrics import classification_report, regression_report
from sesame.models import Transformer, TransformerConfig
from sesame.tasks import make_task
from sesame.tokenizer import train_tokenizer

from .conftest import sentences


def test_binary_f1_and_matthews_correlation_by_hand():
    # positive class "1": tp 2, fp 1, fn 1, tn 1 → P = R = F1 = 2/3; MCC = (2·1 − 1·1) / √(3·3·2·2) = 1/6
    report = classification_report([0, 0, 1, 1, 1], [0, 1, 1, 1, 0], ["0", "1"])
    assert report["f1"] == pytest.approx(2 / 3) and report["mcc"] == pytest.approx(1 / 6)
    assert report["accuracy"] == pytest.approx(3 / 5)


def test_multiclass_matthews_correlation_by_hand():
    # Gorodkin's form: (c·s − Σ p_k t_k) / √((s² − Σ p_k²)(s² − Σ t_k²)) with c = 3 correct of s = 4,
    # true counts t = (2, 1, 1), predicted counts p = (2, 2, 0): (12 − 6) / √(8 · 10)
    report = classification_report([0, 1, 2, 0], [0, 1, 1, 0], ["a", "b", "c"])
    assert report["mcc"] == pytest.approx(6 / 80 ** 0.5) and "f1" not in report


def test_correlations_by_hand():
    # predictions 2·(1, 3, 2, 4): ranks differ from the gold ranks by d = (0, 1, −1, 0) → ρ = 1 − 6·2/(4·15) = 0.8;
    # the values are a scaled copy of those ranks, so Pearson's r is 0.8 as well
    report = regression_report([1, 2, 3, 4], [2, 6, 4, 8])
    assert report["pearson"] == pytest.approx(0.8) and report["spearman"] == pytest.approx(0.8)
    assert report["mse"] == pytest.approx((1 + 16 + 1 + 16) / 4)
    monotone = regression_report([1, 2, 3, 4], [1, 2, 3, 100])
    assert monotone["spearman"] == pytest.approx(1.0) and monotone["pearson"] < 0.9
    assert regression_report([1, 2, 3], [5, 5, 5])["pearson"] == 0.0  # constant predictions: no correlation


def test_numbered_columns_read_files_without_a_header(tmp_path):
    """GLUE ships CoLA as TSV without a header: source, label, original label, sentence."""
    path = tmp_path / "cola.tsv"
    path.write_text("gj04\t1\t\tOne more pseudo generalization.\ngj04\t0\t*\tThe more we study verbs.\n")
    rows = read_fields(path, {"text": ("3", "--text-column"), "label": ("1", "--label-column")})
    assert rows == [{"line": 1, "text": "One more pseudo generalization.", "label": "1"},
                    {"line": 2, "text": "The more we study verbs.", "label": "0"}]
    path.write_text("gj04\t1\t\tOne.\ngj04\t\t*\tTwo.\n")
    with pytest.raises(SesameError, match=r"cola.tsv:2: empty '1' \(--label-column\)"):
        read_fields(path, {"text": ("3", "--text-column"), "label": ("1", "--label-column")})


def test_task_options_are_checked_by_name():
    with pytest.raises(SesameError, match="doc_stride: not an option of --task classify"):
        make_task("classify", {"doc_stride": 128})
    with pytest.raises(SesameError, match="--symmetric: scores both orders"):
        make_task("classify", {"symmetric": True})


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(200), "wordpiece", 120)


def pair_examples(n: int = 6) -> list[dict]:
    return [{"text": a, "pair": b, "label": "yes" if i % 2 else "no", "line": i + 2}
            for i, (a, b) in enumerate(zip(sentences(n, 1), sentences(n, 2)))]


def test_encoders_read_a_pair_as_two_segments_and_decoders_without_segments(tok):
    task = make_task("pair")
    examples = pair_examples()
    encoder = task.features(examples, tok, 64, ["no", "yes"], causal=False)[0]
    ids, types = encoder["ids"], encoder["types"]
    sep = tok.specials.sep
    first_sep = ids.index(sep)
    assert ids[0] == tok.specials.cls and ids[-1] == sep and ids.count(sep) == 2
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert ids[1:first_sep] == tok.encode([examples[0]["text"]], special=False)[0]
    decoder = task.features(examples, tok, 64, ["no", "yes"], causal=True)[0]
    assert decoder["ids"] == ids and "types" not in decoder  # GPT: the separator is the delimiter, no segments
    batch = task.collate(task.features(examples, tok, 64, ["no", "yes"], causal=False), tok.specials.pad)
    assert batch["types"].shape == batch["ids"].shape and batch["targets"].tolist() == [0, 1, 0, 1, 0, 1]


def test_symmetric_pairs_score_the_same_in_either_order(tok):
    """GPT (Radford et al. 2018, §3.3): both orders encoded, pooled representations added."""
    torch.manual_seed(0)
    task = make_task("pair", {"symmetric": True})
    cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden=16, layers=1, heads=2, intermediate=32,
                            max_positions=64, dropout=0.0)
    model = task.build(Transformer(cfg), 2, "mean", 0.0).eval()
    torch.nn.init.normal_(model.head.weight)  # large enough that a change of order shows
    examples = pair_examples()
    swapped = [{**e, "text": e["pair"], "pair": e["text"]} for e in examples]
    scores = [model.outputs(task.collate(task.features(x, tok, 64, ["no", "yes"], causal=False), tok.specials.pad))
              for x in (examples, swapped)]
    assert torch.allclose(scores[0], scores[1], atol=1e-5)
    plain = make_task("pair")
    one_order = [model.outputs(plain.collate(plain.features(x, tok, 64, ["no", "yes"], causal=False),
                                             tok.specials.pad)) for x in (examples, swapped)]
    assert not torch.allclose(one_order[0], one_order[1], atol=1e-2)


def test_regression_reads_numbers_and_fits_them(tok, tmp_path):
    path = tmp_path / "sts.tsv"
    pairs = list(zip(sentences(20, 3), sentences(20, 4)))
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(  # the score: whether the first text has a cat
        f"{a}\t{b}\t{4.5 if 'cat' in a.lower().split() else 0.5}\n" for a, b in pairs))
    task = make_task("regress", {"text_column": "sentence1", "pair_column": "sentence2", "label_column": "score"})
    examples = task.read(str(path))
    gold = [e["label"] for e in examples]
    assert set(gold) == {0.5, 4.5} and task.labels(examples, str(path)) == []
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden=16, layers=1, heads=2, intermediate=32,
                            max_positions=64, dropout=0.0)
    model = task.build(Transformer(cfg), 0, "mean", 0.0)
    batch = task.collate(task.features(examples, tok, 64, [], causal=False), tok.specials.pad)
    assert batch["targets"].dtype == torch.float32
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(100):
        optimizer.zero_grad()
        loss = model(batch) / len(examples)
        loss.backward()
        optimizer.step()
    variance = torch.tensor(gold).var(unbiased=False).item()
    assert loss.item() < 0.25 * variance  # better than predicting the mean: the head reads the texts
    path.write_text("sentence1\tsentence2\tscore\nA.\tB.\thigh\n")
    with pytest.raises(SesameError, match=r"sts.tsv:2: 'score' is 'high', not a finite number"):
        task.read(str(path))


def test_shuffled_batching_cuts_the_shuffle_and_bucketed_batching_groups_lengths():
    """--batching shuffled keeps each batch as the random permutation drew it (its label mix does not follow
    length); bucketed sorts inside windows, so a batch's lengths are neighbours."""
    from sesame.tasks import BATCHINGS, bucketed_batches

    lengths = list(range(400))  # an example's length is its index
    draw = torch.randperm(400, generator=torch.Generator().manual_seed(3)).tolist()
    shuffled = bucketed_batches(lengths, 8, torch.Generator().manual_seed(3), window=BATCHINGS["shuffled"])
    assert sorted(map(sorted, shuffled)) == sorted(sorted(draw[i: i + 8]) for i in range(0, 400, 8))
    bucketed = bucketed_batches(lengths, 8, torch.Generator().manual_seed(3), window=BATCHINGS["bucketed"])
    spread = lambda batches: sum(max(b) - min(b) for b in batches) / len(batches)  # noqa: E731
    assert sorted(i for b in bucketed for i in b) == lengths
    assert spread(bucketed) < spread(shuffled) / 10
