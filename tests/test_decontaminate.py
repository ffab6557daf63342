"""`sesame decontaminate`: GPT-3 style n-gram overlap (sesame/apps/decontaminate.py)."""
import json

import pytest

from sesame.cli import main
from sesame.apps.decontaminate import DecontaminateSpec, decontaminate, normalize, read_eval
from sesame.errors import SesameError

WORDS = [f"w{i}" for i in range(30)]


def sentence(words):
    return " ".join(words)


@pytest.fixture
def corpus(tmp_path):
    """Two text documents and a .jsonl of two records; only doc a.txt and record 2 hold w0..w12."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("intro\n" + sentence(WORDS[:6]) + "\n" + sentence(WORDS[6:13]) + " tail\n")
    (folder / "sub" / "b.txt").write_text(sentence(WORDS[17:29]) + "\n")
    (folder / "c.jsonl").write_text(json.dumps({"text": "nothing here"}) + "\n\n"
                                    + json.dumps({"text": sentence(WORDS[:13])}) + "\n")
    return folder


def evalset(tmp_path, rows):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tother\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
    return path


def test_normalize_lowercases_and_drops_punctuation():
    assert normalize("Well-known, DON'T  stop_it!\n") == ["well", "known", "don", "t", "stop", "it"]
    assert normalize("well @-@ known don 't") == ["well", "known", "don", "t"]


def test_a_shared_13_gram_is_flagged_and_12_words_are_not(corpus, tmp_path):
    dev = evalset(tmp_path, [
        ("X " + sentence(WORDS[:13]).upper() + ".", "a b"),      # 13-gram across a.txt's line break
        ("x " + sentence(WORDS[17:29]) + " y", "c d"),           # only 12 words shared with b.txt
        ("short one", sentence(WORDS[:13])),                     # the second field overlaps
        ("tiny", "pair")])                                        # shorter than n in every field
    report = decontaminate(DecontaminateSpec(corpus=[str(corpus)], evals=[f"{dev}:sentence,other"],
                                             progress=False))
    (r,) = report["eval"]
    assert (r["examples"], r["short"], r["overlapping"], r["percent"]) == (4, 1, 2, 50.0)
    assert [s["example"] for s in r["samples"]] == ["line 2", "line 4"]
    assert r["samples"][0]["ngram"] == sentence(WORDS[:13])
    assert report["documents"] == 4
    assert [d["document"] for d in report["documents_with_overlap"]] == [f"{corpus / 'a.txt'}",
                                                                         f"{corpus / 'c.jsonl'}:3"]
    spec = DecontaminateSpec(corpus=[str(corpus)], evals=[f"{dev}:sentence,other"], n=12, progress=False)
    assert decontaminate(spec)["eval"][0]["overlapping"] == 3


def test_out_corpus_drops_exactly_the_overlapping_documents(corpus, tmp_path):
    dev = evalset(tmp_path, [(sentence(WORDS[:13]), "a")])
    out = tmp_path / "clean"
    spec = DecontaminateSpec(corpus=[str(corpus)], evals=[f"{dev}:sentence"], out_corpus=str(out), progress=False)
    decontaminate(spec)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["c.jsonl", "sub/b.txt"]
    assert (out / "sub" / "b.txt").read_text() == (corpus / "sub" / "b.txt").read_text()
    assert (out / "c.jsonl").read_text() == json.dumps({"text": "nothing here"}) + "\n"
    with pytest.raises(SesameError, match="--out-corpus .*exists and holds other files"):
        decontaminate(spec)


def test_eval_readers(tmp_path):
    (tmp_path / "wiki.txt").write_text(" \n = Head = \n Some text here .\n")
    assert read_eval(str(tmp_path / "wiki.txt")).fields == [[" = Head = "], [" Some text here ."]]
    (tmp_path / "ner.txt").write_text("-DOCSTART- O\n\nEU B-ORG\nrejects O\n\nPeter B-PER\n")
    conll = read_eval(f"{tmp_path / 'ner.txt'}:conll")
    assert (conll.ids, conll.fields) == (["line 3", "line 6"], [["EU rejects"], ["Peter"]])
    (tmp_path / "squad.json").write_text(json.dumps({"data": [{"title": "T", "paragraphs": [
        {"context": "The context.", "qas": [{"id": "q1", "question": "Why?", "answers": []}]}]}]}))
    assert read_eval(str(tmp_path / "squad.json")).fields == [["Why?", "The context."]]
    with pytest.raises(SesameError, match="a SQuAD file is read whole"):
        read_eval(f"{tmp_path / 'squad.json'}:question")


@pytest.mark.parametrize("spec, message", [
    ("missing.tsv:sentence", "no such file"),
    ("dev.tsv", "name the text column"),
    ("dev.tsv:nope", "no column 'nope'"),
    ("dev.txt:conl", "not a supported evaluation set"),
])
def test_errors_name_the_flag(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    evalset(tmp_path, [("a", "b")])
    (tmp_path / "dev.txt").write_text("x\n")
    with pytest.raises(SesameError, match=message):
        read_eval(spec)
    with pytest.raises(SesameError, match="--n 0"):
        decontaminate(DecontaminateSpec(corpus=["dev.txt"], evals=["dev.txt"], n=0))


def test_cli_prints_one_json_object(corpus, tmp_path, capsys):
    dev = evalset(tmp_path, [(sentence(WORDS[:13]), "a")])
    assert main(["--no-progress", "decontaminate", "--corpus", str(corpus), "--eval", f"{dev}:sentence",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"n", "documents", "overlapping_documents", "documents_with_overlap", "eval"}
    assert set(report["eval"][0]) == {"eval", "examples", "short", "overlapping", "percent", "samples"}
    assert main(["--no-progress", "decontaminate", "--corpus", str(corpus), "--eval", f"{dev}:sentence"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("2 of 4 corpus documents share a 13-gram") and "  1       0        1  100.00  " in text
    assert main(["--no-progress", "decontaminate", "--corpus", str(corpus), "--eval", f"{dev}:nope"]) == 2
    assert "no column 'nope'" in capsys.readouterr().err
