"""scripts/distil_table.py: how it splits the labeled examples from the transfer set and tables the rows."""
import csv
from pathlib import Path

import pytest

from tests.conftest import load_script

distil_table = load_script(Path(__file__).parents[1] / "scripts" / "distil_table.py", "distil_table")


def test_the_first_examples_keep_their_labels_and_the_rest_keep_only_their_text(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f'a "quoted" text {i}\t{i % 2}\n' for i in range(5)))
    labeled, unlabeled = distil_table.split(train, "sentence", 2, tmp_path / "data")
    assert labeled.read_text() == "sentence\tlabel\n" + 'a "quoted" text 0\t0\n' + 'a "quoted" text 1\t1\n'
    assert unlabeled.read_text() == "sentence\n" + "".join(f'a "quoted" text {i}\n' for i in (2, 3, 4))
    assert distil_table.split(train, "sentence", None, tmp_path / "all") == (train, train)


def test_a_csv_is_split_with_its_quoting(tmp_path):
    train = tmp_path / "train.csv"
    rows = [["text", "label"], ["one, two", "a"], ['say "hi"', "b"], ["three", "a"]]
    with open(train, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    labeled, unlabeled = distil_table.split(train, "text", 1, tmp_path / "data")
    assert list(csv.reader(open(labeled))) == rows[:2]
    assert list(csv.reader(open(unlabeled))) == [["text"], ['say "hi"'], ["three"]]


@pytest.mark.parametrize("labeled", [0, 3])
def test_a_split_that_leaves_a_side_empty_is_refused(tmp_path, labeled):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\na\t0\nb\t1\nc\t0\n")
    with pytest.raises(SystemExit, match=f"--labeled {labeled}: .* has 3 examples; give a number between 1 and 2"):
        distil_table.split(train, "sentence", labeled, tmp_path / "data")


def test_distil_cells_after_the_first_reuse_its_teacher_outputs():
    rows = [{"name": "teacher", "way": "teacher", "model": "out/teacher"},
            {"name": "tiny", "way": "finetune", "model": "out/tiny-finetune"}]
    distil, finetune = ["distil", "--teacher", "out/teacher"], ["finetune", "--from", "runs/tiny"]
    assert distil_table.scoring_once(distil, rows) == distil  # no distil cell finished: it scores
    rows += [{"name": "tiny", "way": "distil", "model": "out/tiny-distil"},
             {"name": "mini", "way": "distil", "model": "out/mini-distil"}]
    assert distil_table.scoring_once(distil, rows) == [*distil, "--teacher-outputs", "out/tiny-distil"]
    assert distil_table.scoring_once(finetune, rows) == finetune


def test_the_table_gives_latency_against_the_teacher():
    rows = [{"name": "teacher", "start": "minilm", "way": "teacher", "on": "2000 labels", "accuracy": 0.9,
             "parameters": 22_700_000, "latency_ms": 10.0, "minutes": 1.0},
            {"name": "mini", "start": "runs/mini", "way": "distil", "on": "the rest, unlabeled", "accuracy": 0.85,
             "parameters": 7_500_000, "latency_ms": 2.5, "minutes": 3.0}]
    lines = distil_table.table(rows).splitlines()
    assert lines[2] == "| teacher | minilm | teacher | 2000 labels | 0.9000 | 22.7M | 10.0 | 1.00× | 1.0 |"
    assert lines[3] == "| mini | runs/mini | distil | the rest, unlabeled | 0.8500 | 7.5M | 2.5 | 0.25× | 3.0 |"
