"""Text-to-text (text2text): reading each format and cast (T5's Appendix D inputs), file:line errors, STS-B's
rounding, features ending with </s>, the teacher-forced loss over real target tokens only (and a tiny model
learning to copy), metrics of hand-made generations through an injected greedy decoder, options held to their
types, and target lengths held to learned positions."""
import json
import math
import random
from pathlib import Path

import pytest
import torch

from sesame.decoding import GenerationConfig
from sesame.errors import SesameError
from sesame.families import FAMILIES
from sesame.inputs import source_start
from sesame.metrics import bleu, regression_report
from sesame.models import TransformerConfig
from sesame.models.encoder_decoder import STYLES, EncoderDecoder, EncoderDecoderConfig
from sesame.tasks import infer, make_task
from sesame.seq2seq import generate_seq2seq
from sesame.tasks.casts import stsb_target
from sesame.tasks.text2text import Text2TextModel, generate
from sesame.tokenizer import train_tokenizer

from .conftest import sentences, shared_data

EXTRA = ["translate English to German:", "Ein Mann läuft. Eine Katze schläft.", "positive negative 0.0 1.2 3.8 5.0",
         "question: context: sentence: sentence1: sentence2: Denver Broncos"]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(80) + EXTRA, "bpe", vocab_size=400, min_frequency=1)


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def greedy(model: EncoderDecoder, ids: torch.Tensor, padding: torch.Tensor, *, eos: int,
           config: GenerationConfig) -> list[list[int]]:
    """A reference greedy decoder for these tests (uncached: the decoder reruns over all its inputs each step)."""
    memory = model.encode(ids, padding)
    out = torch.full((ids.shape[0], 1), model.config.decoder_start_id, device=ids.device)
    for _ in range(config.max_new_tokens):
        out = torch.cat([out, model.logits(model.decode(out, memory))[:, -1].argmax(-1, keepdim=True)], 1)
    return [row[: row.index(eos)] if eos in row else row for row in out[:, 1:].tolist()]


def tiny_model(tok, **fields) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = EncoderDecoderConfig(vocab_size=tok.vocab_size, hidden=32, layers=1, heads=2, intermediate=64,
                               max_positions=64, dropout=0.0, pad_id=tok.specials.pad,
                               decoder_start_id=tok.specials.pad, **{**STYLES["t5"], **fields})
    return EncoderDecoder(cfg)


def as_outputs(tok, texts: list[str]) -> torch.Tensor:
    """Generated ids as infer returns them (float rows padded with the pad id), made from ``texts``."""
    rows = [tok.encodings([t], special=False)[0].ids + [tok.specials.sep] for t in texts]
    width = max(map(len, rows)) + 2
    return torch.tensor([r + [tok.specials.pad] * (width - len(r)) for r in rows], dtype=torch.float)


# -- reading ---------------------------------------------------------------------------------------

