"""Multiple choice: the JSONL reader and its errors, pair encoding, variable candidate counts, a softmax
across candidates scored one pair at a time, learning, and the whole pipeline through ``sesame.finetune``."""
import json
import random

import pytest
import torch

import sesame
import sesame.tasks.multiple_choice  # noqa: F401  (registers the task)
from sesame.errors import SesameError
from sesame.models import Transformer, TransformerConfig
from sesame.tasks import EVAL_BATCH, infer, make_task
from sesame.tokenizer import train_tokenizer

from .conftest import WORDS, sentences


def choice_rows(n: int, seed: int, counts: tuple[int, ...] = (3,)) -> list[dict]:
    """Contexts with candidates of two words; the right one repeats a word of its context, the others don't."""
    rng = random.Random(seed)
    rows = []
    for i, context in enumerate(sentences(n, seed)):
        present = sorted(set(context.lower().rstrip(".").split()))
        absent = [w for w in WORDS if w not in present]
        k = counts[i % len(counts)]
        choices = [" ".join(rng.sample(absent, 2)) for _ in range(k)]
        label = rng.randrange(k)
        choices[label] = f"{rng.choice(present)} {rng.choice(absent)}"
        rows.append({"context": context, "choices": choices, "label": label})
    return rows


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(200), "wordpiece", 120)


def tiny_model(task, tok, causal: bool = False, hidden: int = 16):
    cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden=hidden, layers=1, heads=2, intermediate=2 * hidden,
                            max_positions=64, dropout=0.0, causal=causal)
    return task.build(Transformer(cfg), 0, "mean", 0.0)


def test_reader_takes_an_index_or_the_answer_text_and_keeps_line_numbers(tmp_path):
    task = make_task("multiple_choice", {"question_field": "question"})
    path = write_jsonl(tmp_path / "race.jsonl", [
        {"context": "Tom has a dog.", "question": "What does Tom have?", "choices": ["a cat", "a dog"], "label": 1},
        {"context": "Ann sings.", "question": "Who sings?", "choices": ["Tom", "Ann", "Bob"], "label": "Ann"}])
    with open(path, "a") as f:
        f.write("\n" + json.dumps({"context": "x", "question": "y", "choices": ["a", "b"], "label": 0}) + "\n")
    rows = task.read(path)
    assert [(r["line"], r["label"]) for r in rows] == [(1, 1), (2, 1), (4, 0)]  # the blank line 3 keeps its number
    assert rows[1]["question"] == "Who sings?" and rows[1]["choices"] == ["Tom", "Ann", "Bob"]
    unlabeled = task.read(write_jsonl(tmp_path / "test.jsonl", [{"context": "c", "question": "q",
                                                                   "choices": ["a", "b"]}]), labeled=False)
    assert unlabeled == [{"text": "c", "choices": ["a", "b"], "question": "q", "line": 1}]


@pytest.mark.parametrize("line, message", [
    ('{"context": "c", "choices": ["a", "b"], "label": 0', r"bad.jsonl:2: not valid JSON"),
    ('["c", ["a", "b"], 0]', r"bad.jsonl:2: expected a JSON object"),
    ('{"context": "c", "label": 0}', r"bad.jsonl:2: no field 'choices' \(--task-option choices_field\)"),
    ('{"context": "c", "choices": ["a", "b"]}', r"bad.jsonl:2: no field 'label'"),
    ('{"context": "", "choices": ["a", "b"], "label": 0}', r"bad.jsonl:2: 'context' must be a non-empty string"),
    ('{"context": "c", "choices": ["a"], "label": 0}', r"bad.jsonl:2: 'choices' must be a list of at least two"),
    ('{"context": "c", "choices": "a b", "label": 0}', r"bad.jsonl:2: 'choices' must be a list"),
    ('{"context": "c", "choices": ["a", "b"], "label": 2}', r"bad.jsonl:2: 'label' is 2, but there are 2 choices"),
    ('{"context": "c", "choices": ["a", "b"], "label": -1}', r"bad.jsonl:2: 'label' is -1"),
    ('{"context": "c", "choices": ["a", "b"], "label": "d"}', r"bad.jsonl:2: 'label' is 'd', which is not among"),
    ('{"context": "c", "choices": ["a", "a"], "label": "a"}', r"bad.jsonl:2: 'label' is 'a', which matches several"),
    ('{"context": "c", "choices": ["a", "b"], "label": true}', r"bad.jsonl:2: 'label' is true"),
])
def test_reader_errors_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context": "c", "choices": ["a", "b"], "label": 0}\n' + line + "\n")
    with pytest.raises(SesameError, match=message):
        make_task("multiple_choice").read(str(path))


