"""`sesame pretrain` and `finetune` under torchrun: CPU processes (gloo) train exactly like one at the same global
batch, on one machine or as two "machines" (two launches on this host), and only rank 0 writes.

Every run is a real subprocess: the single-process command as a user types it, and the same command
under ``python -m torch.distributed.run``. The tokenizer and shards are prepared once and passed as
``--corpus``, so all runs see the same token ids.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

import sesame
from sesame.cli import main as sesame_main
from sesame.errors import SesameError
from sesame import rundir
from sesame.train import TrainConfig
from sesame.train import trainer as trainer_module
from sesame.train.trainer import STAND_IN, micro_batches

from .conftest import documents

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available in this torch build")

# Same global batch, different sums: the 2-process gradient is two half-batch sums averaged by DDP,
# so only float32 rounding differs (measured: max |Δweight| ~3e-7 and |Δloss| ~3e-7 after 20 steps).
RTOL, ATOL = 1e-4, 1e-5
TIMEOUT = 300

SUBJECTS = ["the cat", "a dog", "my neighbour", "the old sailor", "every child", "the river", "a quiet robot",
            "the baker", "our teacher", "the small bird", "a tired farmer", "the painter"]
VERBS = ["watches", "paints", "carries", "forgets", "remembers", "follows", "builds", "sells", "finds", "loves"]
OBJECTS = ["the red apple", "a wooden boat", "the morning light", "seven stones", "a strange letter",
           "the bright moon", "warm bread", "a broken clock", "the green hill", "an empty box"]
TAILS = ["before dinner", "near the harbour", "in the rain", "after school", "every sunday", "without a word",
         "under the bridge", "at dawn", "with great care", "for no reason"]


def write_corpus(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        line = f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
        if rng.random() < 0.5:
            line += f" Then {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."
        lines.append(line)
    path.write_text(documents(lines))  # several documents, for NSP
    return path


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def sesame_cmd(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "sesame"]
    # --standalone: a fresh local rendezvous on a free port, so parallel test runs do not collide
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "sesame"]


def pretrain_args(family: str, shards: Path, out: Path, **extra) -> list[str]:
    options = {"family": family, "size": "tiny", "corpus": shards, "out": out, "max-steps": 20, "batch-size": 8,
               "dropout": 0, "seq-len": 32, "vocab-size": 300, "eval-every": 4, "seed": 0, **extra}
    args = ["--no-progress", "pretrain"]
    for key, value in options.items():
        args += [f"--{key}", str(value)]
    return args


def run_sesame(nproc: int, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(sesame_cmd(nproc) + args, env=child_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    if check and proc.returncode != 0:
        pytest.fail(f"{nproc} process(es) exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def losses(run: Path, split: str) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run) if r["split"] == split}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, Path]:
    """Shard directories (with their tokenizer) for a WordPiece and a BPE family, made once."""
    root = tmp_path_factory.mktemp("distributed")
    corpus = write_corpus(root / "corpus.txt")
    out = {}
    for kind in ("wordpiece", "bpe"):
        assert sesame_main(["--no-progress", "tokenizer", "train", "--corpus", str(corpus), "--kind", kind,
                            "--vocab-size", "300", "--out", str(root / f"{kind}.json")]) == 0
        assert sesame_main(["--no-progress", "prepare", "--corpus", str(corpus), "--tokenizer",
                            str(root / f"{kind}.json"), "--out", str(root / f"{kind}-shards")]) == 0
        out[kind] = root / f"{kind}-shards"
    return out


def decided(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights that training decides: every tensor but the keys' third of a fused ``qkv`` bias (laid out queries,
    keys, values). A shift of every key of a query leaves its softmax unchanged, so that bias's gradient is zero in
    exact arithmetic; Adam scales the roundoff left in it up to steps of ~1e-5, which differ with the order of the
    sums (two processes or one) and never reach an output."""
    kept = {}
    for name, tensor in weights.items():
        if name.endswith("qkv.bias"):
            queries, _, values = tensor.chunk(3)
            tensor = torch.cat([queries, values])
        kept[name] = tensor
    return kept


def assert_same_training(single: Path, multi: Path, splits: tuple[str, ...] = ("train", "dev")) -> dict[str, float]:
    """Losses step by step (train and dev), and the final weights, agree; returns the largest differences."""
    for split in splits:
        a, b = losses(single, split), losses(multi, split)
        assert a and list(a) == list(b), f"{split} steps differ: {list(a)} vs {list(b)}"
        for step in a:
            assert b[step] == pytest.approx(a[step], rel=RTOL, abs=ATOL), f"{split} loss at step {step}"
    wa, wb = (decided(load_file(str(run / "model.safetensors"))) for run in (single, multi))
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")
    return {"weights": max((wa[k] - wb[k]).abs().max().item() for k in wa),
            "loss": max(abs(losses(single, s)[k] - losses(multi, s)[k]) for s in splits
                        for k in losses(single, s))}


