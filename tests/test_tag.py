"""Token classification: the CoNLL reader, word ↔ subword alignment, the first-subword loss,
conlleval's entity F1 on hand-computed cases, the written predictions, and the real CoNLL-2003 file."""
import random

import pytest
import torch
import torch.nn.functional as F

from sesame.errors import SesameError
from sesame.models import Transformer, TransformerConfig
from sesame.tasks import make_task
from sesame.tasks.tag import IGNORE, conll_report
from sesame.tokenizer import train_tokenizer

from .conftest import sentences, shared_data

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_reader_skips_document_lines_and_picks_columns(tmp_path):
    path = write(tmp_path, "train.txt", CONLL)
    rows = make_task("tag").read(path)
    assert [r["words"] for r in rows] == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"],
                                          ["BRUSSELS"]]
    assert [r["tags"] for r in rows] == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"], ["B-LOC"]]
    assert [r["line"] for r in rows] == [3, 9, 14] and rows[1]["text"] == "Peter Blackburn"
    pos = make_task("tag", {"label_column": "1"})  # as --label-column 1 arrives from the command line
    assert pos.read(path)[0]["tags"] == ["NNP", "VBZ", "JJ", "NN", "."]
    assert make_task("tag").labels(rows, path) == ["B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER", "O"]
    assert "tags" not in make_task("tag").read(path, labeled=False)[0]
    with pytest.raises(SesameError, match="--label-column 'ner': --task tag takes a column number"):
        make_task("tag", {"label_column": "ner"})


def test_reader_errors_name_file_and_line(tmp_path):
    path = write(tmp_path, "bad.txt", CONLL.replace("call NN I-NP O", "call NN O"))
    with pytest.raises(SesameError, match=r"bad.txt:6: 3 columns, but the file's first line has 4"):
        make_task("tag").read(path)
    with pytest.raises(SesameError, match=r"bad.txt:1: --label-column 4, but the line has 4 columns"):
        make_task("tag", {"label_column": 4}).read(write(tmp_path, "bad.txt", CONLL))
    words_only = write(tmp_path, "words.txt", "EU\nrejects\n\nPeter\n")
    with pytest.raises(SesameError, match=r"words.txt:1: a word without a tag; a labeled tagging file is a CoNLL") as err:
        make_task("tag").read(words_only)  # not the --label-column -1 the user never gave
    assert "--label-column" not in str(err.value)
    with pytest.raises(SesameError, match=r"train.txt:1: token_column 0 and --label-column 0 are the same column"):
        make_task("tag", {"label_column": "0"}).read(write(tmp_path, "train.txt", CONLL))
    assert [r["words"] for r in make_task("tag").read(words_only, labeled=False)] == [["EU", "rejects"], ["Peter"]]
    task = make_task("tag")
    train = task.read(write(tmp_path, "train.txt", CONLL))
    dev_path = write(tmp_path, "dev.txt", "Peter NNP B-NP B-PER\nlives VBZ B-VP O\nin IN B-PP O\nRome NNP B-NP B-GPE\n")
    with pytest.raises(SesameError, match=r"dev.txt:4: tag 'B-GPE' never occurs in the training data"):
        task.check(task.read(dev_path), task.labels(train, "train.txt"), dev_path)


def words_of(text: str) -> list[str]:
    return text.rstrip(".").split() + ["."]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_words_and_subwords_round_trip(kind):
    """Each word's subwords (from its first one up to the next word's) decode back to the word, and the
    words are split exactly as the running text would be (byte-level BPE keeps its leading spaces)."""
    tok = train_tokenizer(sentences(200), kind, 120)  # small: most words split into several pieces
    task = make_task("tag")
    examples = [{"words": words_of(s)} for s in sentences(20, seed=5)]
    features = task.features(examples, tok, 512, [], causal=False)  # long enough to cut nothing off
    several = 0
    for example, feature in zip(examples, features):
        ids, first = feature["ids"], feature["first"]
        assert ids == tok.encode([" ".join(example["words"])])[0]
        assert ids[0] == tok.specials.cls and ids[-1] == tok.specials.sep
        ends = first[1:] + [len(ids) - 1]
        for word, start, end in zip(example["words"], first, ends):
            expected = word.lower() if kind == "wordpiece" else word  # uncased BERT normalisation
            assert tok.decode(ids[start:end]).strip() == expected
            several += end - start > 1
    assert several > 20


