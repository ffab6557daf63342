"""XLNet fine-tuned on classify/regress (single texts), tag, span_qa and multiple_choice: its input template
(``a <sep> <cls>``, the class token last, segment 2), each head's defining property on a tiny model, and each task end
to end from a tiny pretrained run."""
import json
import random

import pytest
import torch

from sesame.cli import main
from sesame.families import FAMILIES
from sesame.models import XLNet, XLNetConfig
from sesame.tasks import make_task
from sesame.tasks.multiple_choice import XLNetChoiceModel
from sesame.tasks.span_qa import context_windows
from sesame.tasks.words import IGNORE
from sesame.tokenizer import put_cls_last, train_tokenizer

from .conftest import WORDS, documents, sentences

pytestmark = pytest.mark.usefixtures("one_thread")
ANIMALS = {"cat", "dog", "bird", "fish"}


@pytest.fixture(scope="module")
def tok():
    tok = train_tokenizer(sentences(300) + ["Where is the cat?"], "unigram", 150)
    put_cls_last(tok)
    return tok


def backbone(tok, seed: int = 0) -> XLNet:
    torch.manual_seed(seed)
    net = XLNet(XLNetConfig(vocab_size=tok.vocab_size, hidden=16, layers=2, heads=2, intermediate=32, dropout=0.0))
    with torch.no_grad():
        net.embed.tokens.weight.normal_()  # N(0, 1) tokens and segment vectors, so each input shows in the states
        for attention in net.attention:
            attention.seg_embed.normal_()
            attention.r_s_bias.normal_()
    return net


def visible(model):
    """``model`` in evaluation with N(0, 1) head weights (0.02 at initialisation), so what reaches them shows."""
    with torch.no_grad():
        for layer in (model.head, *getattr(model, "pooler", ())):
            if isinstance(layer, torch.nn.Linear):
                layer.weight.normal_()
    return model.eval()


def conll(rows: list[str]) -> str:
    """Sentences as CoNLL columns ``word tag``: ANIMAL for an animal, O otherwise."""
    return "\n\n".join("\n".join(f"{w} {'ANIMAL' if w.lower() in ANIMALS else 'O'}" for w in s.rstrip(".").split())
                       for s in rows) + "\n"


def test_tag_reads_xlnets_template_and_predicts_one_tag_per_word(tok):
    task = make_task("tag")
    examples = [{"words": s.rstrip(".").split(), "tags": ["O"] * len(s.rstrip(".").split()), "line": 1}
                for s in sentences(6, seed=3)]
    features = task.features(examples, tok, 64, ["ANIMAL", "O"], causal=False)
    for feature, row in zip(features, examples):
        assert feature["ids"][-2:] == [tok.specials.sep, tok.specials.cls]  # a <sep> <cls>
        assert feature["types"] == [0] * (len(feature["ids"]) - 1) + [2]  # <cls> in segment 2, as pre-trained
        assert len(feature["first"]) == len(row["words"]) and max(feature["first"]) < len(feature["ids"]) - 2
        labeled = [p for p, t in enumerate(feature["targets"]) if t != IGNORE]
        assert labeled == sorted(feature["first"])  # a target at each word's first subword, none at <sep> <cls>
    model = visible(task.build(backbone(tok), 2, "last", 0.0))
    batch = task.collate(features, tok.specials.pad)
    outputs = model.outputs(batch)
    unsegmented = model.head(model.backbone(batch["ids"], None, padding=batch["padding"]))
    assert (outputs - unsegmented).abs().max() > 1e-4  # the segment ids reach the model
    tags = task.predictions(examples, features, outputs, ["ANIMAL", "O"])
    for row, feature, logits, prediction in zip(examples, features, outputs, tags):
        assert prediction["words"] == row["words"] and len(prediction["tags"]) == len(row["words"])
        assert prediction["tags"] == [["ANIMAL", "O"][int(logits[p].argmax())] for p in feature["first"]]