def test_columns_are_read_as_t5s_inputs_for_every_cast(tmp_path):
    text = make_task("text2text", {"prefix": "translate English to German: "})
    [row] = text.read(write(tmp_path / "mt.csv", 'source,target\n"A man runs.","Ein Mann läuft."\n'))
    assert (row["source"], row["target"], row["gold"], row["line"]) == (
        "translate English to German: A man runs.", "Ein Mann läuft.", "Ein Mann läuft.", 2)
    sst2 = make_task("text2text", {"cast": "classify", "prefix": "sst2", "label_words": {"0": "negative",
                                                                                         "1": "positive"}})
    rows = sst2.read(write(tmp_path / "sst2.tsv", "sentence\tlabel\nit is great \t1\nit is dull \t0\n"))
    assert [(r["source"], r["target"]) for r in rows] == [("sst2 sentence: it is great", "positive"),
                                                          ("sst2 sentence: it is dull", "negative")]
    assert sst2.has_labels and sst2.labels(rows, "sst2.tsv") == ["negative", "positive"]
    rte = make_task("text2text", {"cast": "pair", "prefix": "rte"})
    [row] = rte.read(write(tmp_path / "rte.jsonl", json.dumps({"sentence1": "A cat.", "sentence2": "An animal.",
                                                               "label": "entailment"}) + "\n"))
    assert (row["source"], row["target"]) == ("rte sentence1: A cat. sentence2: An animal.", "entailment")
    stsb = make_task("text2text", {"cast": "regress", "prefix": "stsb"})
    [row] = stsb.read(write(tmp_path / "stsb.tsv", "sentence1\tsentence2\tscore\nA b.\tA c.\t3.770\n"))
    assert (row["source"], row["target"], row["gold"]) == ("stsb sentence1: A b. sentence2: A c.", "3.8", 3.77)
    assert not stsb.has_labels and stsb.select == "pearson"
    cola = make_task("text2text", {"cast": "classify", "prefix": "cola", "source_column": "3", "target_column": "1"})
    [row] = cola.read(write(tmp_path / "cola.tsv", "gj04\t1\t\tThe book fell.\n"))  # no header row, as GLUE's CoLA
    assert (row["source"], row["target"]) == ("cola sentence: The book fell.", "1")
    assert "target" not in text.read(str(tmp_path / "mt.csv"), labeled=False)[0]
    assert text.example("A cat.") == {"source": "translate English to German: A cat."}  # predict's stdin
    assert sst2.example("so good") == {"source": "sst2 sentence: so good"}
    with pytest.raises(SesameError, match="reads examples from a file"):
        rte.example("A cat.")


def test_squad_is_read_as_question_and_context_with_every_answer_gold(tmp_path):
    context = "The Denver Broncos won the game."
    data = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos", "answer_start": 4},
                                                         {"text": "The Denver Broncos", "answer_start": 0}]}]}]}]}
    task = make_task("text2text", {"cast": "span_qa"})
    [row] = task.read(write(tmp_path / "squad.json", json.dumps(data)))
    assert (row["source"], row["target"], row["gold"], row["id"]) == (
        f"question: Who won? context: {context}", "Denver Broncos", ["Denver Broncos", "The Denver Broncos"], "q1")
    data["data"][0]["paragraphs"][0]["qas"][0].update(answers=[], is_impossible=True)
    with pytest.raises(SesameError, match="question 'q1' has no answer"):
        make_task("text2text", {"cast": "span_qa"}).read(write(tmp_path / "v2.json", json.dumps(data)))


def test_parallel_files_pair_line_by_line(tmp_path):
    write(tmp_path / "train.en", "A man runs.\r\nA cat sleeps.\n")
    write(tmp_path / "train.de", "Ein Mann läuft.\nEine Katze schläft.\n")
    task = make_task("text2text", {"languages": "en-de", "prefix": "translate English to German:"})
    for given in ("train.en", "train"):  # the source file, or the files' stem
        rows = task.read(str(tmp_path / given))
        assert [(r["line"], r["source"], r["target"]) for r in rows] == [
            (1, "translate English to German: A man runs.", "Ein Mann läuft."),
            (2, "translate English to German: A cat sleeps.", "Eine Katze schläft.")]
    (tmp_path / "train.de").unlink()
    assert len(task.read(str(tmp_path / "train.en"), labeled=False)) == 2  # predicting reads the source alone


def test_multi30k_reads_as_parallel_files():
    root = shared_data()
    task = make_task("text2text", {"languages": "en-de", "prefix": "translate English to German:"})
    rows = task.read(str(root / "multi30k" / "val.en"))
    assert len(rows) == 1014
    assert rows[0]["source"] == "translate English to German: A group of men are loading cotton onto a truck"
    assert rows[0]["target"] == (root / "multi30k" / "val.de").read_text(encoding="utf-8").split("\n")[0]


