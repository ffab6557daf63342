"""--resume continues a run as it was made (sesame/resume.py): it refuses an option that contradicts the run,
naming the flag, the value given and the run's; it changes only the budget, and records it in config.json."""
import json
import shutil

import pytest

from sesame.cli import main
from sesame.resume import RESUMABLE, resolved

from .conftest import refused, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")


def pretrain_resume(root, *extra, out=None):
    return ["pretrain", "--resume", "--corpus", str(root / "corpus.txt"), "--out", str(out or root / "pre"), *extra]


def finetune_resume(root, *extra, out=None):
    return ["finetune", "--resume", "--from", str(root / "pre"), "--train", str(root / "train.csv"), "--dev",
            str(root / "dev.csv"), "--out", str(out or root / "clf"), *extra]


@pytest.mark.parametrize("flag, value, made_with", [
    ("--family", "gpt", "bert"), ("--size", "mini", "tiny"), ("--lr", "0.01", "0.001"), ("--seq-len", "64", "32"),
    ("--batch-size", "16", "8"), ("--vocab-size", "300", "200"), ("--masking", "whole_word", "objective's default"),
    ("--corpus", "other.txt", "corpus.txt")])
def test_pretrain_resume_refuses_what_contradicts_the_run(tiny_runs, capsys, flag, value, made_with):
    argv = pretrain_resume(tiny_runs, flag, str(tiny_runs / value) if flag == "--corpus" else value)
    refused(argv, capsys, tiny_runs, f"{flag} ", value, "was made with", made_with)


def test_pretrain_resume_refuses_a_model_option_the_run_was_not_made_with(tiny_runs, capsys):
    refused(pretrain_resume(tiny_runs, "--model-option", "norm=pre"), capsys, tiny_runs,
            "--model-option norm pre: the run in", "was made with post")


@pytest.mark.parametrize("flag, value, made_with", [
    ("--task", "regress", "classify"), ("--task", "pair", "classify"), ("--max-length", "64", "32"),
    ("--lr", "0.1", "0.0003"), ("--text-column", "sentence", "text"), ("--select", "macro_f1", "accuracy"),
    ("--dropout", "0.3", "0.1"), ("--gradual-unfreezing", None, "False"), ("--train", "dev.csv", "train.csv"),
    ("--reinit-layers", "1", "0"), ("--from", "clf", "pre")])
def test_finetune_resume_refuses_what_contradicts_the_run(tiny_runs, capsys, flag, value, made_with):
    argv = finetune_resume(tiny_runs)
    if flag in ("--train", "--from"):
        argv[argv.index(flag) + 1] = str(tiny_runs / value)
    else:
        argv += [flag] + ([value] if value else [])
    refused(argv, capsys, tiny_runs, f"{flag} ", "was made with", made_with)


def test_paths_are_recorded_absolute_and_names_of_no_file_as_given(tmp_path, monkeypatch):
    """A recorded path is absolute, so a run started elsewhere compares equal; ``minilm`` and ``scratch:...`` name no
    file and stay as given (a distil record once held ``<cwd>/minilm``)."""
    monkeypatch.chdir(tmp_path)
    assert resolved("runs/teacher") == str(tmp_path / "runs" / "teacher")
    assert resolved(["a", "b/c"]) == [str(tmp_path / "a"), str(tmp_path / "b" / "c")]
    assert [resolved(v) for v in ("minilm", "scratch:bert:mini", None, 3)] == ["minilm", "scratch:bert:mini", None, 3]


def test_the_budget_is_all_resume_may_change():
    assert RESUMABLE == ("max_steps", "max_minutes", "epochs")


def test_pretrain_resume_extends_the_budget_keeps_the_rest_and_records_it(tiny_runs, tmp_path):
    run = shutil.copytree(tiny_runs / "pre", tmp_path / "pre")  # still trains on tiny_runs/pre/shards, read only
    config = json.loads((run / "config.json").read_text())
    assert main(["--no-progress", *pretrain_resume(tiny_runs, "--max-steps", "4", out=run)]) == 0
    after = json.loads((run / "config.json").read_text())
    state = json.loads((run / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 4 and after["train"]["max_steps"] == 4 == state["config"]["max_steps"]
    # --lr was not given: the run's own 1e-3 goes on, not pre-training's default
    assert after["train"] == {**config["train"], "max_steps": 4} and after["train"]["lr"] == 1e-3


def test_finetune_resume_extends_the_epochs_and_records_them(tiny_runs, tmp_path):
    run = shutil.copytree(tiny_runs / "clf", tmp_path / "clf")
    config = json.loads((run / "config.json").read_text())
    first = json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"]
    assert config["epochs"] == 1 and config["train"]["max_steps"] == first  # config.json records the real budget
    assert main(["--no-progress", *finetune_resume(tiny_runs, "--epochs", "2", out=run)]) == 0
    after = json.loads((run / "config.json").read_text())
    state = json.loads((run / "checkpoint" / "trainer_state.json").read_text())
    assert after["epochs"] == 2 and state["step"] == after["train"]["max_steps"] == 2 * first
    assert {k: v for k, v in after["train"].items() if k != "max_steps"} == \
        {k: v for k, v in config["train"].items() if k != "max_steps"}


@pytest.mark.parametrize("budget", [[], ["--max-steps", "1"]])
@pytest.mark.parametrize("name, resume", [("pre", pretrain_resume), ("clf", finetune_resume)])
def test_resuming_a_finished_run_writes_nothing(tiny_runs, tmp_path, name, resume, budget):
    """Issue 37: resumed with a lower --max-steps, a finished run exited 0 but recorded the lower budget in
    config.json and logged its last evaluation again. Its budget spent, it has nothing to do, and writes nothing."""
    run = shutil.copytree(tiny_runs / name, tmp_path / name)
    before = snapshot(run)
    assert main(["--no-progress", *resume(tiny_runs, *budget, out=run)]) == 0
    assert snapshot(run) == before


@pytest.mark.parametrize("name, resume", [("pre", pretrain_resume), ("clf", finetune_resume)])
def test_a_resume_refused_for_a_cut_checkpoint_writes_nothing(tiny_runs, tmp_path, capsys, name, resume):
    """The new budget was written to config.json before the checkpoint was read, and found cut short."""
    run = shutil.copytree(tiny_runs / name, tmp_path / name)
    weights = run / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    refused(resume(tiny_runs, "--max-steps", "9", out=run), capsys, tmp_path, "model.safetensors", "cut short")


def test_a_run_resumes_with_what_its_code_did_for_settings_it_predates(tiny_runs, tmp_path):
    """A training setting added since a run was made takes TrainConfig's own default on --resume (what the code that
    made it did), not the default a new run gets: fine-tuning's eval_points (issue 37) is 2 now, none before."""
    run = shutil.copytree(tiny_runs / "clf", tmp_path / "clf")
    assert json.loads((run / "config.json").read_text())["train"]["eval_points"] == 2
    for path, part in ((run / "config.json", "train"), (run / "checkpoint" / "trainer_state.json", "config")):
        record = json.loads(path.read_text())
        del record[part]["eval_points"]  # as a run made before the field was
        path.write_text(json.dumps(record))
    assert main(["--no-progress", *finetune_resume(tiny_runs, "--epochs", "2", out=run)]) == 0
    train = json.loads((run / "config.json").read_text())["train"]
    assert train["eval_points"] == 0 and train["lr"] == 3e-4  # the run's own rate goes on too