@pytest.mark.parametrize("name", ["classify", "regress"])
def test_a_single_text_reads_xlnets_segments_where_berts_reads_none(tok, name):
    task = make_task(name)
    examples = [{"text": s} for s in sentences(5, seed=4)]
    features = task.features(examples, tok, 64, [], causal=False)
    for feature in features:
        assert feature["ids"][-2:] == [tok.specials.sep, tok.specials.cls]  # a <sep> <cls>
        assert feature["types"] == [0] * (len(feature["ids"]) - 1) + [2]  # <cls> in segment 2, as pre-trained
    batch = task.collate(features, tok.specials.pad)
    assert batch["types"].shape == batch["ids"].shape
    model = visible(task.build(backbone(tok), 2, "last", 0.0))
    unsegmented = model.head(model.pool(batch["ids"], None, batch["padding"]))
    assert (model.outputs(batch) - unsegmented).abs().max() > 1e-4  # the segment ids reach the model
    assert "types" not in task.collate(task.features(examples, tok, 64, [], causal=True), tok.specials.pad)

    bert = train_tokenizer(sentences(300), "wordpiece", 150)  # [CLS] a [SEP]: segment 0 throughout
    assert "types" not in task.collate(task.features(examples, bert, 64, [], causal=False), bert.specials.pad)
    paired = make_task(name, {"pair_column": "pair"})
    pairs = [{"text": s, "pair": s} for s in sentences(3, seed=5)]
    assert "types" in paired.collate(paired.features(pairs, bert, 64, [], causal=False), bert.specials.pad)


CONTEXT = "The old cat sleeps near the green river and the dog runs."


def test_span_qa_puts_the_context_first_and_cls_last_and_its_targets_index_the_context(tok):
    task = make_task("span_qa", {"doc_stride": 3, "version": "1.1"})
    task.for_family(FAMILIES["xlnet"])
    bert = make_task("span_qa")
    bert.for_family(FAMILIES["bert"])
    assert task.cls_last is True and bert.cls_last is False
    start = CONTEXT.index("the green river")
    example = {"id": "q", "question": "Where is the cat?", "context": CONTEXT, "impossible": False,
               "answers": [{"text": "the green river", "start": start}]}
    question = tok.encode(["Where is the cat?"], special=False)[0]
    context = tok.encode([CONTEXT], special=False)[0]
    features = task.features([example], tok, len(question) + 3 + 8, [], causal=False)  # eight context tokens each
    starts = [w for w, _ in context_windows(len(context), 8, 3)]
    assert len(features) == len(starts) > 1
    holding = 0
    for f, w in zip(features, starts):
        n = len(f["offsets"])
        assert f["ids"][n:] == [tok.specials.sep, *question, tok.specials.sep, tok.specials.cls]
        assert f["types"] == [0] * (n + 1) + [1] * (len(question) + 1) + [2]
        assert f["context_start"] == 0 and f["null"] == len(f["ids"]) - 1  # no answer: the final <cls>
        assert f["ids"][:n] == context[w: w + n]
        s, e = f["target"]
        if (s, e) != (f["null"], f["null"]):
            holding += 1
            assert e < n and CONTEXT[f["offsets"][s][0]: f["offsets"][e][1]] == "the green river"
    assert holding >= 1
    batch = task.collate(features, tok.specials.pad)
    n = len(features[0]["offsets"])
    assert batch["allowed"][0, :len(features[0]["ids"])].tolist() == [True] * n + [False] * (
        len(question) + 2) + [True]
    model = task.build(backbone(tok), 0, "last", 0.0).eval()
    outputs = model.outputs(batch)
    logits = torch.full_like(outputs, -5.0)  # the decoder reads the context positions of each window
    for j, f in enumerate(features):
        if f["target"][0] != f["null"]:  # each window holding the answer points at it
            logits[j, f["target"][0], 0] = logits[j, f["target"][1], 1] = 5.0
    assert task.predictions([example], features, logits, [])[0]["answer"] == "the green river"
    assert outputs.shape[:2] == batch["ids"].shape and outputs.shape[2] == 2