def tiny_model(vocab_size: int, n_labels: int, task, seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab_size, hidden=16, layers=1, heads=2, intermediate=32, max_positions=64,
                            dropout=0.0)
    return task.build(Transformer(cfg), n_labels, "cls", 0.0)


ANIMALS = {"cat", "dog", "bird", "fish"}


def animal_examples(n: int, seed: int) -> list[dict]:
    """Animals tagged B-ANI, everything else O."""
    rows = []
    for s in sentences(n, seed):
        words = words_of(s)
        rows.append({"words": words, "tags": ["B-ANI" if w.lower() in ANIMALS else "O" for w in words], "line": 1})
    return rows


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(200), "wordpiece", 120)


def test_loss_reads_each_words_first_subword_only(tok):
    task = make_task("tag")
    labels = ["B-ANI", "O"]
    examples = animal_examples(8, seed=3)
    features = task.features(examples, tok, 64, labels, causal=False)
    batch = task.collate(features, tok.specials.pad)
    targets = batch["targets"]
    labeled = targets != IGNORE
    for i, feature in enumerate(features):  # a target at each word's first subword and nowhere else
        assert labeled[i].nonzero().flatten().tolist() == feature["first"]
        assert [labels[t] for t in targets[i, feature["first"]].tolist()] == examples[i]["tags"]
    n_words = sum(len(e["words"]) for e in examples)
    assert batch["counts"] == {"loss": n_words} and n_words < int(batch["padding"].sum()) - 2 * len(examples)
    model = tiny_model(tok.vocab_size, len(labels), task).eval()
    torch.nn.init.normal_(model.head.weight)
    logits = model.outputs(batch)
    expected = F.cross_entropy(logits[labeled], targets[labeled], reduction="sum")
    assert model(batch).item() == pytest.approx(expected.item(), rel=1e-5)
    # a label at a continuation subword would change the loss (by its cross-entropy there); the task
    # never puts one there
    row, position = (batch["padding"] & ~labeled).nonzero()[1].tolist()  # [0] is a [CLS], [1] a subword
    unlikely = int(logits[row, position].argmin())
    moved = {**batch, "targets": targets.clone()}
    moved["targets"][row, position] = unlikely
    extra = F.cross_entropy(logits[row, position], torch.tensor(unlikely)).item()
    assert extra > 0.5 and model(moved).item() == pytest.approx(expected.item() + extra, rel=1e-5)


def test_a_tagger_learns_to_tag_from_first_subwords(tok, one_thread):
    task = make_task("tag")
    labels = ["B-ANI", "O"]
    train, dev = animal_examples(64, seed=1), animal_examples(16, seed=2)
    model = tiny_model(tok.vocab_size, len(labels), task)
    batch = task.collate(task.features(train, tok, 64, labels, causal=False), tok.specials.pad)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        optimizer.zero_grad()
        (model(batch) / batch["counts"]["loss"]).backward()
        optimizer.step()
    dev_features = task.features(dev, tok, 64, labels, causal=False)
    model.eval()
    outputs = model.outputs(task.collate(dev_features, tok.specials.pad))
    report = task.score(dev, dev_features, outputs, labels)
    assert report["f1"] > 0.9 and report["entities"] == sum(t.count("B-ANI") for t in (e["tags"] for e in dev))


def perfect_outputs(features: list[dict], n_labels: int) -> torch.Tensor:
    """Outputs that score each target position's gold label highest, built from the targets alone."""
    width = max(len(f["ids"]) for f in features)
    outputs = torch.zeros(len(features), width, n_labels)
    for i, f in enumerate(features):
        for position, target in enumerate(f["targets"]):
            if target != IGNORE:
                outputs[i, position, target] = 1.0
    return outputs