def assert_written_once(run: Path, commands: int = 1) -> None:
    """Only rank 0 wrote: one record per (step, split), no leftover temp files, one copy of each file (and, with
    TensorBoard installed, one event file per command)."""
    keys = [(r["step"], r["split"]) for r in records(run)]
    assert len(keys) == len(set(keys)), f"duplicate metrics lines: {keys}"
    board = ["tensorboard"] if importlib.util.find_spec("tensorboard") else []
    assert sorted(p.name for p in run.iterdir()) == sorted([
        "checkpoint", "config.json", "metrics.jsonl", "model.safetensors", "tokenizer.json", *board])
    if board:
        assert len(list((run / "tensorboard").iterdir())) == commands
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == [
        "model.safetensors", "optimizer.json", "optimizer.safetensors", "trainer_state.json"]


@pytest.fixture(scope="module")
def one_process(prepared, tmp_path_factory) -> Callable[[str, str], Path]:
    """``one_process(family, kind)``: the one-process pretraining run every torchrun variant is held to, made once."""
    runs: dict[str, Path] = {}

    def made(family: str, kind: str) -> Path:
        if family not in runs:
            runs[family] = tmp_path_factory.mktemp("single") / family
            run_sesame(1, pretrain_args(family, prepared[kind], runs[family]))
        return runs[family]

    return made


