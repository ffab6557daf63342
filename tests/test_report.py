"""sesame report: the training curves of runs and compare folders as an HTML page and a PNG, rendered by a browser."""
import json
import shutil
import subprocess

import pytest

from sesame.cli import main

from .conftest import browser, refused, sentences

PNG = b"\x89PNG\r\n\x1a\n"


def report(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main(["report", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A tiny compare folder: a GPT pre-trained for 3 steps, fine-tuned on one task beside its scratch twin."""
    root = tmp_path_factory.mktemp("report-compare")
    (root / "corpus.txt").write_text("\n".join(sentences(300)) + "\n")
    for split, seed, n in (("train", 1, 48), ("dev", 2, 24)):
        rows = ["text\tlabel"] + [f"{s}\t{'yes' if 'cat' in s.lower() else 'no'}" for s in sentences(n, seed)]
        (root / f"cats-{split}.tsv").write_text("\n".join(rows) + "\n")
    (root / "cats.json").write_text(json.dumps({"name": "cats", "train": "cats-train.tsv", "dev": "cats-dev.tsv"}))
    assert main(["--no-progress", "compare", "--approaches", "gpt:tiny:seq_len=32:batch_size=8:vocab_size=300",
                 "--corpus", str(root / "corpus.txt"), "--tasks", str(root / "cats.json"), "--out", str(root / "cmp"),
                 "--minutes", "1", "--max-steps", "3", "--epochs", "1", "--batch-size", "16",
                 "--max-length", "32"]) == 0
    return root / "cmp"


def test_a_page_and_a_png_of_every_curve_of_several_runs(tiny_runs, tmp_path, capsys):
    runs = [str(tiny_runs / "pre"), str(tiny_runs / "clf")]
    written = report([*runs, "--out", str(tmp_path / "curves.html")], capsys)
    assert written == {"html": str(tmp_path / "curves.html"), "png": str(tmp_path / "curves.png"), "runs": runs}
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)
    page = (tmp_path / "curves.html").read_text()
    for chart in ("train-loss", "train-lr", "train-tokens_per_s", "dev-loss", "dev-perplexity", "dev-accuracy"):
        assert f'<g id="chart-{chart}">' in page, chart
    for text in ("training loss", "learning rate", "throughput (tokens/s)", "dev accuracy", *runs):
        assert text in page, text  # titles and the legend are SVG text
    assert "dev n<" not in page and "elapsed" not in page  # counts and times are no curves
    assert "<script" not in page and "src=" not in page and "<link" not in page  # nothing to fetch or run


def test_a_compare_folder_charts_every_run_it_trained(compared, tmp_path, capsys):
    written = report([str(compared), "--out", str(tmp_path / "compare.html")], capsys)
    cells = sorted(label.removeprefix(f"{compared}/") for label in written["runs"])
    assert cells == ["cats/gpt-tiny-seq_len=32-batch_size=8-vocab_size=300", "cats/scratch-gpt-tiny",
                     "pretrain/gpt-tiny-seq_len=32-batch_size=8-vocab_size=300"]  # not the TF-IDF cell: no curves
    page = (tmp_path / "compare.html").read_text()
    assert all(label in page for label in written["runs"])
    assert '<g id="chart-dev-accuracy">' in page and '<g id="chart-dev-perplexity">' in page
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG)


def test_the_page_renders_in_headless_chromium_without_console_errors(tiny_runs, tmp_path, capsys):
    from matplotlib.image import imread

    chromium = browser()
    report([str(tiny_runs / "pre"), str(tiny_runs / "clf"), "--out", str(tmp_path / "curves.html")], capsys)
    url = (tmp_path / "curves.html").as_uri()
    headless = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr",
                "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,2400"]
    dom = subprocess.run([*headless, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # script errors, blocked loads and policy violations are console messages
    for chart in ("train-loss", "train-lr", "train-tokens_per_s", "dev-accuracy", "dev-perplexity"):
        assert f'<g id="chart-{chart}">' in dom.stdout, chart  # parsed as SVG elements of the page
    shot = subprocess.run([*headless, f"--screenshot={tmp_path / 'shot.png'}", url], capture_output=True, timeout=120)
    assert shot.returncode == 0, shot.stderr
    pixels = (imread(tmp_path / "shot.png")[..., :3] * 255).round()
    for colour in ((31, 119, 180), (255, 127, 14)):  # both runs' points and legend lines, in their colours
        assert (abs(pixels - colour).max(axis=-1) < 40).sum() > 40, colour


@pytest.mark.parametrize("argv, expected", [
    (["{root}/corpus.txt", "--out", "{tmp}/r.html"], ["RUN", "is a file"]),
    (["{tmp}/nothing", "--out", "{tmp}/r.html"], ["RUN", "not found"]),
    (["{tmp}/folder", "--out", "{tmp}/r.html"], ["RUN", "not a sesame run"]),
    (["{tmp}/untrained", "--out", "{tmp}/r.html"], ["RUN", "has no metrics.jsonl"]),
    (["{root}/pre", "{root}/pre/", "--out", "{tmp}/r.html"], ["RUN", "given twice"]),
    (["{root}/pre", "--out", "{tmp}/r.svg"], ["--out", "FILE.html"]),
    (["{root}/pre", "--out", "{tmp}/taken.html"], ["--out", "exists"]),
    (["{root}/pre", "--out", "{tmp}/half.html"], ["--out", "half.png", "exists"]),
])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(argv, expected, tiny_runs, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine\n")
    shutil.copytree(tiny_runs / "pre", tmp_path / "untrained", ignore=shutil.ignore_patterns("metrics.jsonl"))
    (tmp_path / "taken.html").write_text("mine\n")
    (tmp_path / "half.png").write_text("mine\n")
    refused(["report", *(a.format(root=tiny_runs, tmp=tmp_path) for a in argv)], capsys, tmp_path, *expected)
