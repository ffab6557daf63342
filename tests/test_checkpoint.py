"""Weights, JSON and checkpoint files: written whole (flushed before the rename, the directory after) with the
permissions the umask gives; what a killed save leaves is removed on the next start; a damaged file is an error
that names it and the fix."""
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from sesame.cli import main
from sesame.errors import SesameError
from sesame.train.checkpoint import (checkpoint_dir, load_weights, remove_leftovers, save_checkpoint, save_weights,
                                     write_json)

FIXTURES = Path(__file__).parent / "fixtures"


def checkpoint(run: Path, step: int = 1) -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])
    weight.sum().backward()
    optimizer.step()
    save_checkpoint(run, {"w": weight}, optimizer, {"step": step})


def test_files_get_the_permissions_the_umask_gives(tmp_path):
    """safetensors replaces the file it is given, so weights came out owner-only (0600) whatever the umask."""
    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        run = tmp_path / oct(umask)
        run.mkdir()
        old = os.umask(umask)
        try:
            save_weights(run / "model.safetensors", {"w": torch.ones(2)})
            write_json(run / "config.json", {})
            checkpoint(run)
        finally:
            os.umask(old)
        files = [run / "model.safetensors", run / "config.json", *(run / "checkpoint").iterdir()]
        assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == dict.fromkeys((f.name for f in files), mode)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_data_is_flushed_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(a), str(b))) or replace(a, b))

    save_weights(tmp_path / "model.safetensors", {"w": torch.ones(2)})
    temporary = events[1][1]
    assert events == [("fsync", temporary), ("replace", temporary, str(tmp_path / "model.safetensors")),
                      ("fsync", str(tmp_path))]

    events.clear()
    checkpoint(tmp_path)
    swap = next(i for i, e in enumerate(events) if e[0] == "replace" and e[2] == str(tmp_path / "checkpoint"))
    assert events[swap - 1] == ("fsync", events[swap][1])  # the folder built beside, with its four files
    assert events[swap + 1] == ("fsync", str(tmp_path))
    assert sum(e[0] == "replace" for e in events[:swap]) == 4  # each file flushed and renamed inside it first


def test_leftovers_of_killed_saves_are_removed_on_the_next_start(tmp_path):
    checkpoint(tmp_path, step=2)
    # what kills during saves leave: a half-built checkpoint, one named as before the .tmp suffix, a half-written
    # weights file, and the previous checkpoint when the kill came between the swap and its removal
    (tmp_path / ".checkpoint.abc123.tmp").mkdir()
    (tmp_path / ".checkpoint.abc123.tmp" / "model.safetensors").write_bytes(bytes(1000))
    (tmp_path / ".checkpoint.k2j3x9").mkdir()
    (tmp_path / ".model.safetensors.x1y2.tmp").write_bytes(bytes(10))
    shutil.copytree(tmp_path / "checkpoint", tmp_path / ".checkpoint.old")
    (tmp_path / "metrics.jsonl").write_text("")
    remove_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.jsonl"]

    os.replace(tmp_path / "checkpoint", tmp_path / ".checkpoint.old")  # a kill between the two renames
    remove_leftovers(tmp_path)
    assert checkpoint_dir(tmp_path) == tmp_path / ".checkpoint.old"  # the only whole checkpoint stays


def test_a_truncated_weights_file_is_an_error_naming_it_and_the_fix(tmp_path):
    path = tmp_path / "model.safetensors"
    save_weights(path, {"w": torch.ones(100)})
    data = path.read_bytes()
    for cut in (0, 8, 100, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(SesameError, match="model.safetensors: not a whole safetensors file .* cut short or "
                                              "damaged, so copy it again or run the command that wrote it again"):
            load_weights(path)


def test_every_command_reading_a_truncated_run_says_so_in_one_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES / "runs", runs)
    for run in ("pretrained", "classifier"):
        weights = runs / run / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
    data = str(FIXTURES / "data")
    tiny = ["--family", "gpt", "--size", "tiny", "--vocab-size", "300", "--seq-len", "16", "--batch-size", "4"]
    commands = {
        "evaluate": ["evaluate", "--model", f"{runs}/classifier", "--data", f"{data}/dev.csv"],
        "predict": ["predict", "--model", f"{runs}/classifier", "--input", f"{data}/dev.csv"],
        "convert": ["convert", "--to-hf", f"{runs}/classifier", "--out", f"{tmp_path}/hf"],
        "finetune --from": ["finetune", "--from", f"{runs}/pretrained", "--train", f"{data}/train.csv", "--dev",
                            f"{data}/dev.csv", "--out", f"{tmp_path}/tuned", "--max-steps", "1"],
        "pretrain --resume": ["pretrain", "--corpus", f"{data}/eval.txt", "--out", f"{tmp_path}/pre", "--resume",
                              *tiny, "--max-steps", "3"],
    }
    assert main(["--no-progress", "pretrain", "--corpus", f"{data}/eval.txt", "--out", f"{tmp_path}/pre", *tiny,
                 "--max-steps", "2"]) == 0  # a run to resume, whose checkpoint is then cut short
    weights = tmp_path / "pre" / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    for name, argv in commands.items():
        capsys.readouterr()
        assert main(["--no-progress", *argv]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "model.safetensors: not a whole safetensors file" in err, (name, err)