@pytest.mark.parametrize("name, text, options, message", [
    ("t.csv", "source,target\nA b.,C d.\nE f.,\n", {}, r"t.csv:3: empty 'target' \(--task-option target_column\)"),
    ("t.csv", 'source,target\n" ",C d.\n', {}, r"t.csv:2: empty 'source' \(--task-option source_column\)"),
    ("t.tsv", "source\ttarget\nA\tB\tC\n", {}, r"t.tsv:2: 3 fields, but the header has 2"),
    ("t.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n", {"cast": "regress"},
     r"t.tsv:2: 'score' is 'high', not a finite number"),
    ("t.tsv", "sentence\tlabel\na\t2\n", {"cast": "classify", "label_words": {"0": "no", "1": "yes"}},
     r"t.tsv:2: label '2' has no word in label_words"),
])
def test_bad_rows_are_named_by_file_and_line(tmp_path, name, text, options, message):
    with pytest.raises(SesameError, match=message):
        make_task("text2text", options).read(write(tmp_path / name, text))


def test_bad_parallel_files_are_named_by_file_and_line(tmp_path):
    task = make_task("text2text", {"languages": "en-de"})
    write(tmp_path / "a.en", "One.\nTwo.\n")
    write(tmp_path / "a.de", "Eins.\n\n")
    with pytest.raises(SesameError, match=r"a.de:2: an empty target line; remove line 2 from both"):
        task.read(str(tmp_path / "a.en"))
    write(tmp_path / "a.de", "Eins.\n")
    with pytest.raises(SesameError, match=r"a.en has 2 lines but .*a.de has 1"):
        task.read(str(tmp_path / "a.en"))
    with pytest.raises(SesameError, match=r"b.en: no such file"):
        task.read(str(tmp_path / "b.en"))


@pytest.mark.parametrize("options, message", [
    ({"cast": "summary"}, "cast=summary: choose one of"),
    ({"languages": "en"}, "languages=en: the suffixes of parallel files"),
    ({"cast": "pair", "languages": "en-de"}, "with cast=text"),
    ({"label_words": {"0": "no"}}, "with cast=classify or pair"),
    ({"pair_column": "b"}, "cast=text reads one input"),
    ({"max_target_length": 1}, "max_target_length=1: a whole number of at least 2"),
    ({"beams": 0}, "beams=0: a whole number of at least 1"),
    ({"length_penalty": math.nan}, "length_penalty=nan: a number"),
    ({"length_penalty": "long"}, 'length_penalty="long" should be a float'),
    ({"bos": "tru"}, r'--task-option: bos="tru" should be a bool \(true or false\)'),
    ({"bos": 1}, "bos=1 should be a bool"),
    ({"max_target_length": "48"}, 'max_target_length="48" should be a int'),
    ({"beams": 2.0}, "beams=2.0 should be a int"),
    ({"label_words": ["negative", "positive"]}, 'label_words=\\["negative", "positive"\\] should be a dict'),
    ({"prefix": 3}, "prefix=3 should be a str"),
])
def test_bad_options_are_refused(options, message):
    """Every option is held to its type (make_task, whatever passes it: the command line, Python, a config.json),
    the error naming the option; then to the values the task takes."""
    with pytest.raises(SesameError, match=message):
        make_task("text2text", options)


def test_task_options_on_the_command_line_are_read_as_their_fields_types():
    """``--task-option KEY=VALUE``: a string option keeps its text as written (a numbered column stays "0"), the
    others read as JSON and typed, a misspelt bool named; a key no field has is read as JSON (make_task names it)."""
    from sesame.commands import key_values
    from sesame.tasks import TASKS

    options = key_values(["source_column=0", "max_target_length=48", "length_penalty=1", "bos=false", "prefix=true",
                          'label_words={"0": "no"}', "unknown=[1]"], "--task-option", "beams=4", TASKS["text2text"])
    assert options == {"source_column": "0", "max_target_length": 48, "length_penalty": 1.0, "bos": False,
                       "prefix": "true", "label_words": {"0": "no"}, "unknown": [1]}
    assert type(options["length_penalty"]) is float
    with pytest.raises(SesameError, match="--task-option: bos=tru should be a bool"):
        key_values(["bos=tru"], "--task-option", "beams=4", TASKS["text2text"])
    with pytest.raises(SesameError, match="unknown: not an option of --task text2text"):
        make_task("text2text", options)