def test_reader_wants_jsonl_and_options_are_named(tmp_path):
    path = tmp_path / "mc.csv"
    path.write_text("context,choices,label\n")
    with pytest.raises(SesameError, match="mc.csv: --task multiple_choice reads JSON Lines"):
        make_task("multiple_choice").read(str(path))
    task = make_task("multiple_choice", {"context_field": "startphrase", "choices_field": "endings"})
    rows = task.read(write_jsonl(tmp_path / "swag.jsonl", [{"startphrase": "s", "endings": ["a", "b"], "label": 1}]))
    assert rows == [{"text": "s", "choices": ["a", "b"], "label": 1, "line": 1}]


def test_each_candidate_is_paired_with_the_context_and_question(tok):
    task = make_task("multiple_choice", {"question_field": "question"})
    example = {"text": "the cat sleeps", "question": "who sleeps", "choices": ["the cat", "a dog runs"], "label": 0}
    feature = task.features([example], tok, 64, [], causal=False)[0]
    assert len(feature["ids"]) == 2 and feature["target"] == 0
    first = tok.encode(["the cat sleeps who sleeps"], special=False)[0]
    cls, sep = tok.specials.cls, tok.specials.sep
    for ids, types, choice in zip(feature["ids"], feature["types"], example["choices"]):
        second = tok.encode([choice], special=False)[0]
        assert ids == [cls, *first, sep, *second, sep]  # BERT §4.4: [CLS] context [SEP] candidate [SEP]
        assert types == [0] * (len(first) + 2) + [1] * (len(second) + 1)
    assert task.length(feature) == len(feature["ids"][1]) > len(feature["ids"][0])
    causal = task.features([example], tok, 64, [], causal=True)[0]
    assert causal["ids"] == feature["ids"] and "types" not in causal
    assert all(len(ids) <= 9 for ids in task.features([example], tok, 9, [], causal=False)[0]["ids"])


def test_variable_candidate_counts_pad_with_masked_dummies(tok):
    torch.manual_seed(0)
    task = make_task("multiple_choice")
    rows = [{"text": r["context"], "choices": r["choices"], "label": r["label"]}
            for r in choice_rows(3, seed=5, counts=(2, 4, 3))]
    features = task.features(rows, tok, 64, [], causal=False)
    batch = task.collate(features, tok.specials.pad)
    width = max(task.length(f) for f in features)
    assert batch["ids"].shape == batch["types"].shape == batch["padding"].shape == (12, width)
    assert batch["choices"].tolist() == [[True, True, False, False], [True] * 4, [True, True, True, False]]
    assert batch["targets"].tolist() == [r["label"] for r in rows]
    assert batch["ids"][4 * 0 + 1].tolist()[: len(features[0]["ids"][1])] == features[0]["ids"][1]  # example-major
    model = tiny_model(task, tok).eval()
    scores = model.outputs(batch)
    assert scores.shape == (3, 4)
    assert torch.isinf(scores[~batch["choices"]]).all() and torch.isfinite(scores[batch["choices"]]).all()
    loss = model(batch)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    alone = model.outputs(task.collate(features[:1], tok.specials.pad))  # the dummies change nothing
    assert alone.shape == (1, 2) and torch.allclose(alone, scores[:1, :2], atol=1e-5)
    assert "targets" not in task.collate(task.features([{"text": "a", "choices": ["b", "c"]}], tok, 64, [], False), 0)