@pytest.mark.parametrize("family, kind, nproc, extra", [
    ("bert", "wordpiece", 2, {}),
    # batch 8 over 3 processes is 3 + 3 + 2, each share in 2 micro-batches: uneven shares and DDP's no_sync
    ("gpt", "bpe", 3, {"accumulate": 2}),
    ("electra", "wordpiece", 2, {}),  # sampled replacements too are a function of the example alone
])
def test_processes_train_like_one(family, kind, nproc, extra, prepared, one_process, tmp_path):
    multi = tmp_path / "B"
    started = time.time()
    proc = run_sesame(nproc, pretrain_args(family, prepared[kind], multi, **extra))
    print(f"{family}: torchrun run took {time.time() - started:.1f}s")
    single = one_process(family, kind)

    differences = assert_same_training(single, multi)
    print(f"{family}: max |Δ| {differences}")
    assert_written_once(multi)
    assert json.loads((multi / "checkpoint/trainer_state.json").read_text())["step"] == 20
    assert len([line for line in proc.stdout.splitlines() if line.startswith("loss ")]) == 1  # printed once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_machines_train_like_one(prepared, one_process, tmp_path):
    """docs/scaling.md's two-machine command with both "machines" on this host: two torchrun launches at the same
    time, node ranks 0 and 1 of one process each, meeting at node 0's address; they train like one process."""
    multi, port = tmp_path / "B", free_port()
    args = pretrain_args("bert", prepared["wordpiece"], multi)
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "sesame", *args], env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        outputs = [node.communicate(timeout=TIMEOUT) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for rank, (node, (_, stderr)) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, f"node {rank} exited {node.returncode}\n{stderr}"
    print(f"bert on two nodes: max |Δ| {assert_same_training(one_process('bert', 'wordpiece'), multi)}")
    assert_written_once(multi)


@pytest.mark.parametrize("batch, size, accumulate", [(8, 3, 2), (8, 2, 4), (9, 4, 1), (3, 2, 2)])
def test_micro_batches_give_each_example_to_one_process(batch, size, accumulate, monkeypatch):
    """Every example of a global batch goes to exactly one process, the shares differ by at most one, and
    each share is cut into at most --accumulate micro-batches."""
    shares = []
    for rank in range(size):
        monkeypatch.setattr(trainer_module, "world", lambda: (rank, size))
        micro = micro_batches(range(batch), accumulate, lambda part: {"part": part})
        assert 1 <= len(micro) <= accumulate and not any(STAND_IN in m for m in micro)
        shares.append([g for m in micro for g in m["part"]])
    assert sorted(sum(shares, [])) == list(range(batch))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_process_the_batch_leaves_out_steps_with_a_stand_in(monkeypatch):
    """Rank 2 of 3 with a last batch of 2 examples builds the first as a stand-in (its loss weighted 0 by the
    trainer), so it still joins the gradient all-reduce."""
    monkeypatch.setattr(trainer_module, "world", lambda: (2, 3))
    assert micro_batches([5, 7], 2, lambda part: {"part": part}) == [{"part": [5], STAND_IN: True}]


def test_a_batch_smaller_than_the_world_is_refused(monkeypatch):
    monkeypatch.setattr(rundir, "world", lambda: (0, 3))
    with pytest.raises(SesameError, match="--batch-size 2: fewer sequences per step than the 3 processes"):
        rundir.check_batch(TrainConfig(batch_size=2))
    rundir.check_batch(TrainConfig(batch_size=4, accumulate=2))  # shares of 2, 1 and 1 train like one process


def test_a_rank_that_does_not_see_rank_0s_run_says_so(tmp_path, monkeypatch):
    """Two machines without a shared filesystem: rank 1 finds no config.json where rank 0 set the run up."""
    monkeypatch.setattr(rundir, "world", lambda: (1, 1))  # rank 1 (the barrier needs no partner)
    with pytest.raises(SesameError, match="does not see the run rank 0 set up there.*a filesystem they share"):
        with rundir.claimed_run(str(tmp_path / "run"), "pretrained", False, setup=lambda run: None):
            pass
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_a_trainer_on_another_rank_writes_nothing(command, corpus, labeled, tmp_path, monkeypatch):
    """Only rank 0 writes: a trainer that is rank 1 leaves no metrics.jsonl, TensorBoard files, checkpoint or
    weights (not even fine-tuning's best-so-far weights); the run's setup before it (config.json, the tokenizer)
    is rank 0's, which the pipeline still plays here."""
    monkeypatch.setattr(trainer_module, "world", lambda: (1, 1))  # the trainer's view of the world only
    run, budget = tmp_path / "run", dict(batch_size=8, max_steps=4, progress=False)
    if command == "pretrain":
        sesame.pretrain([str(corpus)], str(run), family="bert", size="tiny", vocab_size=200, seq_len=32,
                        eval_every=2, save_every=2, **budget)
    else:
        sesame.finetune("scratch:bert:tiny", str(labeled[0]), str(labeled[1]), str(run), save_every=2, **budget)
    written = {p.name for p in run.iterdir()}
    assert {"config.json", "tokenizer.json"} <= written
    assert not written & {"metrics.jsonl", "tensorboard", "checkpoint", "model.safetensors"}, written


def test_setup_error_on_rank0_stops_every_process(prepared, tmp_path):
    """A user error on rank 0 (here: a WordPiece shard dir for a BPE family) ends both processes with exit 2."""
    proc = run_sesame(2, pretrain_args("gpt", prepared["wordpiece"], tmp_path / "run"), check=False)
    assert proc.returncode != 0
    assert "a wordpiece tokenizer, but this family uses bpe" in proc.stderr
    assert "another process (rank 0) failed to set up the run" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ctrl_c_under_torchrun_saves_once_and_resumes(prepared, tmp_path):
    """SIGINT to torchrun reaches every worker; they agree to stop at the same step, rank 0 saves, and
    --resume under torchrun finishes the run exactly like an uninterrupted single process."""
    steps = 100
    single, multi = tmp_path / "A", tmp_path / "B"
    args = lambda out: pretrain_args("bert", prepared["wordpiece"], out, **{"max-steps": steps, "eval-every": 50,
                                                                            "save-every": 1000})
    run_sesame(1, args(single))

    proc = subprocess.Popen(sesame_cmd(2) + args(multi), env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + TIMEOUT
        while not (multi / "metrics.jsonl").exists() or len(records(multi)) < 1:  # step 1 is logged
            assert proc.poll() is None and time.time() < deadline, "the run ended before it could be interrupted"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "interrupted at step" in stderr, stderr
    stopped = json.loads((multi / "checkpoint/trainer_state.json").read_text())["step"]
    assert 1 <= stopped < steps, "interrupted too late to test resuming; raise `steps`"
    print(f"interrupted at step {stopped} of {steps}")

    run_sesame(2, args(multi) + ["--resume"])
    assert_same_training(single, multi)
    assert_written_once(multi, commands=2)


def test_finetune_two_processes_like_one(prepared, tmp_path):
    """`sesame finetune` under torchrun: each process takes its half of every batch and scores half of
    dev; losses, dev accuracy per epoch and the kept weights match one process, also through a last batch
    smaller than the world."""
    rng = random.Random(1)
    rows = ["text,label"]
    for _ in range(120):
        verb = rng.choice(VERBS)
        rows.append(f"{rng.choice(SUBJECTS)} {verb} {rng.choice(OBJECTS)},{'warm' if verb in VERBS[:5] else 'cold'}")
    # 97 examples: each epoch's last batch holds 1, so rank 1 steps with a stand-in (micro_batches)
    (tmp_path / "train.csv").write_text("\n".join(rows[:98]) + "\n")
    (tmp_path / "dev.csv").write_text("\n".join(rows[:1] + rows[98:]) + "\n")
    args = lambda out: ["--no-progress", "finetune", "--from", "scratch:bert:tiny", "--tokenizer",
                        str(prepared["wordpiece"] / "tokenizer.json"), "--train", str(tmp_path / "train.csv"),
                        "--dev", str(tmp_path / "dev.csv"), "--epochs", "2", "--batch-size", "8", "--dropout", "0",
                        "--lr", "1e-3", "--max-length", "16", "--out", str(out)]
    single, multi = tmp_path / "A", tmp_path / "B"
    run_sesame(1, args(single))
    run_sesame(2, args(multi))
    assert_same_training(single, multi, splits=("train",))  # classifier dev records hold accuracy
    dev = lambda run: [(r["step"], r["accuracy"]) for r in records(run) if r["split"] == "dev"]
    assert len(dev(single)) == 2 and dev(multi) == dev(single)
    keys = [(r["step"], r["split"]) for r in records(multi)]
    assert len(keys) == len(set(keys)), f"duplicate metrics lines: {keys}"
    assert sorted(p.name for p in multi.iterdir()) == sorted(p.name for p in single.iterdir())
