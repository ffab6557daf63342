"""The output rule (sesame/outputs.py): a command writes a directory only when it is new, empty or its own kind,
and a file only where none is, never over its own input; each harm it prevents has its own test."""
import json
import shutil

import pytest

from sesame.errors import SesameError
from sesame.outputs import MARKER, check_dir, claim_dir, directory_kind, new_file, only_run_files

from .conftest import refused, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tokenizer_train_never_replaces_a_runs_tokenizer(tiny_runs, capsys):
    corpus = str(tiny_runs / "other.txt")
    for out in (tiny_runs / "pre", tiny_runs / "pre" / "tokenizer.json"):
        refused(["tokenizer", "train", "--corpus", corpus, "--vocab-size", "100", "--out", str(out)], capsys,
                tiny_runs, "--out", "pre/tokenizer.json: exists")


def test_prepare_never_replaces_the_shards_a_run_trains_on(tiny_runs, capsys):
    shards = tiny_runs / "pre" / "shards"
    assert json.loads((tiny_runs / "pre" / "config.json").read_text())["shards"] == str(shards.resolve())
    refused(["prepare", "--corpus", str(tiny_runs / "other.txt"), "--tokenizer", str(tiny_runs / "pre"),
             "--out", str(shards)], capsys, tiny_runs, "--out", "holds token shards")
    # the same inputs and tokenizer: the shards are reused, not rewritten
    before = snapshot(tiny_runs)
    from sesame.cli import main
    assert main(["--no-progress", "prepare", "--corpus", str(tiny_runs / "corpus.txt"), "--tokenizer",
                 str(tiny_runs / "pre"), "--out", str(shards)]) == 0
    assert snapshot(tiny_runs) == before


def test_prepare_writes_only_into_a_new_or_empty_folder(tiny_runs, tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my notes\n")
    for out, says in ((tiny_runs / "pre", "holds a pretrained run"), (tmp_path / "mine", "holds other files"),
                      (tmp_path / "mine" / "notes.txt", "is a file")):
        refused(["prepare", "--corpus", str(tiny_runs / "corpus.txt"), "--tokenizer", str(tiny_runs / "pre"),
                 "--out", str(out)], capsys, tiny_runs.parent, "--out", says)


def compare_args(tiny_runs, tmp_path, out):
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"name": "animals", "train": str(tiny_runs / "train.csv"),
                                "dev": str(tiny_runs / "dev.csv")}))
    return ["compare", "--approaches", "bert:tiny", "--corpus", str(tiny_runs / "corpus.txt"), "--tasks", str(task),
            "--minutes", "1", "--max-steps", "1", "--out", str(out)]