def test_words_the_window_cuts_off_are_predicted_outside_and_still_scored(tok):
    task = make_task("tag")
    labels = ["B-ANI", "O"]
    words = ["the", "cat", "sleeps", "near", "the", "old", "dog", "."]
    example = {"words": words, "tags": ["O", "B-ANI", "O", "O", "O", "O", "B-ANI", "O"], "line": 1}
    features = task.features([example], tok, 6, labels, causal=False)
    assert len(features[0]["ids"]) == 6 and features[0]["first"][-1] == -1
    outputs = perfect_outputs(features, len(labels))
    tags = task.predictions([example], features, outputs, labels)[0]["tags"]
    assert tags[:2] == ["O", "B-ANI"] and tags[-2:] == ["O", "O"]  # "dog" lies past the window
    report = task.score([example], features, outputs, labels)
    assert report["recall"] == 0.5 and report["precision"] == 1.0 and report["accuracy"] == 7 / 8
    vanishing = {"words": ["cat", "\u200b", "dog"], "tags": ["B-ANI", "B-ANI", "B-ANI"], "line": 1}
    features = task.features([vanishing], tok, 64, labels, causal=False)  # BERT's normaliser drops \u200b
    assert features[0]["first"][1] == -1
    assert task.predictions([vanishing], features, perfect_outputs(features, 2), labels)[0]["tags"][1] == "O"


@pytest.mark.parametrize("gold, predicted, expected", [
    # one of two entities right (its type differs in the other): P = R = F1 = 1/2; 3 of 4 tags right
    ([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]], (1, 2, 2, 3 / 4)),
    # an I- after O starts an entity, so I-PER I-PER is the same entity as B-PER I-PER (tags differ)
    ([["O", "I-PER", "I-PER", "O"]], [["O", "B-PER", "I-PER", "O"]], (1, 1, 1, 3 / 4)),
    # a change of type inside a run of I- tags starts a new entity: gold has two, the prediction one
    ([["I-PER", "I-LOC", "O"]], [["B-PER", "I-PER", "O"]], (0, 2, 1, 1 / 3)),
    # IOB1 (B- only between adjacent entities of one type) read against the same entities in IOB2
    ([["I-LOC", "B-LOC", "I-LOC", "O"]], [["B-LOC", "B-LOC", "I-LOC", "O"]], (2, 2, 2, 3 / 4)),
    # an entity at a sentence's end closes there: the next sentence's I-PER is another entity
    ([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["O", "O"]], (1, 2, 1, 3 / 4)),
    # a predicted entity one word too long, or ending in another type, is wrong
    ([["B-PER", "O"], ["B-PER", "I-PER"]], [["B-PER", "I-PER"], ["B-PER", "I-LOC"]], (0, 2, 3, 2 / 4)),
    # tags without a type (one kind of chunk): I after O starts a chunk, B then O ends one
    ([["O", "I"], ["B", "O"]], [["O", "B"], ["B", "B"]], (2, 2, 3, 2 / 4)),
    # nothing predicted: precision and F1 are 0, not undefined
    ([["B-MISC", "O"]], [["O", "O"]], (0, 1, 0, 1 / 2)),
])
def test_conlleval_counts_by_hand(gold, predicted, expected):
    correct, n_gold, n_predicted, accuracy = expected
    report = conll_report(gold, predicted)
    assert (report["correct_entities"], report["entities"], report["predicted_entities"]) == (correct, n_gold,
                                                                                              n_predicted)
    precision = correct / n_predicted if n_predicted else 0.0
    recall = correct / n_gold
    assert report["precision"] == pytest.approx(precision) and report["recall"] == pytest.approx(recall)
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    assert report["f1"] == pytest.approx(f1) and report["accuracy"] == pytest.approx(accuracy)