@pytest.mark.parametrize("score, text", [(3.77, "3.8"), (0.1, "0.0"), (0.3, "0.4"), (4.9, "4.8"), (5.0, "5.0"),
                                         (2.0, "2.0"), (1.19, "1.2")])
def test_stsb_targets_round_to_the_nearest_fifth_half_to_even(score, text):
    assert stsb_target(score) == text  # round(5x)/5 as tf.round: 0.5 → 0, 1.5 → 2, 24.5 → 24


# -- features, loss, learning ----------------------------------------------------------------------

def test_features_end_with_the_end_token_within_their_lengths(tok):
    task = make_task("text2text", {"max_target_length": 4})
    examples = [{"source": "the cat runs over the river", "target": "the dog sleeps near a tree", "line": 2}]
    [feature] = task.features(examples, tok, 5, [], False)
    eos = tok.specials.sep
    assert feature["ids"] == tok.encodings([examples[0]["source"]], special=False)[0].ids[:4] + [eos]
    assert feature["target"] == tok.encodings([examples[0]["target"]], special=False)[0].ids[:3] + [eos]
    bart = make_task("text2text", {"bos": True, "max_target_length": 4})
    [feature] = bart.features(examples, tok, 5, [], False)
    assert feature["ids"][0] == feature["target"][0] == tok.specials.cls and feature["ids"][-1] == eos
    assert len(feature["ids"]) == 5 and len(feature["target"]) == 4
    with pytest.raises(SesameError, match="--max-length 1: leaves no room"):
        task.features(examples, tok, 1, [], False)


@pytest.mark.parametrize("family, given, bos", [("bart", None, True), ("t5", None, False), (None, None, False),
                                               ("bart", False, False), ("t5", True, True)])
def test_bos_follows_the_family_row_unless_given(family, given, bos, tok):
    """Not given, ``bos`` is the family's framing of inputs (BART's <s>, its row's source_start); given, it wins. Either
    way the options fine-tuning records hold it."""
    task = make_task("text2text", {"bos": given})
    task.for_family(FAMILIES[family] if family else None)
    assert task.options()["bos"] is bos
    [feature] = task.features([{"source": "the cat runs", "target": "a dog", "line": 2}], tok, 16, [], False)
    assert (feature["ids"][0] == tok.specials.cls) is bos and (feature["target"][0] == tok.specials.cls) is bos


def test_an_encoder_decoder_family_row_says_how_its_sources_start(tok):
    """The row holds the framing as an object that callers ask for the tokens (no flag read outside the registry):
    BART's sources open with <s>, T5's with the text; a recorded ``bos`` option gives the same objects back."""
    assert FAMILIES["bart"].source_start.tokens(tok.specials) == [tok.specials.cls]
    assert FAMILIES["t5"].source_start.tokens(tok.specials) == []
    assert FAMILIES["t5v1_1"].source_start.tokens(tok.specials) == []
    assert source_start(True) is FAMILIES["bart"].source_start and source_start(False) is FAMILIES["t5"].source_start


def test_the_loss_sums_over_real_target_tokens_only(tok, one_thread):
    task = make_task("text2text")
    examples = [{"source": "the cat runs", "target": "a dog", "line": 2},
                {"source": "the old bird sings over the green river", "target": "the small fish jumps slowly",
                 "line": 3}]
    features = task.features(examples, tok, 32, [], False)
    batch = task.collate(features, tok.specials.pad)
    assert batch["counts"] == {"loss": sum(len(f["target"]) for f in features)}
    assert batch["targets"][0, len(features[0]["target"]):].eq(tok.specials.pad).all()
    assert batch["eos"] == tok.specials.sep
    model = Text2TextModel(tiny_model(tok).eval(), decoding=GenerationConfig(max_new_tokens=8), generate=greedy)
    alone = sum(model(task.collate([f], tok.specials.pad)) for f in features)
    torch.testing.assert_close(model(batch), alone)  # padding adds nothing to the sum


