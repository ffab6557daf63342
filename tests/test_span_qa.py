"""Extractive QA (span_qa): the SQuAD reader, context windows, span decoding, the official EM/F1, the
v2.0 no-answer threshold, the prediction file, the derived v2.0 script, and a tiny model learning."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from sesame.errors import SesameError
from sesame.models import Transformer, TransformerConfig
from sesame.tasks import make_task
from sesame.metrics import answer_scores, normalize_answer, token_f1, tune_null_threshold
from sesame.tasks.span_qa import context_windows, max_context, window_candidates
from sesame.tokenizer import train_tokenizer

from .conftest import WORDS, sentences, shared_data

ROOT = Path(__file__).resolve().parents[1]


def squad(articles: list[tuple[str, str, list[dict]]], version: str = "1.1") -> dict:
    """A SQuAD dict of (title, context, qas) articles, one paragraph each."""
    return {"version": version, "data": [{"title": title, "paragraphs": [{"context": context, "qas": qas}]}
                                         for title, context, qas in articles]}


def write(tmp_path: Path, data: dict, name: str = "squad.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


CONTEXT = "The cat sat on the mat near the old river."


def qa(qid: str, question: str, text: str | None, start: int | None = None) -> dict:
    answers = [] if text is None else [{"text": text, "answer_start": CONTEXT.index(text) if start is None else start}]
    return {"id": qid, "question": question, "answers": answers}


# -- reader ----------------------------------------------------------------------------------------

def test_reader_reads_questions_and_checks_answers_against_the_context(tmp_path):
    path = write(tmp_path, squad([("Cats", CONTEXT, [qa("q1", "Where did the cat sit?", "on the mat")])]))
    task = make_task("span_qa")
    [example] = task.read(path)
    assert example == {"id": "q1", "title": "Cats", "question": "Where did the cat sit?", "context": CONTEXT,
                       "answers": [{"text": "on the mat", "start": 12}], "impossible": False}
    assert task.version == "1.1"  # auto: the file's version, then kept
    assert "answers" not in task.read(path, labeled=False)[0]
    moved = write(tmp_path, squad([("Cats", CONTEXT, [qa("q7", "Where?", "on the mat", start=11)])]))
    with pytest.raises(SesameError, match=r"squad.json: question 'q7' \(article 'Cats'\): answer 'on the mat' is "
                                          r"not at answer_start 11 .*' on the ma'"):
        make_task("span_qa").read(moved)


def test_reader_errors_name_the_file_question_and_fix(tmp_path):
    cases = [
        (squad([("Cats", CONTEXT, [qa("q2", "Who?", None)])]), r"question 'q2' \(article 'Cats'\): no answers"),
        (squad([("Cats", CONTEXT, [qa("q1", "A?", "cat"), qa("q1", "B?", "mat")])]), r"'q1'.*used before"),
        (squad([("Cats", CONTEXT, [{"id": "q3", "answers": []}])]), r"question 'q3' .*needs 'question'"),
        ({"version": "1.1"}, r"squad.json: needs 'data'"),
        (squad([]), r"squad.json: no questions"),
    ]
    for data, message in cases:
        with pytest.raises(SesameError, match=message):
            make_task("span_qa").read(write(tmp_path, data))
    (tmp_path / "broken.json").write_text('{"data": [')
    with pytest.raises(SesameError, match=r"broken.json: not a SQuAD JSON file .*line 1"):
        make_task("span_qa").read(str(tmp_path / "broken.json"))


def test_v2_questions_need_version_2_and_empty_answers(tmp_path):
    impossible = {"id": "q9", "question": "Who won?", "answers": [], "is_impossible": True}
    path = write(tmp_path, squad([("Cats", CONTEXT, [qa("q1", "What sat?", "cat"), impossible])], "v2.0"))
    task = make_task("span_qa")
    examples = task.read(path)
    assert task.version == "2.0" and [e["impossible"] for e in examples] == [False, True]
    with pytest.raises(SesameError, match=r"'q9' .*is_impossible .*use --task-option version=2.0"):
        make_task("span_qa", {"version": "1.1"}).read(path)
    both = write(tmp_path, squad([("Cats", CONTEXT, [{**qa("q4", "What?", "cat"), "is_impossible": True}])], "v2.0"))
    with pytest.raises(SesameError, match=r"'q4' .*is_impossible yet has answers"):
        make_task("span_qa").read(both)
    with pytest.raises(SesameError, match="version=3: choose one of auto, 1.1, 2.0"):
        make_task("span_qa", {"version": 3})
    assert make_task("span_qa", {"version": 2.0}).version == "2.0"  # a number, as Python may give it


# -- windows ---------------------------------------------------------------------------------------

def test_windows_start_doc_stride_apart_and_each_token_has_one_max_context_window():
    assert context_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert context_windows(10, 4, 9) == [(0, 4), (4, 4), (8, 2)]  # never skips tokens
    assert context_windows(3, 4, 2) == [(0, 3)]
    windows = context_windows(10, 4, 2)
    best = max_context(windows)
    # token 3 is at the right edge of window (0, 4) but 1 token in from the left of (2, 4), which wins
    assert best[0] == [True, True, True, False] and best[1][1] is True
    owners = [sum(b[t - s] for (s, n), b in zip(windows, best) if s <= t < s + n) for t in range(10)]
    assert owners == [1] * 10


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(300) + [CONTEXT, "Where did the cat sit?"], "wordpiece", 150)


def test_encoders_get_question_then_context_with_segments_and_decoders_none(tok, tmp_path):
    task = make_task("span_qa", {"doc_stride": 2})
    path = write(tmp_path, squad([("Cats", CONTEXT, [qa("q1", "Where did the cat sit?", "on the mat")])]))
    examples = task.read(path)
    question = tok.encode(["Where did the cat sit?"], special=False)[0]
    context = tok.encode([CONTEXT], special=False)[0]
    width = len(question) + 3 + 7  # seven context tokens per window
    features = task.features(examples, tok, width, [], causal=False)
    first = features[0]
    cls, sep = tok.specials.cls, tok.specials.sep
    assert first["ids"] == [cls, *question, sep, *context[:7], sep]
    assert first["types"] == [0] * (len(question) + 2) + [1] * 8
    starts = [w for w, _ in context_windows(len(context), 7, 2)]
    assert [f["ids"][f["context_start"]] for f in features] == [context[w] for w in starts]
    offsets = tok.encodings([CONTEXT], special=False)[0].offsets  # "on the mat" is characters 12-22
    a, b = [t for t, (s, _) in enumerate(offsets) if s == 12][0], [t for t, (_, e) in enumerate(offsets) if e == 22][0]
    holding = [j for j, w in enumerate(starts) if w <= a and b < w + 7]
    assert [j for j, f in enumerate(features) if f["target"] != (0, 0)] == holding and holding
    for j in holding:  # the others, not holding the whole answer, target [CLS]
        f = features[j]
        k, (s, e) = f["context_start"], f["target"]
        assert CONTEXT[f["offsets"][s - k][0]: f["offsets"][e - k][1]] == "on the mat"
    decoder = task.features(examples, tok, width, [], causal=True)
    assert "types" not in decoder[0] and decoder[0]["ids"] == first["ids"]
    assert all(f["null"] == len(f["ids"]) - 1 for f in decoder)  # GPT reads no-answer where it has seen it all
    batch = task.collate(features, tok.specials.pad)
    assert batch["counts"] == {"loss": len(features)} and batch["targets"].shape == (len(features), 2)
    assert batch["allowed"][0].tolist() == [True] + [False] * (len(question) + 1) + [True] * 7 + [False]
    with pytest.raises(SesameError, match="--max-length 12: no room for the context"):
        make_task("span_qa", {"max_query_length": 9}).features(examples, tok, 12, [], causal=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_windows_recover_every_gold_answer_of_real_squad(kind):
    """300 questions of the shared SQuAD dev set, windows of 128 tokens 64 apart: every window that
    targets an answer maps back to exactly the gold text, save answers that begin or end inside a token
    (annotations such as "8" out of "18", which no tokenizer boundary reproduces); a model putting
    its logits on the targets decodes them. Byte-level BPE pieces carry the space before a word, which
    the offsets drop."""
    task = make_task("span_qa", {"doc_stride": 64})
    examples = task.read(str(shared_data() / "squad" / "dev.json"))[:300]
    tok = train_tokenizer(list(dict.fromkeys(e["context"] for e in examples)), kind, 2000)
    features = task.features(examples, tok, 128, [], causal=False)
    found, inside_a_token = {}, set()
    for f in features:
        example = examples[f["example"]]
        gold = example["answers"][0]
        k, (s, e) = f["context_start"], f["target"]
        if (s, e) == (0, 0):
            continue
        found[f["example"]] = found.get(f["example"], 0) + 1
        text = example["context"][f["offsets"][s - k][0]: f["offsets"][e - k][1]]
        if text != gold["text"]:  # only where no token starts or ends with the answer, and then its shortest cover
            starts, ends = {t[0] for t in f["offsets"]}, {t[1] for t in f["offsets"]}
            assert gold["start"] not in starts or gold["start"] + len(gold["text"]) not in ends
            assert gold["text"] in text and len(text) - len(gold["text"]) <= 4
            inside_a_token.add(f["example"])
    assert len(found) == 300  # every answer lies whole in some window
    assert sum(n > 1 for n in found.values()) > 50  # and many in several
    assert len(inside_a_token) <= 10
    outputs = torch.zeros(len(features), max(len(f["ids"]) for f in features), 2)
    for j, f in enumerate(features):
        outputs[j, f["target"][0], 0] = outputs[j, f["target"][1], 1] = 10.0
    predictions = task.predictions(examples, features, outputs, [])
    long = {f["example"] for f in features if f["target"][1] - f["target"][0] >= task.max_answer_length}
    wrong = {i for i, (p, e) in enumerate(zip(predictions, examples)) if p["answer"] != e["answers"][0]["text"]}
    assert wrong == inside_a_token | long and len(long) <= 2


# -- decoding --------------------------------------------------------------------------------------

def hand_feature(context: str, k: int = 3) -> dict:
    """A window of ``context`` split on spaces, after k question/special positions."""
    offsets, at = [], 0
    for word in context.split():
        at = context.index(word, at)
        offsets.append((at, at + len(word)))
        at += len(word)
    return {"example": 0, "ids": [0] * (k + len(offsets) + 1), "context_start": k, "offsets": offsets,
            "max_context": [True] * len(offsets), "null": 0}


def logits_for(feature: dict, start: dict[int, float], end: dict[int, float]) -> torch.Tensor:
    """Start and end logits of a window: the given positions, −10 elsewhere."""
    out = torch.full((len(feature["ids"]), 2), -10.0)
    for position, value in start.items():
        out[position, 0] = value
    for position, value in end.items():
        out[position, 1] = value
    return out


def test_decoding_takes_the_best_valid_span_across_windows():
    context = "w0 w1 w2 w3 w4 w5 w6 w7"
    task = make_task("span_qa", {"max_answer_length": 3, "version": "1.1"})
    example = {"id": "q", "context": context, "question": "?"}
    one = hand_feature(context)  # context tokens w0..w7 at positions 3..10
    # the best sums are invalid: question position 1 (9 + 9), w6 → w4 (5 + 3, end before start), w0 → w4
    # (4 + 3, five tokens > 3); the best valid span is w0 → w2 (4 + 1)
    first = logits_for(one, {1: 9.0, 9: 5.0, 3: 4.0, 4: 3.0}, {1: 9.0, 7: 3.0, 5: 1.0})
    candidates = window_candidates(context, one, first.tolist(), 20, 3)
    assert max(candidates, key=lambda c: c["score"])["text"] == "w0 w1 w2"
    assert all(len(c["text"].split()) <= 3 for c in candidates)
    longer = window_candidates(context, one, first.tolist(), 20, 5)
    assert max(longer, key=lambda c: c["score"])["text"] == "w0 w1 w2 w3 w4"
    # a second window of the same question holds a better span, w5 w6 w7 (2.5 + 4): it wins
    second = logits_for(one, {8: 2.5}, {10: 4.0})
    outputs = torch.stack([first, second])
    [prediction] = task.predictions([example], [one, {**one}], outputs, [])
    assert prediction["answer"] == "w5 w6 w7" and prediction["n_best"][0]["score"] == pytest.approx(6.5)
    assert prediction["n_best"][1]["text"] == "w0 w1 w2"
    assert sum(c["probability"] for c in prediction["n_best"]) == pytest.approx(1.0, abs=1e-4)
    assert len({c["text"] for c in prediction["n_best"]}) == len(prediction["n_best"])
    # n_best = 1 keeps only the top start and the top end of each window: w6 (9) after w2 (5) is invalid
    narrow = make_task("span_qa", {"n_best": 1, "max_answer_length": 3, "version": "1.1"})
    assert narrow.predictions([example], [one], first[None], [])[0]["answer"] == ""
    # a start outside its window of maximum context is not taken
    shadowed = {**one, "max_context": [True] + [False] * 7}
    assert window_candidates(context, shadowed, second.tolist(), 20, 3) and all(
        c["start"] == 0 for c in window_candidates(context, shadowed, second.tolist(), 20, 3))


def test_v2_answers_nothing_when_the_null_score_beats_the_best_span_by_the_threshold():
    context = "w0 w1 w2"
    example = {"id": "q", "context": context, "question": "?"}
    f = hand_feature(context)
    # span w1 scores 2 + 2 = 4; s_null = start[CLS] + end[CLS] = 3 + 2.5 in one window, 1 + 1 in another (the minimum)
    windows = [logits_for(f, {0: 3.0, 4: 2.0}, {0: 2.5, 4: 2.0}), logits_for(f, {0: 1.0}, {0: 1.0})]
    outputs = torch.stack(windows)
    for threshold, answer in ((None, "w1"), (-1.5, "w1"), (-2.5, "")):  # s_null − best = 2 − 4 = −2
        task = make_task("span_qa", {"version": "2.0", "null_threshold": threshold})
        [prediction] = task.predictions([example], [f, f], outputs, [])
        assert prediction["answer"] == answer and prediction["null_score_diff"] == pytest.approx(-2.0)
        assert [c["score"] for c in prediction["n_best"] if c["text"] == ""] == [2.0]  # the no-answer entry
    assert make_task("span_qa", {"version": "1.1"}).predictions([example], [f, f], outputs, [])[0]["answer"] == "w1"


# -- metrics ---------------------------------------------------------------------------------------

def test_answer_normalisation_exact_match_and_f1_by_hand():
    assert normalize_answer("  The Cat's  hat, a  THEory!") == "cats hat theory"
    assert normalize_answer("an apple—the end") == "apple— end"  # only ASCII punctuation goes; "—" ends a word
    # prediction "the cat sat" → [cat, sat]; gold "cat sat down" → [cat, sat, down]: P = 1, R = 2/3, F1 = 0.8
    assert token_f1("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert token_f1("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # multiset overlap: one "cat" in common
    exact, f1 = answer_scores("Denver Broncos", ["Broncos", "the Denver Broncos.", "Carolina"], "1.1")
    assert exact == 1.0 and f1 == 1.0  # the maximum over the golds
    exact, f1 = answer_scores("Denver", ["Denver Broncos", "Panthers"], "1.1")
    assert exact == 0.0 and f1 == pytest.approx(2 / 3)
    assert answer_scores("the", ["a"], "1.1") == (1.0, 0.0)  # v1.1: both empty after normalising: F1 0
    assert answer_scores("", [], "2.0") == (1.0, 1.0)  # v2.0: no answer to an unanswerable question
    assert answer_scores("the", ["a", "Broncos"], "2.0") == (0.0, 0.0)  # golds that normalise to "" are dropped
    assert answer_scores("x", [], "2.0") == (0.0, 0.0)


def test_null_threshold_tuning_maximises_f1_by_hand():
    # four questions: diffs (s_null − best span), F1 if answered, F1 if not
    diffs = [-3.0, -1.0, 0.5, 2.0]
    answered = [1.0, 0.0, 0.5, 1.0]
    unanswered = [0.0, 1.0, 0.0, 0.0]
    # summed F1 answering those with diff ≤ t: t < −3: 1; −3: 2; −1: 1; 0.5: 1.5; 2: 2.5 (best)
    assert tune_null_threshold(diffs, answered, unanswered) == (2.0, pytest.approx(2.5 / 4))
    answered[3] = 0.0  # now t = −3: answer only the first (2 of 4)
    assert tune_null_threshold(diffs, answered, unanswered) == (-3.0, 0.5)
    # answering nothing is best: a threshold below every diff
    assert tune_null_threshold([1.0, 2.0], [0.0, 0.0], [1.0, 1.0]) == (0.0, 1.0)
    # ties move together: answering both at diff 1 gains 1 − 0.5 = 0.5 net
    assert tune_null_threshold([1.0, 1.0], [1.0, 0.0], [0.0, 0.5]) == (1.0, 0.5)
    # answering the second changes nothing: the first threshold reaching the best is kept (as the official script)
    assert tune_null_threshold([1.0, 2.0], [1.0, 0.0], [0.0, 0.0]) == (1.0, 0.5)


def test_v2_score_reports_the_tuned_threshold_and_uses_a_saved_one():
    context = "w0 w1 w2"
    f = hand_feature(context)
    examples = [{"id": "a", "context": context, "question": "?", "impossible": False,
                 "answers": [{"text": "w1", "start": 3}]},
                {"id": "b", "context": context, "question": "?", "impossible": True, "answers": []}]
    # both predict w1 (score 4); s_null 1 for "a" (diff −3), 3 for "b" (diff −1): the best threshold is −3
    outputs = torch.stack([logits_for(f, {0: 0.5, 4: 2.0}, {0: 0.5, 4: 2.0}),
                           logits_for(f, {0: 1.5, 4: 2.0}, {0: 1.5, 4: 2.0})])
    features = [f, {**f, "example": 1}]
    report = make_task("span_qa", {"version": "2.0"}).score(examples, features, outputs, [])
    assert report["null_threshold"] == -3.0 and report["f1"] == 1.0 and report["exact"] == 1.0
    assert report["has_answer_f1"] == 1.0 and report["no_answer_f1"] == 1.0
    saved = make_task("span_qa", {"version": "2.0", "null_threshold": 0.0}).score(examples, features, outputs, [])
    assert saved["null_threshold"] == 0.0 and saved["f1"] == 0.5 and saved["best_f1"] == 1.0
    assert saved["best_null_threshold"] == -3.0
    plain = make_task("span_qa", {"version": "1.1"}).score(examples[:1], features[:1], outputs[:1], [])
    assert plain == {"exact": 1.0, "f1": 1.0, "questions": 1}


def test_fine_tuning_records_the_tuned_threshold_in_a_new_config(tmp_path):
    """The dev-tuned threshold goes into config.json's task options (as the run's config was replaced, not edited),
    key order kept; an unchanged one, or none, writes nothing."""
    from dataclasses import replace

    from sesame.pipelines.finetune import _record_threshold
    from sesame.run import read_config, write_config

    fixture = read_config(Path(__file__).parent / "fixtures" / "runs" / "classifier", "--model")
    options = make_task("span_qa", {"version": "2.0"}).options()
    write_config(tmp_path, replace(fixture, finetuned=replace(fixture.finetuned, task="span_qa", task_options=options)))
    _record_threshold(tmp_path, {"f1": 0.5, "null_threshold": -1.5})
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["task_options"] == {**options, "null_threshold": -1.5}
    assert list(written["task_options"]) == list(options)
    before = (tmp_path / "config.json").stat().st_mtime_ns
    _record_threshold(tmp_path, {"f1": 0.5, "null_threshold": -1.5})
    _record_threshold(tmp_path, {"f1": 0.5})
    assert (tmp_path / "config.json").stat().st_mtime_ns == before


def test_write_gives_the_official_scripts_id_to_answer_json(tmp_path):
    task = make_task("span_qa", {"version": "2.0"})
    predictions = [{"id": "q1", "answer": "Denver Broncos", "n_best": []}, {"id": "q2", "answer": "", "n_best": []}]
    task.write([{}, {}], predictions, tmp_path / "predictions.json")
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"q1": "Denver Broncos", "q2": ""}


# -- derived v2.0 ----------------------------------------------------------------------------------

def test_derived_v2_moves_a_third_of_the_questions_to_another_article(tmp_path):
    spec = importlib.util.spec_from_file_location("squad_v2", ROOT / "scripts" / "squad_v2.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    contexts = {f"T{a}": " ".join(sentences(3, seed=a)) for a in range(4)}
    source = squad([(title, context, [{"id": f"{title}-{i}", "question": f"Q{i}?", "answers": [
        {"text": context.split()[i], "answer_start": len(" ".join(context.split()[:i])) + (i > 0)}]}
        for i in range(6)]) for title, context in contexts.items()])
    derived = script.derive(source, seed=0)
    assert derived == script.derive(source, seed=0) and derived != script.derive(source, seed=1)
    assert derived["version"] == "v2.0-derived"
    assert "is_impossible" not in source["data"][0]["paragraphs"][0]["qas"][0]  # the source is left alone
    moved = [(article["title"], qa) for article in derived["data"] for p in article["paragraphs"] for qa in p["qas"]
             if qa["is_impossible"]]
    assert len(moved) == 8 and all(qa["answers"] == [] and not qa["id"].startswith(title + "-") for title, qa in moved)
    task = make_task("span_qa")
    examples = task.read(write(tmp_path, derived))
    assert task.version == "2.0" and len(examples) == 24 and sum(e["impossible"] for e in examples) == 8


# -- training --------------------------------------------------------------------------------------

def test_a_tiny_model_learns_to_point_at_the_answer(tok, one_thread):
    """Questions "where is the cat?" over generated contexts; the answer is the word after "the cat"."""
    task = make_task("span_qa", {"doc_stride": 8, "version": "1.1"})
    examples = []
    for i, text in enumerate(sentences(12, seed=5)):
        place = WORDS[20 + i % 6]
        context = f"{text} The cat is in the {place}. {sentences(1, seed=50 + i)[0]}"
        answer = {"text": place, "start": context.index(f"the {place}.") + 4}
        examples.append({"id": str(i), "title": "t", "question": "Where is the cat?", "context": context,
                         "impossible": False, "answers": [answer]})
    features = task.features(examples, tok, 32, [], causal=False)
    assert len(features) > len(examples)  # windows of 32 tokens split most contexts
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden=16, layers=1, heads=2, intermediate=32,
                            max_positions=64, dropout=0.0)
    model = task.build(Transformer(cfg), 0, "cls", 0.1)
    batch = task.collate(features, tok.specials.pad)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = model(batch) / batch["counts"]["loss"]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.5 * losses[0]
    outputs = model.eval().outputs(batch)
    assert outputs.shape == (len(features), batch["ids"].shape[1], 2)
    assert task.score(examples, features, outputs, [])["f1"] > 0.5