def test_a_choices_score_reads_its_own_cls_and_no_other_choice(tok):
    task = make_task("multiple_choice")
    net = backbone(tok)
    model = visible(task.build(net, 0, "last", 0.0))
    assert isinstance(model, XLNetChoiceModel) and isinstance(model.pooler[0], torch.nn.Linear)  # the summary
    row = {"text": "The cat sleeps near the river.", "choices": ["the cat", "a dog runs", "old stone"]}
    changed = {**row, "choices": ["the cat", "a green bird sings quickly over the old house", "old stone"]}
    scores = []
    for example in (row, changed):
        feature = task.features([example], tok, 64, [], causal=False)[0]
        assert all(ids[-2:] == [tok.specials.sep, tok.specials.cls] and types[-1] == 2
                   for ids, types in zip(feature["ids"], feature["types"]))
        batch = task.collate([feature], tok.specials.pad)
        scores.append(model.outputs(batch)[0])
        first = torch.tensor([feature["ids"][0]])
        state = net(first, torch.tensor([feature["types"][0]]))[0, -1]  # choice 0 alone: its <cls>'s content state
        torch.testing.assert_close(scores[-1][0], model.head(model.pooler(state))[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores[0][[0, 2]], scores[1][[0, 2]], atol=1e-5, rtol=1e-5)  # the others unchanged
    assert (scores[0][1] - scores[1][1]).abs() > 1e-4  # the changed choice's own score moved


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny xlnet run after three steps of permutation LM."""
    folder = tmp_path_factory.mktemp("xlnet")
    corpus = folder / "corpus.txt"
    corpus.write_text(documents(sentences(300) + ["Where is the cat?"] * 3))
    run = folder / "run"
    assert main(["--no-progress", "pretrain", "--family", "xlnet", "--size", "tiny", "--corpus", str(corpus),
                 "--vocab-size", "200", "--seq-len", "24", "--batch-size", "4", "--max-steps", "3",
                 "--out", str(run)]) == 0
    return run


def squad_file(path, n: int, seed: int) -> str:
    """Questions "Where is the cat?" whose answer is the place after "the cat is in the"."""
    paragraphs = []
    for i, text in enumerate(sentences(n, seed=seed)):
        place = WORDS[20 + i % 6]
        context = f"{text} The cat is in the {place}."
        paragraphs.append({"context": context, "qas": [{"id": f"{seed}-{i}", "question": "Where is the cat?",
                                                        "answers": [{"text": place,
                                                                     "answer_start": context.index(place + ".")}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return str(path)


def choices_file(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    rows = []
    for s in sentences(n, seed):
        present = sorted(set(s.lower().rstrip(".").split()))
        absent = [w for w in WORDS if w not in present]
        label = rng.randrange(3)
        choices = [" ".join(rng.sample(absent, 2)) for _ in range(3)]
        choices[label] = f"{rng.choice(present)} {rng.choice(absent)}"
        rows.append(json.dumps({"context": s, "choices": choices, "label": label}))
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def files(task: str, folder) -> tuple[str, str]:
    if task == "span_qa":
        return squad_file(folder / "train.json", 24, 1), squad_file(folder / "dev.json", 8, 2)
    if task == "multiple_choice":
        return choices_file(folder / "train.jsonl", 32, 1), choices_file(folder / "dev.jsonl", 10, 2)
    for name, n, seed in (("train", 60, 1), ("dev", 20, 2)):
        (folder / f"{name}.txt").write_text(conll(sentences(n, seed)))
    return str(folder / "train.txt"), str(folder / "dev.txt")


@pytest.mark.parametrize("task, metric", [("tag", "f1"), ("span_qa", "f1"), ("multiple_choice", "accuracy")])
def test_finetune_predict_and_evaluate_end_to_end(pretrained, tmp_path, capsys, task, metric):
    train, dev = files(task, tmp_path)
    tuned = tmp_path / "tuned"
    assert main(["--no-progress", "finetune", "--from", str(pretrained), "--task", task, "--train", train, "--dev",
                 dev, "--epochs", "1", "--batch-size", "8", "--max-length", "40", "--out", str(tuned)]) == 0
    config = json.loads((tuned / "config.json").read_text())
    assert config["model"]["arch"] == "xlnet" and config["task"] == task
    if task == "span_qa":
        assert config["task_options"]["cls_last"] is True  # XLNet's layout, recorded for predict and evaluate
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tuned), "--data", dev, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 0.0 <= report[metric] <= 1.0
    assert main(["predict", "--model", str(tuned), "--input", dev]) == 0
    predictions = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    n = {"tag": 20, "span_qa": 8, "multiple_choice": 10}[task]
    assert len(predictions) == n
