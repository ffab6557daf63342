"""The output rule (sesame/outputs.py): a command writes a directory only when it is new, empty or its own kind,
and a file only where none is, never over its own input; each harm it prevents has its own test."""
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from sesame.cli import main
from sesame.errors import SesameError
from sesame.outputs import (MARKER, check_dir, claim_dir, directory_kind, held, new_file, only_run_files,
                            publish_dir)
from sesame.run import SETTING_UP

from .conftest import NO_UNWRITABLE, onnxruntime_or_skip, refused, snapshot

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


@contextmanager
def held_elsewhere(path: Path):
    """``path`` locked as another sesame command holds its output (sesame.outputs.hold): an exclusive ``flock`` of an
    open file of its own, which conflicts with any other open's, in this process too."""
    fcntl = pytest.importorskip("fcntl", reason="outputs are locked where fcntl is (Linux, macOS)")
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield
    finally:
        os.close(fd)


def test_a_run_a_live_command_is_setting_up_is_refused_not_cleared(tiny_runs, tmp_path, capsys):
    """Issue 37: a second `pretrain` to the same --out 0.5 s after the first took the first's .setting-up.tmp for a
    killed setup and deleted its live run. While its owner holds it, it is refused and left as it is, with or without
    --resume; once the owner is gone, the same command clears it and sets up its own run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / SETTING_UP).touch()
    (run / "tokenizer.json").write_text("{}")  # what the live setup has written so far
    argv = ["pretrain", "--family", "bert", "--size", "tiny", "--corpus", str(tiny_runs / "corpus.txt"),
            "--vocab-size", "200", "--seq-len", "32", "--max-steps", "1", "--batch-size", "8", "--out", str(run)]
    with held_elsewhere(run):
        for resume in ([], ["--resume"]):
            refused(argv + resume, capsys, tmp_path, f"--out {run}: another sesame command is writing there")
    assert main(["--no-progress", *argv]) == 0
    assert (run / "checkpoint").is_dir() and not (run / SETTING_UP).exists()


def test_an_export_into_a_folder_another_command_holds_is_refused(tiny_runs, tmp_path, capsys):
    """Two exports to one --out both said "wrote" and the folder held one of them: the second is refused."""
    onnxruntime_or_skip()
    out = tmp_path / "export"
    out.mkdir()
    with held_elsewhere(out):
        refused(["export", "--model", str(tiny_runs / "clf"), "--out", str(out)], capsys, tmp_path,
                f"--out {out}: another sesame command")
    assert not any(out.iterdir())


def test_a_folder_or_file_another_command_holds_is_refused_and_left_as_it_is(tmp_path):
    """compare, ulmfit, demo, convert and export claim a folder, the commands writing files the file (by its
    .NAME.lock): held by another, it is refused before anything is written, and free once let go."""
    folder = tmp_path / "compare"
    folder.mkdir()
    with held_elsewhere(folder), pytest.raises(SesameError, match="--out .*compare: another sesame command"):
        claim_dir(folder, "--out", "compare")
    assert not any(folder.iterdir())  # no marker
    lock = tmp_path / ".page.html.lock"
    lock.touch()
    with held_elsewhere(lock), pytest.raises(SesameError, match="--out .*page.html: another sesame command"):
        new_file(tmp_path / "page.html", "--out")
    with held():
        assert claim_dir(folder, "--out", "compare") is False and new_file(tmp_path / "page.html", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare"]  # the lock file went with its lock


def test_what_a_killed_command_held_is_free_and_its_lock_file_taken_over(tiny_runs, tmp_path, capsys):
    """The lock is the process's: the system drops it when the process is killed, so the next command takes the
    output (and removes the lock file the killed one left) without anyone deciding by the clock."""
    pytest.importorskip("fcntl", reason="outputs are locked where fcntl is (Linux, macOS)")
    out = tmp_path / "tok.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from sesame.outputs import hold; hold(sys.argv[1], '--out'); "
                               "print('held', flush=True); sys.stdin.read()", str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert holder.stdout.readline() == "held\n"
        argv = ["tokenizer", "train", "--corpus", str(tiny_runs / "corpus.txt"), "--vocab-size", "100", "--out",
                str(out)]
        refused(argv, capsys, tmp_path, f"--out {out}: another sesame command")
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / ".tok.json.lock").exists()  # left by the killed command, nobody's now
    assert main(["--no-progress", *argv]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok.json"]


def test_a_folder_published_whole_claims_its_name_by_the_rename(tmp_path):
    """Shards and a decontaminated corpus are written beside their name and renamed into place: into a new or empty
    folder; one another command filled meanwhile is refused, and what it holds stays."""
    def finished(name: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "meta.json").write_text(name)
        return folder

    out = tmp_path / "shards"
    publish_dir(finished(".first.tmp"), out, "--out")
    second = finished(".second.tmp")
    with pytest.raises(SesameError, match="--out .*shards: another command wrote there meanwhile"):
        publish_dir(second, out, "--out")
    assert (out / "meta.json").read_text() == ".first.tmp" and second.is_dir()  # the caller removes its own


def test_predict_into_a_folder_it_cannot_write_stops_before_predicting(tiny_runs, unwritable, capsys):
    """predict printed every prediction and then failed with a traceback writing --output: now one line first."""
    if unwritable is None:
        pytest.skip(NO_UNWRITABLE)
    out = unwritable / "predictions.jsonl"
    capsys.readouterr()
    assert main(["--no-progress", "predict", "--model", str(tiny_runs / "clf"), "--input", str(tiny_runs / "dev.csv"),
                 "--output", str(out)]) == 2
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert printed.out == "" and len(lines) == 1 and f"--output {out}: cannot write there" in lines[0], printed
    assert not out.exists()


def test_report_into_a_folder_it_cannot_write_is_one_line(tiny_runs, unwritable, capsys):
    if unwritable is None:
        pytest.skip(NO_UNWRITABLE)
    refused(["report", str(tiny_runs / "pre"), "--out", str(unwritable / "page.html")], capsys, tiny_runs,
            f"--out {unwritable / 'page.html'}: cannot write there")