def test_the_teacher_forced_loss_falls_on_a_toy_copy_task(tok, tmp_path, one_thread):
    rng = random.Random(0)
    words = "cat dog bird fish tree river stone cloud".split()
    rows = "".join(f"{t},{t}\n" for t in (" ".join(rng.choice(words) for _ in range(2)) for _ in range(64)))
    task = make_task("text2text")
    examples = task.read(write(tmp_path / "copy.csv", "source,target\n" + rows))
    batch = task.collate(task.features(examples, tok, 24, [], False), tok.specials.pad)
    model = Text2TextModel(tiny_model(tok), decoding=GenerationConfig(max_new_tokens=8), generate=greedy)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(15):
        loss = model(batch) / batch["counts"]["loss"]  # the trainer's mean over real target tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


# -- generation and metrics ------------------------------------------------------------------------

def test_outputs_come_from_the_generation_hook_and_are_scored(tok, tmp_path, one_thread):
    task = make_task("text2text", {"max_target_length": 6})
    examples = task.read(write(tmp_path / "d.csv", "source,target\nthe cat,the dog\na bird sings,a fish\n"))
    features = task.features(examples, tok, 16, [], False)
    model = Text2TextModel(tiny_model(tok).eval(), decoding=task.decoding(), generate=greedy)
    outputs = infer(model, task, features, tok.specials.pad)
    assert outputs.shape == (2, 6)
    batch = task.collate(features, tok.specials.pad)
    for row, generated in zip(outputs, greedy(model.backbone, batch["ids"], batch["padding"],
                                              eos=tok.specials.sep, config=task.decoding())):
        assert row[: len(generated)].long().tolist() == generated
        assert row[len(generated):].eq(tok.specials.pad).all()
    texts = task.texts(outputs)
    assert [p["output"] for p in task.predictions(examples, features, outputs, [])] == texts
    assert task.score(examples, features, outputs, [])["exact"] == sum(t == e["target"] for t, e in zip(
        texts, examples)) / 2


@pytest.mark.parametrize("options", [{}, {"beams": 3, "length_penalty": 0.6}])
def test_the_hook_decodes_each_row_as_generate_seq2seq_does_alone(tok, tmp_path, options, one_thread):
    """The wired hook: a padded batch's rows give generate_seq2seq's tokens for each source alone (padding changes
    nothing), decoded greedily or by the task's beam options, and the task model's outputs are those tokens."""
    task = make_task("text2text", {"max_target_length": 7, **options})
    examples = task.read(write(tmp_path / "d.csv", "source,target\nthe cat,x\na bird sings over the old river,y\n"
                                                   "dog,z\n"))
    features = task.features(examples, tok, 32, [], False)
    model = task.build(tiny_model(tok).eval(), 0, "mean", 0.0)
    assert (model.decoding.beams, model.decoding.length_penalty) == (options.get("beams", 1),
                                                                     options.get("length_penalty", 1.0))
    batch = task.collate(features, tok.specials.pad)
    assert not batch["padding"].all()  # the short rows are padded
    config = GenerationConfig(max_new_tokens=7, **options)
    alone = [generate_seq2seq(model.backbone, [f["ids"]], config, eos=tok.specials.sep)[0].tokens for f in features]
    assert generate(model.backbone, batch["ids"], batch["padding"], eos=tok.specials.sep, config=config) == alone
    assert any(alone)  # not all empty: the comparison has tokens to compare
    outputs = infer(model, task, features, tok.specials.pad).long()
    for row, tokens in zip(outputs.tolist(), alone):
        assert row == tokens + [tok.specials.pad] * (7 - len(tokens))


def test_translation_scores_bleu_as_t5_and_exact_match(tok):
    task = make_task("text2text")
    gold = ["Ein Mann läuft.", "Eine Katze schläft."]
    examples = [{"source": "x", "target": g, "gold": g} for g in gold]
    task.features(examples, tok, 8, [], False)
    perfect = task.score(examples, [], as_outputs(tok, gold), [])
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["exact"] == 1.0
    outputs = ["ein Mann läuft.", "Eine Katze schläft."]
    scored = task.score(examples, [], as_outputs(tok, outputs), [])
    assert scored["exact"] == 0.5
    assert scored["bleu"] == pytest.approx(bleu(outputs, gold, lowercase=False, tokenize="intl"))
    assert scored["bleu"] < 100.0  # cased, as T5 scores: "ein" is not "Ein"