def test_compare_claims_only_an_empty_or_compare_folder(tiny_runs, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    refused(compare_args(tiny_runs, tmp_path, mine), capsys, tmp_path, "--out", "mine", "holds other files")
    refused(compare_args(tiny_runs, tmp_path, tiny_runs / "clf"), capsys, tiny_runs, "--out", "a fine-tuned run")


def test_compare_never_deletes_files_it_did_not_write_in_a_cell(tiny_runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    claim_dir(out, "--out", "compare")
    cell = out / "pretrain" / "bert-tiny"
    cell.mkdir(parents=True)
    (cell / "notes.txt").write_text("mine\n")
    refused(compare_args(tiny_runs, tmp_path, out), capsys, tmp_path, "bert-tiny", "sesame did not write")


def test_no_command_writes_over_its_own_input(tiny_runs, tmp_path, capsys):
    data = tmp_path / "dev.csv"
    shutil.copy(tiny_runs / "dev.csv", data)
    text = tmp_path / "corpus.txt"
    shutil.copy(tiny_runs / "corpus.txt", text)
    cases = [
        (["predict", "--model", str(tiny_runs / "clf"), "--input", str(data), "--output", str(data)],
         ("--output", "is also --input")),
        (["tokenizer", "train", "--corpus", str(text), "--out", str(text)], ("--out", "is also --corpus")),
        (["vectors", "train", "--corpus", str(text), "--out", str(text)], ("--out", "is also --corpus")),
        (["translate", "--model", str(tiny_runs / "pre"), "--input", str(text), "--output", str(text)],
         ("--output", "is also --input")),
        (["decontaminate", "--corpus", str(tmp_path), "--eval", str(data), "--out-corpus", str(tmp_path)],
         ("--out-corpus", "holds other files")),  # the corpus's own folder
    ]
    for argv, expected in cases:
        refused(argv, capsys, tmp_path, *expected)


def test_an_output_whose_parent_is_a_file_is_one_line(tiny_runs, tmp_path, capsys):
    afile = tmp_path / "afile.txt"
    afile.write_text("x\n")
    corpus = str(tiny_runs / "corpus.txt")
    for argv in (["predict", "--model", str(tiny_runs / "clf"), "--input", str(tiny_runs / "dev.csv"), "--output"],
                 ["tokenizer", "train", "--corpus", corpus, "--out"],
                 ["prepare", "--corpus", corpus, "--tokenizer", str(tiny_runs / "pre"), "--out"],
                 ["pretrain", "--corpus", corpus, "--max-steps", "1", "--out"],
                 ["convert", "--to-hf", str(tiny_runs / "pre"), "--out"]):
        refused([*argv, str(afile / "deeper" / "out")], capsys, tmp_path, "afile.txt is a file, not a folder")


def test_a_missing_parent_folder_is_created(tiny_runs, tmp_path):
    from sesame.cli import main

    out = tmp_path / "new" / "folder" / "tok.json"
    assert main(["--no-progress", "tokenizer", "train", "--corpus", str(tiny_runs / "corpus.txt"), "--vocab-size",
                 "100", "--out", str(out)]) == 0
    assert out.is_file()


def test_directory_kinds_and_the_marker(tiny_runs, tmp_path):
    assert directory_kind(tiny_runs / "pre") == "pretrained" and directory_kind(tiny_runs / "clf") == "finetuned"
    assert directory_kind(tiny_runs / "pre" / "shards") == "shards" and directory_kind(tmp_path) is None
    assert claim_dir(tmp_path / "c", "--out", "compare") is False
    assert json.loads((tmp_path / "c" / MARKER).read_text())["kind"] == "compare"
    assert claim_dir(tmp_path / "c", "--out", "compare") is True  # continued
    with pytest.raises(SesameError, match="holds a compare folder"):
        check_dir(tmp_path / "c", "--out", "ulmfit")
    legacy = tmp_path / "old"  # a compare folder written before the marker: known by its cells' records
    (legacy / "airline" / "tfidf").mkdir(parents=True)
    (legacy / "airline" / "tfidf" / "compare.json").write_text("{}")
    assert check_dir(legacy, "--out", "compare") is True


def test_only_what_a_run_writes_counts_as_an_unfinished_run(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / ".checkpoint.x1y2").mkdir()
    assert only_run_files(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    assert not only_run_files(tmp_path)


def test_new_file_refuses_inputs_existing_files_and_folders(tmp_path):
    (tmp_path / "in.txt").write_text("x\n")
    with pytest.raises(SesameError, match="--output .*in.txt: is also --input"):
        new_file(tmp_path / "sub" / ".." / "in.txt", "--output", {"--input": str(tmp_path / "in.txt")})
    with pytest.raises(SesameError, match="exists"):
        new_file(tmp_path / "in.txt", "--output")
    with pytest.raises(SesameError, match="is a folder"):
        new_file(tmp_path, "--output")
    assert new_file(tmp_path / "a" / "b.txt", "--output") == tmp_path / "a" / "b.txt"
    assert (tmp_path / "a").is_dir() and not (tmp_path / "a" / "b.txt").exists()