def test_conlleval_per_type():
    report = conll_report([["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]], [["B-PER", "I-PER", "O", "B-LOC", "B-ORG"]])
    assert report["per_type"]["PER"]["f1"] == 1.0 and report["per_type"]["LOC"]["recall"] == 0.5
    assert report["per_type"]["LOC"]["precision"] == 1.0 and report["per_type"]["ORG"]["precision"] == 0.0
    assert report["per_type"]["LOC"]["support"] == 2 and report["per_type"]["ORG"]["support"] == 0


def reference_entities(sentences_: list[list[str]]) -> set[tuple[int, int, int, str]]:
    """(sentence, start, end, type) of every entity, by the definition for IOB1 and IOB2 alike: a maximal
    run of one type's B-/I- tags, a new entity starting at each B-."""
    entities = set()
    for s, tags in enumerate(sentences_):
        start, kind = None, None
        for j, tag in enumerate(tags + ["O"]):
            prefix, _, t = tag.partition("-")
            if start is not None and (prefix != "I" or t != kind):
                entities.add((s, start, j, kind))
                start = None
            if prefix in ("B", "I") and start is None:
                start, kind = j, t
    return entities


def test_conlleval_matches_exact_entity_matching_on_random_tags():
    rng = random.Random(0)
    tags = ["O", "O", "B-A", "I-A", "B-B", "I-B"]
    for _ in range(200):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 8))] for _ in range(3)]
        pred = [[rng.choice(tags) for _ in sentence] for sentence in gold]
        g, p = reference_entities(gold), reference_entities(pred)
        report = conll_report(gold, pred)
        assert (report["correct_entities"], report["entities"], report["predicted_entities"]) == (len(g & p), len(g),
                                                                                                  len(p))


def test_write_gives_the_columns_conlleval_reads(tmp_path):
    task = make_task("tag")
    examples = [{"words": ["EU", "rejects"], "tags": ["B-ORG", "O"], "line": 1},
                {"words": ["Peter"], "tags": ["B-PER"], "line": 4}]
    predictions = [{"words": ["EU", "rejects"], "tags": ["B-LOC", "O"]}, {"words": ["Peter"], "tags": ["B-PER"]}]
    path = tmp_path / "out.txt"
    task.write(examples, predictions, path)
    assert path.read_text() == "EU B-ORG B-LOC\nrejects O O\n\nPeter B-PER B-PER\n\n"
    assert [r["tags"] for r in make_task("tag", {"label_column": 1}).read(str(path))] == [["B-ORG", "O"], ["B-PER"]]
    task.write([{k: v for k, v in e.items() if k != "tags"} for e in examples], predictions, path)
    assert path.read_text() == "EU B-LOC\nrejects O\n\nPeter B-PER\n\n"
    assert task.example("Peter  lives in\tRome ")["words"] == ["Peter", "lives", "in", "Rome"]


@pytest.mark.slow
def test_real_conll2003_valid_reads_scores_and_aligns(one_thread):
    root = shared_data() / "conll2003"
    task = make_task("tag")
    dev = task.read(str(root / "valid.txt"))
    # eng.testa: 3,250 sentences, 51,362 tokens, 5,942 entities (1,842 PER, 1,837 LOC, 1,341 ORG, 922 MISC)
    assert len(dev) == 3250 and sum(len(r["words"]) for r in dev) == 51362
    gold = [r["tags"] for r in dev]
    report = conll_report(gold, gold)
    assert report["f1"] == 1.0 and report["accuracy"] == 1.0 and report["entities"] == 5942
    assert {t: c["support"] for t, c in report["per_type"].items()} == {"LOC": 1837, "MISC": 922, "ORG": 1341,
                                                                          "PER": 1842}
    train = task.read(str(root / "train.txt"))
    labels = task.labels(train, "train.txt")
    task.check(dev, labels, "valid.txt")
    tok = train_tokenizer([r["text"] for r in train[::4]], "wordpiece", 2000)
    features = task.features(dev, tok, 512, labels, causal=False)
    assert all(p >= 0 for f in features for p in f["first"])  # nothing cut off at 512 subwords
    assert sum(len(f["ids"]) for f in features) > 1.2 * 51362 + 2 * 3250  # words do split into subwords
    predicted = task.predictions(dev, features, perfect_outputs(features, len(labels)), labels)
    assert [p["tags"] for p in predicted] == gold


def test_entity_f1_and_accuracy_agree_with_seqeval_on_random_iob1_and_iob2_tags():
    """seqeval (its default, conlleval-compatible mode) is the peer scorer of the task comparison with
    transformers: both must count the same entities, including IOB1's I- that opens an entity."""
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-ORG"]
    for _ in range(200):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))]
        predicted = [[t if rng.random() < 0.6 else rng.choice(tags) for t in s] for s in gold]
        report = conll_report(gold, predicted)
        assert report["f1"] == pytest.approx(seqeval.f1_score(gold, predicted), abs=1e-12)
        assert report["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, predicted), abs=1e-12)
