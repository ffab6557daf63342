"""Runs killed at any point continue with --resume to the model an uninterrupted run makes: before the first
checkpoint (or before config.json), inside a fine-tuning epoch, mid-write, and by kill -9 from outside."""
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sesame
from sesame import rundir
from sesame.data.windows import Corpus
from sesame.errors import SesameError
from sesame.train import Trainer
from sesame.train.checkpoint import load_weights

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PRETRAINED, TRAIN_CSV, DEV_CSV = FIXTURES / "runs" / "pretrained", FIXTURES / "data" / "train.csv", \
    FIXTURES / "data" / "dev.csv"
TINY = dict(family="bert", size="tiny", vocab_size=200, seq_len=32, batch_size=8, max_steps=8, eval_every=4,
            save_every=4, progress=False)
TUNE = dict(task="classify", max_length=32, batch_size=8, epochs=1, progress=False)  # 40 steps an epoch

pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(BaseException):
    """What kill -9 does to the Python code: it stops where it is; nothing after runs."""


def kill_at_step(monkeypatch, step: int) -> None:
    original = Trainer._train_step

    def train_step(self, wrapped):
        if self.step == step:
            raise Killed
        return original(self, wrapped)

    monkeypatch.setattr(Trainer, "_train_step", train_step)


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_weights(a / "model.safetensors"), load_weights(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def logged(run: Path) -> list[tuple]:
    """The log without its timings."""
    return [(r["step"], r["split"], r.get("loss")) for r in map(json.loads, (run / "metrics.jsonl").open())]


def test_a_run_killed_before_its_first_checkpoint_resumes_from_step_0(corpus, tmp_path, monkeypatch):
    """It has config.json, so a fresh start is refused ("pass --resume"); --resume used to refuse it too ("drop
    --resume"). Now --resume starts it again, and forgets what the killed attempt logged and left half-written."""
    sesame.pretrain([str(corpus)], str(tmp_path / "straight"), **TINY)
    run = tmp_path / "killed"
    kill_at_step(monkeypatch, 3)
    with pytest.raises(Killed):
        sesame.pretrain([str(corpus)], str(run), **TINY)
    monkeypatch.undo()
    assert (run / "config.json").is_file() and not (run / "checkpoint").exists()
    with (run / "metrics.jsonl").open("a") as log:
        log.write('{"step": 3, "split": "tr')  # a kill mid-write
    (run / ".checkpoint.x7q2.tmp").mkdir()  # and one during a save
    with pytest.raises(SesameError, match="pass --resume"):
        sesame.pretrain([str(corpus)], str(run), **TINY)

    sesame.pretrain([str(corpus)], str(run), resume=True, **TINY)
    assert same_weights(run, tmp_path / "straight")
    assert logged(run) == logged(tmp_path / "straight")
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_a_spanbert_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_model(corpus, tmp_path, monkeypatch):
    """SpanBERT's spans, drawn for the whole batch, are a function of the seed, the step and the example: the steps
    after a resume mask what the uninterrupted run masked."""
    spanbert = {**TINY, "family": "spanbert"}
    sesame.pretrain([str(corpus)], str(tmp_path / "straight"), **spanbert)
    run = tmp_path / "killed"
    kill_at_step(monkeypatch, 6)  # after the checkpoint at 4
    with pytest.raises(Killed):
        sesame.pretrain([str(corpus)], str(run), **spanbert)
    monkeypatch.undo()
    sesame.pretrain([str(corpus)], str(run), resume=True, **spanbert)
    assert same_weights(run, tmp_path / "straight")
    assert logged(run) == logged(tmp_path / "straight")


def test_a_run_killed_during_its_setup_starts_again_with_or_without_resume(corpus, tmp_path, monkeypatch):
    """A kill before config.json leaves part of the tokenizer and shards; the folder is sesame's alone (marked
    while it is set up), so it is cleared and set up again."""
    def killed(*args, **kwargs):
        raise Killed

    for resume in (True, False):
        run = tmp_path / f"resume-{resume}"
        monkeypatch.setattr(Corpus, "shards", killed)
        monkeypatch.setattr(rundir.shutil, "rmtree", lambda *a, **k: None)  # kill -9 cleans nothing up
        with pytest.raises(Killed):
            sesame.pretrain([str(corpus)], str(run), **TINY)
        monkeypatch.undo()
        assert (run / rundir.SETTING_UP).is_file() and not (run / "config.json").exists()
        (run / "shards").mkdir()  # what a kill inside the preparation leaves
        sesame.pretrain([str(corpus)], str(run), resume=resume, **TINY)
        assert (run / "checkpoint").is_dir() and not (run / rundir.SETTING_UP).exists()


def test_a_finetuning_run_killed_before_its_first_checkpoint_resumes_from_its_base(tmp_path, monkeypatch):
    """Starting again from step 0 means from the weights of --from, not from a random model."""
    options = dict(base=str(PRETRAINED), train=str(TRAIN_CSV), dev=str(DEV_CSV), **TUNE)
    sesame.finetune(out=str(tmp_path / "straight"), **options)
    kill_at_step(monkeypatch, 5)
    with pytest.raises(Killed):
        sesame.finetune(out=str(tmp_path / "killed"), **options)
    monkeypatch.undo()
    sesame.finetune(out=str(tmp_path / "killed"), resume=True, **options)
    assert same_weights(tmp_path / "killed", tmp_path / "straight")


def test_finetuning_saves_every_n_steps_inside_epochs_and_resumes_exactly(tmp_path, monkeypatch):
    """--save-every was replaced by once per epoch (config.json still said N), so a kill inside the first epoch
    lost everything. Resuming mid-epoch needs the epoch's batch order, the dropout seeds and the schedule of the
    step, all functions of the step."""
    options = dict(base=str(PRETRAINED), train=str(TRAIN_CSV), dev=str(DEV_CSV), save_every=6, **TUNE)
    sesame.finetune(out=str(tmp_path / "straight"), **options)
    run = tmp_path / "killed"
    kill_at_step(monkeypatch, 15)
    with pytest.raises(Killed):
        sesame.finetune(out=str(run), **options)
    monkeypatch.undo()
    assert json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"] == 12  # of 40
    assert json.loads((run / "config.json").read_text())["train"]["save_every"] == 6
    sesame.finetune(out=str(run), resume=True, **options)
    assert same_weights(run, tmp_path / "straight")
    assert logged(run) == logged(tmp_path / "straight")
    assert dev_steps(run) == [40]  # without --eval-every: at the epoch's end


def dev_steps(run: Path) -> list[int]:
    return [step for step, split, _ in logged(run) if split == "dev"]


def test_finetuning_evaluates_every_n_steps_keeps_the_best_and_resumes_exactly(tmp_path, monkeypatch):
    """--eval-every was replaced by once per epoch. Given, dev is evaluated at its steps (and at the last); the kept
    weights are the best evaluation's, also when a kill drops an evaluation made after the last checkpoint, which the
    resumed run makes again."""
    options = dict(base=str(PRETRAINED), train=str(TRAIN_CSV), dev=str(DEV_CSV), eval_every=15, save_every=12, **TUNE)
    straight = sesame.finetune(out=str(tmp_path / "straight"), **options)
    records = map(json.loads, (tmp_path / "straight" / "metrics.jsonl").open())
    dev = {r["step"]: r for r in records if r["split"] == "dev"}
    assert sorted(dev) == [15, 30, 40]
    assert straight["accuracy"] == max(r["accuracy"] for r in dev.values())
    run = tmp_path / "killed"
    kill_at_step(monkeypatch, 20)  # after the evaluation at 15, the checkpoint at 12 before it
    with pytest.raises(Killed):
        sesame.finetune(out=str(run), **options)
    monkeypatch.undo()
    assert json.loads((run / "config.json").read_text())["train"]["eval_every"] == 15
    resumed = sesame.finetune(out=str(run), resume=True, **options)
    assert same_weights(run, tmp_path / "straight") and resumed == straight
    assert logged(run) == logged(tmp_path / "straight")


def test_a_run_killed_before_the_epochs_decide_its_steps_resumes_deciding_them(tmp_path, monkeypatch):
    """config.json is written before the training set's size decides the budget, evaluations and checkpoints; it
    used to record TrainConfig's defaults for them (1000 steps, every 200), which a resume then took as given."""
    options = dict(base=str(PRETRAINED), train=str(TRAIN_CSV), dev=str(DEV_CSV), **TUNE)

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(importlib.import_module("sesame.pipelines.finetune"), "record_training", killed)
    with pytest.raises(Killed):
        sesame.finetune(out=str(tmp_path / "run"), **options)
    monkeypatch.undo()
    sesame.finetune(out=str(tmp_path / "run"), resume=True, **options)
    train = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert (train["max_steps"], train["eval_every"], train["save_every"]) == (40, 40, 40)
    assert dev_steps(tmp_path / "run") == [40]


PRETRAIN = ["pretrain", "--family", "bert", "--size", "tiny", "--vocab-size", "200", "--seq-len", "32",
            "--batch-size", "8", "--max-steps", "40", "--eval-every", "10", "--save-every", "3"]


def state(run: Path) -> str:
    """How far a run got: a step checkpointed, set up, or being set up."""
    checkpoint = run / "checkpoint" / "trainer_state.json"
    if checkpoint.is_file():
        return f"step {json.loads(checkpoint.read_text())['step']}"
    return "set up" if (run / "config.json").is_file() else "setting up" if run.exists() else "not started"


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_gives_the_uninterrupted_model(corpus, tmp_path):
    """The whole command, tokenizer training and corpus preparation included, killed three times at random
    moments; each time the same command with --resume continues, and the model comes out bit for bit as one
    run without interruption makes it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}

    def command(out: Path, resume: bool) -> list[str]:
        return [sys.executable, "-m", "sesame", "--no-progress", *PRETRAIN, "--corpus", str(corpus), "--out",
                str(out), *(["--resume"] if resume else [])]

    started = time.monotonic()
    subprocess.run(command(tmp_path / "straight", False), env=env, check=True, capture_output=True)
    seconds = time.monotonic() - started
    run, rng, kills = tmp_path / "killed", random.Random(17), []
    for _ in range(3):
        delay = rng.uniform(0.3, 0.65) * seconds
        process = subprocess.Popen(command(run, run.exists()), env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        try:
            process.wait(delay)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
        kills.append((round(delay, 2), process.returncode, state(run), process.stderr.read().decode()[-300:]))
        assert process.returncode in (0, -signal.SIGKILL), kills
    subprocess.run(command(run, run.exists()), env=env, check=True, capture_output=True)
    print(f"straight run {seconds:.1f} s; kills (delay, status, state):", *kills, sep="\n")
    assert same_weights(run, tmp_path / "straight"), kills
    assert (run / "tokenizer.json").read_bytes() == (tmp_path / "straight" / "tokenizer.json").read_bytes()
