"""Shared fixtures: small generated corpora and labeled files, and the real data when present."""
from __future__ import annotations

import importlib.util
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

WORDS = ("the a cat dog bird fish tree river stone cloud runs sleeps sings jumps over under near quickly slowly "
         "happy sad green blue old young small large house garden city road").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(n)]


def documents(lines: list[str], size: int = 40) -> str:
    """``lines`` as a text file of documents of ``size`` lines each, separated by blank lines (for NSP)."""
    return "\n\n".join("\n".join(lines[i: i + size]) for i in range(0, len(lines), size)) + "\n"


def pytest_collection_modifyitems(items: list) -> None:
    """Tests marked ``gpu`` skip, saying why, on a machine without CUDA (scripts/gpu_check.sh runs them on one)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is false here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread, above all on a CPU shared with other jobs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A folder of two small text files (two documents)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(2):
        (folder / f"doc{i}.txt").write_text("\n".join(sentences(300, seed=i)) + "\n")
    return folder


@pytest.fixture
def labeled(tmp_path: Path) -> tuple[Path, Path]:
    """train.csv / dev.csv where the label says whether the text mentions an animal."""
    animals = {"cat", "dog", "bird", "fish"}
    paths = []
    for split, seed, n in (("train", 10, 120), ("dev", 11, 40)):
        path = tmp_path / f"{split}.csv"
        rows = ["text,label"]
        for s in sentences(n, seed):
            label = "animal" if animals & set(s.lower().rstrip(".").split()) else "none"
            rows.append(f'"{s}",{label}')
        path.write_text("\n".join(rows) + "\n")
        paths.append(path)
    return paths[0], paths[1]


def shared_data() -> Path | None:
    """The real data sets (../shared/data or $SESAME_DATA); absence fails under CI and skips elsewhere."""
    root = Path(os.environ.get("SESAME_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    if root.is_dir():
        return root
    if os.environ.get("CI") == "true":
        pytest.fail(f"real data not found at {root}; CI must have ../shared/data beside the repo")
    pytest.skip(f"real data not found at {root}; set SESAME_DATA to run the end-to-end tests")


BROWSERS = ("chromium", "chromium-browser")  # Debian's package, and Ubuntu's name for it


def browser() -> str:
    """Chromium's command; absence fails under CI (.ci/run installs it) and skips elsewhere."""
    found = next((path for path in map(shutil.which, BROWSERS) if path), None)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; CI must install it (.ci/run: apt-get install chromium)")
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)")


def minilm() -> Path:
    """The installed all-MiniLM-L6-v2 directory; absence fails under CI (which installs it) and skips elsewhere."""
    from sesame.interop.sources import MINILM_INSTALL, MINILM_PACKAGE, minilm_dir

    if importlib.util.find_spec(MINILM_PACKAGE) is not None:
        return minilm_dir()
    if os.environ.get("CI") == "true":
        pytest.fail(f"the MiniLM weights are not installed; CI must run `{MINILM_INSTALL}`")
    pytest.skip(f"the MiniLM weights are not installed (`{MINILM_INSTALL}`)")


def extra_or_skip(extra: str, *modules: str) -> None:
    """The ``modules`` of an extra CI installs (onnx, corpora): absence fails under CI, skips elsewhere."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{', '.join(missing)} not installed; CI must install the {extra} extra (pip install -e "
                    f"'.[{extra}]')")
    pytest.skip(f"{', '.join(missing)} not installed (pip install 'sesame-nlp[{extra}]')")


def onnxruntime_or_skip() -> None:
    """The onnx extra (onnx, onnxruntime, onnxscript)."""
    extra_or_skip("onnx", "onnx", "onnxruntime", "onnxscript")


def corpora_or_skip() -> None:
    """The corpora extra (zstandard, pyarrow): compressed JSON Lines and Parquet corpora."""
    extra_or_skip("corpora", "zstandard", "pyarrow")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` with a hash of its bytes: what a refused command must leave as it was."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(argv: list[str], capsys, folder: Path, *expected: str) -> str:
    """Run ``sesame argv`` in this process and check it is refused as every user error must be: exit status 2,
    one line on stderr holding each of ``expected`` (the flag, the file), no traceback, and nothing below
    ``folder`` changed. Returns the line."""
    from sesame.cli import main

    before = snapshot(folder)
    capsys.readouterr()
    assert main(["--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert snapshot(folder) == before
    return lines[0]


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> Path:
    """A folder with corpus.txt, other.txt, train.csv, dev.csv, a pretrained run ``pre`` made from the text (its
    shards in pre/shards) and a classifier ``clf`` fine-tuned from it for one epoch, both with checkpoints.
    Tests that change a run copy it first."""
    from sesame.cli import main

    root = tmp_path_factory.mktemp("tiny_runs")
    (root / "corpus.txt").write_text(documents(sentences(300)))
    (root / "other.txt").write_text(documents(sentences(300, seed=5)))
    animals = {"cat", "dog", "bird", "fish"}
    for split, seed, n in (("train", 10, 64), ("dev", 11, 32)):
        rows = ["text,label"] + [f'"{s}",{"animal" if animals & set(s.lower().rstrip(".").split()) else "none"}'
                                 for s in sentences(n, seed)]
        (root / f"{split}.csv").write_text("\n".join(rows) + "\n")
    q = ["--no-progress"]
    assert main(q + ["pretrain", "--family", "bert", "--size", "tiny", "--corpus", str(root / "corpus.txt"),
                     "--vocab-size", "200", "--seq-len", "32", "--max-steps", "2", "--batch-size", "8",
                     "--lr", "1e-3", "--out", str(root / "pre")]) == 0
    assert main(q + ["finetune", "--from", str(root / "pre"), "--train", str(root / "train.csv"), "--dev",
                     str(root / "dev.csv"), "--epochs", "1", "--batch-size", "16", "--max-length", "32",
                     "--out", str(root / "clf")]) == 0
    return root


NO_UNWRITABLE = "no folder here that root cannot write to (Linux's /sys is one)"


@pytest.fixture(scope="session")
def unwritable(tmp_path_factory) -> Iterator[Path | None]:
    """A folder where no file can be created: one made read-only, or for root, whom permission bits do not stop,
    Linux's /sys (sysfs takes no new files); None where there is none (tests skip: NO_UNWRITABLE)."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        folder = tmp_path_factory.mktemp("read-only")
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
    else:
        yield Path("/sys") if Path("/sys").is_dir() else None


@pytest.fixture(scope="session")
def command_inputs(tmp_path_factory) -> Path:
    """Tiny inputs of every command that runs a model (tests/device_helpers.py: what they are, and each command's
    line on them)."""
    from .device_helpers import write_command_inputs

    root = tmp_path_factory.mktemp("commands")
    write_command_inputs(root)
    return root


def load_script(path: Path, name: str):
    """A script outside the package (benchmarks/, scripts/) imported as module ``name``, for its tests."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def config_reads(monkeypatch, folder: Path) -> list[Path]:
    """The reads of ``folder``'s config.json from now on (every JSON file sesame reads goes through read_bytes)."""
    reads, read_bytes = [], Path.read_bytes

    def counted(path: Path) -> bytes:
        if path == folder / "config.json":
            reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    return reads
