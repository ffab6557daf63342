"""The readers of user files refuse what they cannot read faithfully, naming file, line and the fix."""
import csv
import io
import sys
from pathlib import Path

import pytest

from sesame.cli import main
from sesame.data.labeled import decode, read_columns, read_rows
from sesame.errors import SesameError
from sesame.tasks import make_task


@pytest.mark.parametrize("name, text, message", [
    ("more.csv", "text,label\ngreat flight,positive\nlate again, friendly staff,negative\n",
     r"more\.csv:3: 3 fields, but the header has 2; quote a field that holds a comma"),
    ("fewer.csv", "text,label\ngreat flight\nlate again,negative\n", r"fewer\.csv:2: 1 field, but the header has 2"),
    ("more.tsv", "text\tlabel\ngood\tpositive\textra\n", r"more\.tsv:2: 3 fields, .* must not hold a tab"),
    ("fewer.tsv", "0\t1\t2\nA sentence.\t1\n", r"fewer\.tsv:2: 2 fields, but the first row has 3"),
    ("open-quote.csv", 'text,label\n"never closed,positive\nfine,negative\n', r"open-quote\.csv:2: not valid CSV"),
    ("after-quote.csv", 'text,label\n"quoted"then,positive\n', r"after-quote\.csv:2: not valid CSV"),
    ("twice.csv", "text,text\na,b\n", r"twice\.csv:1: the header names 'text' more than once"),
    ("blank.csv", '""\n\n', r"blank\.csv: no rows"),
])
def test_rows_the_csv_module_would_cut_or_merge_are_refused(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(SesameError, match=message):
        read_rows(tmp_path / name, header=name != "fewer.tsv")


def test_rows_begin_on_their_own_line_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('text,label\n\n"two\nlines",a\nthird,b\n\n')
    assert read_rows(path) == [(3, {"text": "two\nlines", "label": "a"}), (5, {"text": "third", "label": "b"})]


def test_a_field_longer_than_the_csv_modules_limit_is_read(tmp_path):
    long = "word " * (csv.field_size_limit() // 4)
    for name, text in (("long.csv", f'text,label\n"{long}",a\n'), ("long.tsv", f"text\tlabel\n{long}\ta\n")):
        (tmp_path / name).write_text(text)
        assert read_columns(tmp_path / name, "text", "label") == ([long], ["a"])
    assert csv.field_size_limit() < len(long)  # raised only while reading


def test_jsonl_null_is_an_empty_value_not_the_text_null(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "fine", "label": 1}\n{"text": "no label", "label": null}\n')
    assert read_rows(path)[1][1]["label"] is None
    with pytest.raises(SesameError, match=r"rows\.jsonl:2: empty 'label'"):
        read_columns(path, "text", "label")


@pytest.mark.parametrize("target", ["nan", "NaN", "inf", "-Infinity", "1e999"])
def test_regression_refuses_targets_that_are_not_finite(tmp_path, target):
    path = tmp_path / "sts.tsv"
    path.write_text(f"text\tlabel\nTwo dogs.\t3.5\nA cat.\t{target}\n")
    with pytest.raises(SesameError, match=rf"sts\.tsv:3: 'label' is '{target}', not a finite number"):
        make_task("regress", {}).read(str(path))


def test_invalid_utf8_names_the_line_and_byte_and_says_how_to_re_encode():
    raw = "first\nsecond caf\xe9\n".encode("latin-1")
    with pytest.raises(SesameError, match=r"^stdin:2: not valid UTF-8 \(byte 0xe9, the line's byte 11\); "
                                          r"re-encode it as UTF-8, e.g. `iconv"):
        decode(raw, "stdin")
    with pytest.raises(SesameError, match=r"the line's byte 6\)"):  # a BOM counts as bytes of the first line
        decode(b"\xef\xbb\xbfab\xff", "f.txt")
    assert decode("\ufeffcafé".encode(), "f.txt") == "café"


LATIN1 = "fine\ncaf\xe9 au lait\n".encode("latin-1")
CLASSIFIER = Path(__file__).parent / "fixtures" / "runs" / "classifier"


@pytest.mark.parametrize("argv, message", [
    (["predict", "--model", str(CLASSIFIER)], "stdin:2: not valid UTF-8"),
    (["generate", "--model", "nowhere", "--prompts", "-"], "stdin:2: not valid UTF-8"),
    (["generate", "--model", "nowhere", "--prompts", "{bad}"], "bad.txt:2: not valid UTF-8"),
    (["pretrain", "--corpus", "{bad}", "--out", "{tmp}/run", "--masking", "phrase", "--phrases", "{bad}"],
     "bad.txt:2: not valid UTF-8"),
    (["finetune", "--from", "scratch:bert:tiny", "--task", "span_qa", "--train", "{bad}", "--dev", "{bad}",
      "--out", "{tmp}/run"], "bad.txt:2: not valid UTF-8"),
])
def test_commands_name_input_that_is_not_utf8(tmp_path, monkeypatch, capsys, argv, message):
    (tmp_path / "bad.txt").write_bytes(LATIN1)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LATIN1)))
    argv = [a.format(bad=tmp_path / "bad.txt", tmp=tmp_path) for a in argv]
    assert main(["--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "re-encode it as UTF-8" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_generate_refuses_an_empty_prompt(capsys):
    assert main(["generate", "--model", "nowhere", "--prompt", "a cat", "--prompt", ""]) == 2
    assert "--prompt '': an empty prompt gives the model nothing to continue" in capsys.readouterr().err


def test_a_text_file_gives_a_single_text_task_one_text_per_line(tmp_path):
    """Plain text, as `pretrain --corpus` reads it: one text per non-blank line, any newline convention; a task that
    reads labels or a second text refuses it, naming the file and the flag."""
    path = tmp_path / "texts.txt"
    path.write_bytes(b"First text, with a comma.\r\n\r\n  \nSecond text\n")
    expected = [{"text": "First text, with a comma.", "line": 1}, {"text": "Second text", "line": 4}]
    assert make_task("classify").read(str(path), labeled=False) == expected
    assert make_task("regress").read(str(path), labeled=False) == expected
    with pytest.raises(SesameError, match=r"texts\.txt: a text file holds one text per line .* --label-column"):
        make_task("classify").read(str(path))
    with pytest.raises(SesameError, match=r"texts\.txt: a text file .* --pair-column \(sentence2\) asks for a second"):
        make_task("pair").read(str(path), labeled=False)


@pytest.mark.parametrize("label, kind", [('{"a": 1}', "object"), ("[1, 2]", "list")])
def test_a_jsonl_label_that_is_an_object_or_a_list_is_refused(tmp_path, label, kind):
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"text": "fine", "label": "a"}}\n{{"text": "odd", "label": {label}}}\n')
    with pytest.raises(SesameError, match=rf"rows\.jsonl:2: 'label' \(--label-column\) is a JSON {kind}"):
        make_task("classify").read(str(path))
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": "fine", "label": 1}\n{"text": "odd", "label": true}\n')
    assert [row["label"] for row in make_task("classify").read(str(numbers))] == ["1", "true"]


@pytest.mark.parametrize("label", ["nan", "NaN", "-nan"])
def test_a_label_that_spells_nan_is_a_missing_value_not_a_class(tmp_path, label):
    """pandas writes a missing value as "nan" (``astype(str)``): a class of that name would be scored as one."""
    path = tmp_path / "rows.csv"
    path.write_text(f"text,label\nfine,positive\nodd,{label}\nbad,negative\n")
    with pytest.raises(SesameError, match=rf"rows\.csv:3: 'label' is '{label}', .* \(NaN\); fill it in or remove"):
        make_task("classify").read(str(path))
    assert make_task("classify").read(str(path), labeled=False)[1]["text"] == "odd"  # texts are not labels


@pytest.mark.parametrize("name", ["data", "data.csv"])
def test_a_folder_named_where_a_file_is_expected_says_so(tmp_path, name):
    (tmp_path / name).mkdir()
    with pytest.raises(SesameError, match=rf"{name} is a folder; give a CSV, TSV or JSONL file"):
        make_task("classify").read(str(tmp_path / name))