@pytest.mark.parametrize("causal", [False, True])
def test_each_pair_is_scored_alone_and_the_softmax_runs_across_candidates(tok, causal):
    """GPT §3.3: each (context, answer) sequence is processed independently, then a softmax across answers;
    so permuting the candidates permutes their scores, and removing one leaves the others' scores alone."""
    torch.manual_seed(0)
    task = make_task("multiple_choice")
    model = tiny_model(task, tok, causal)
    torch.nn.init.normal_(model.head.weight)  # large enough that a difference shows
    model.eval()
    rows = [{"text": r["context"], "choices": r["choices"]} for r in choice_rows(4, seed=6, counts=(4,))]

    @torch.no_grad()
    def scores(examples):
        return model.outputs(task.collate(task.features(examples, tok, 64, [], causal), tok.specials.pad))

    before = scores(rows)
    order = [2, 0, 3, 1]
    after = scores([{**r, "choices": [r["choices"][j] for j in order]} for r in rows])
    assert torch.allclose(after, before[:, order], atol=1e-5)
    assert before.std(1).min() > 1e-2  # the scores differ across candidates, so the check above can fail
    fewer = scores([{**r, "choices": r["choices"][:3]} for r in rows])
    assert torch.allclose(fewer, before[:, :3], atol=1e-5)
    predictions = task.predictions(rows, [], before, [])
    for p, r, s in zip(predictions, rows, before):
        assert p["probabilities"] == pytest.approx(s.softmax(-1).tolist(), abs=1e-6)
        assert p["choice"] == int(s.argmax()) and p["answer"] == r["choices"][p["choice"]]


def test_a_tiny_model_learns_to_pick_the_candidate_that_repeats_the_context(tok, one_thread):
    torch.manual_seed(0)
    task = make_task("multiple_choice")
    rows = [{"text": r["context"], "choices": r["choices"], "label": r["label"]} for r in choice_rows(24, seed=7)]
    batch = task.collate(task.features(rows, tok, 64, [], causal=False), tok.specials.pad)
    model = tiny_model(task, tok, hidden=32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(40):
        optimizer.zero_grad()
        (model(batch) / len(rows)).backward()
        optimizer.step()
    report = task.score(rows, [], model.eval().outputs(batch).detach(), [])
    assert report["n"] == 24 and report["accuracy"] >= 0.9  # chance: 1/3


def test_infer_handles_later_batches_with_more_candidates(tok):
    torch.manual_seed(0)
    task = make_task("multiple_choice")
    short = [{"text": "a cat", "choices": ["the dog", "a bird"]}] * EVAL_BATCH
    long = [{"text": "the old cat sleeps near the river", "choices": ["a", "b", "c", "d"]}] * 3
    features = task.features(short + long, tok, 64, [], causal=False)
    outputs = infer(tiny_model(task, tok), task, features, tok.specials.pad)
    assert outputs.shape == (EVAL_BATCH + 3, 4) and torch.isfinite(outputs[-3:]).all()


def test_finetune_evaluate_and_predict_end_to_end(tmp_path, one_thread):
    train = write_jsonl(tmp_path / "train.jsonl", [
        {"ctx": r["context"], "endings": r["choices"], "answer": r["choices"][r["label"]] if i % 2 else r["label"]}
        for i, r in enumerate(choice_rows(40, seed=8, counts=(2, 3)))])
    dev_rows = choice_rows(12, seed=9, counts=(3, 2))
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"ctx": r["context"], "endings": r["choices"], "answer": r["label"]}
                                                for r in dev_rows])
    options = {"context_field": "ctx", "choices_field": "endings", "label_field": "answer"}
    run = tmp_path / "mc"
    metrics = sesame.finetune("scratch:bert:tiny", train, dev, str(run), task="multiple_choice", task_options=options,
                              epochs=1, batch_size=8, max_length=24, progress=False)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    config = json.loads((run / "config.json").read_text())
    assert config["task"] == "multiple_choice" and config["task_options"]["choices_field"] == "endings"
    assert not (run / "labels.json").exists()
    predictor = sesame.load(run)
    report = predictor.evaluate(dev)
    assert report["n"] == 12 and report["accuracy"] == pytest.approx(metrics["accuracy"])
    predictions = predictor.predict([{"text": r["context"], "choices": r["choices"]} for r in dev_rows[:2]])
    assert [len(p["probabilities"]) for p in predictions] == [3, 2]
    assert all(p["answer"] == r["choices"][p["choice"]] for p, r in zip(predictions, dev_rows))
    assert sum(predictions[0]["probabilities"]) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(SesameError, match="--task multiple_choice reads examples from a file"):
        predictor.predict(["a bare text"])