def test_classes_parse_the_output_and_an_unknown_word_is_wrong(tok):
    task = make_task("text2text", {"cast": "classify"})
    gold = ["positive", "negative", "negative", "positive"]
    examples = [{"source": "x", "target": g, "gold": g} for g in gold]
    task.features(examples, tok, 8, ["negative", "positive"], False)
    report = task.score(examples, [], as_outputs(tok, ["positive", "negative", "Denver", "negative"]),
                        ["negative", "positive"])
    assert report["accuracy"] == 0.5 and report["invalid"] == 0.25
    assert report["per_class"]["negative"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5,
                                                             "support": 2})
    # the unparsable output is a miss of "negative", not a false positive of "positive"
    assert report["per_class"]["positive"]["precision"] == 1.0 and report["f1"] == pytest.approx(2 / 3)
    assert task.metrics(["negative", "positive"]) == ("accuracy", "macro_f1", "mcc", "f1")


def test_regression_reads_numbers_and_scores_an_unparsable_one_as_minus_one(tok):
    task = make_task("text2text", {"cast": "regress"})
    gold = [3.77, 1.0, 4.2, 0.4]
    examples = [{"source": "x", "target": stsb_target(g), "gold": g} for g in gold]
    task.features(examples, tok, 8, [], False)
    report = task.score(examples, [], as_outputs(tok, ["3.8", "1.2", "five", "0.0"]), [])
    expected = regression_report(gold, [3.8, 1.2, -1.0, 0.0])
    assert report["pearson"] == pytest.approx(expected["pearson"]) and report["invalid"] == 0.25
    assert report["spearman"] == pytest.approx(expected["spearman"])


def test_squad_answers_score_with_the_official_normalisation(tok):
    task = make_task("text2text", {"cast": "span_qa"})
    examples = [{"source": "x", "target": "Denver Broncos", "gold": ["Denver Broncos", "Broncos"], "id": "q1"},
                {"source": "y", "target": "the game", "gold": ["the game"], "id": "q2"}]
    task.features(examples, tok, 8, [], False)
    outputs = as_outputs(tok, ["the Denver Broncos", "a cat game"])
    report = task.score(examples, [], outputs, [])
    assert report["exact"] == 0.5 and report["f1"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert task.predictions(examples, [], outputs, []) == [{"id": "q1", "output": "the Denver Broncos"},
                                                          {"id": "q2", "output": "a cat game"}]


def test_only_an_encoder_decoder_serves_the_task(tok):
    task = make_task("text2text", {"max_target_length": 64})
    task.check_model(tiny_model(tok).config)
    with pytest.raises(SesameError, match="needs an encoder-decoder .* not a transformer model"):
        task.check_model(TransformerConfig(vocab_size=8))


def test_targets_longer_than_the_decoders_positions_are_refused(tok):
    """BART's decoder reads a learned table of max_positions (64 here), and generation holds T5's, whose relative
    position bias reads any length, to its max_positions too (GenerationConfig.check_room): a longer
    max_target_length is refused by the task's check_model, before a run directory is written, not at the first
    dev evaluation."""
    bart = EncoderDecoderConfig(vocab_size=tok.vocab_size, hidden=32, layers=1, heads=2, intermediate=64,
                                max_positions=64, pad_id=tok.specials.pad, **STYLES["bart"])
    t5 = tiny_model(tok).config
    for model in (bart, t5):
        make_task("text2text", {"max_target_length": 64}).check_model(model)
        with pytest.raises(SesameError, match="max_target_length=65 exceeds the model's 64 positions"):
            make_task("text2text", {"max_target_length": 65}).check_model(model)
