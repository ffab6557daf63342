"""The command line end to end on tiny data, and every kind of bad input it must refuse cleanly."""
import hashlib
import io
import json
import subprocess
import sys

import pytest

from sesame.cli import main

from .conftest import refused

FAST = ["--max-steps", "4", "--batch-size", "8", "--eval-every", "2"]


def snapshot(folder):
    """Every file below ``folder`` with a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A pretrained run and a classifier fine-tuned from it, made through the CLI."""
    from .conftest import documents, sentences

    root = tmp_path_factory.mktemp("cli")
    (root / "corpus.txt").write_text(documents(sentences(400)))  # several documents, for NSP
    animals = {"cat", "dog", "bird", "fish"}
    for split, seed in (("train", 1), ("dev", 2)):
        lines = ["text\tlabel"] + [f"{s}\t{'animal' if animals & set(s.lower()[:-1].split()) else 'none'}"
                                   for s in sentences(60, seed)]
        (root / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    first, second = sentences(40, 3), sentences(40, 4)
    pairs = ["first\tsecond\tverdict"] + [f"{a}\t{b if i % 2 else a}\t{'same' if i % 2 == 0 else 'other'}"
                                               for i, (a, b) in enumerate(zip(first, second))]
    (root / "pairs.tsv").write_text("\n".join(pairs) + "\n")
    conll = ["-DOCSTART- O", ""]
    for s in sentences(30, 5):
        conll += [f"{w} {'B-ANIMAL' if w.lower() in animals else 'O'}" for w in s[:-1].split()] + [". O", ""]
    (root / "tags.txt").write_text("\n".join(conll))
    q = ["--no-progress"]
    assert main(q + ["tokenizer", "train", "--corpus", str(root / "corpus.txt"), "--vocab-size", "200",
                     "--out", str(root / "tok.json")]) == 0
    assert main(q + ["prepare", "--corpus", str(root / "corpus.txt"), "--tokenizer", str(root / "tok.json"),
                     "--out", str(root / "shards")]) == 0
    assert main(q + ["pretrain", "--family", "bert", "--size", "tiny", "--corpus", str(root / "shards"),
                     "--seq-len", "32", "--out", str(root / "pre")] + FAST) == 0
    assert main(q + ["finetune", "--from", str(root / "pre"), "--train", str(root / "train.tsv"),
                     "--dev", str(root / "dev.tsv"), "--out", str(root / "clf"), "--epochs", "2",
                     "--batch-size", "16"]) == 0
    assert main(q + ["finetune", "--from", str(root / "pre"), "--task", "pair", "--train", str(root / "pairs.tsv"),
                     "--dev", str(root / "pairs.tsv"), "--text-column", "first", "--pair-column", "second",
                     "--label-column", "verdict", "--out", str(root / "pair"), "--epochs", "1"]) == 0
    assert main(q + ["finetune", "--from", str(root / "pre"), "--task", "tag", "--train", str(root / "tags.txt"),
                     "--dev", str(root / "tags.txt"), "--out", str(root / "tag"), "--epochs", "1"]) == 0
    return root


def test_evaluate_prints_json_for_both_kinds(runs, capsys):
    capsys.readouterr()
    assert main(["evaluate", "--model", str(runs / "clf"), "--data", str(runs / "dev.tsv"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"accuracy", "macro_f1", "per_class"} <= set(report) and set(report["per_class"]) == {"animal", "none"}
    assert main(["evaluate", "--model", str(runs / "pre"), "--data", str(runs / "corpus.txt"), "--json"]) == 0
    lm = json.loads(capsys.readouterr().out)
    assert lm["perplexity"] > 1 and lm["tokens"] > 0


def test_predict_reads_stdin_and_files(runs, capsys, monkeypatch):
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("The cat sleeps.\nA green house.\n"))
    assert main(["predict", "--model", str(runs / "clf")]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert [l["text"] for l in lines] == ["The cat sleeps.", "A green house."]
    assert all(l["label"] in ("animal", "none") and sum(l["probabilities"].values()) == pytest.approx(1, abs=1e-4)
               for l in lines)
    assert main(["predict", "--model", str(runs / "clf"), "--input", str(runs / "dev.tsv")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 60


def test_pair_models_read_their_own_columns_to_predict_and_evaluate(runs, capsys):
    """Without column flags, predict and evaluate read the columns the run was trained on."""
    capsys.readouterr()
    assert main(["predict", "--model", str(runs / "pair"), "--input", str(runs / "pairs.tsv")]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert len(lines) == 40 and {"text", "pair", "label", "probabilities"} <= set(lines[0])
    assert main(["evaluate", "--model", str(runs / "pair"), "--data", str(runs / "pairs.tsv"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"accuracy", "f1", "mcc"} <= set(report) and set(report["per_class"]) == {"other", "same"}
    config = json.loads((runs / "pair" / "config.json").read_text())
    assert config["task"] == "pair" and config["task_options"]["pair_column"] == "second"


def test_tagger_writes_conll_columns_with_gold_beside_the_prediction(runs, capsys, tmp_path):
    capsys.readouterr()
    out = tmp_path / "tags.out"
    assert main(["predict", "--model", str(runs / "tag"), "--input", str(runs / "tags.txt"), "--output", str(out)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 30  # one JSON line per sentence
    sentences_out = out.read_text().strip().split("\n\n")
    gold = [l for l in (runs / "tags.txt").read_text().splitlines()[2:] if l]
    written = [l.split() for block in sentences_out for l in block.splitlines()]
    assert len(sentences_out) == 30 and [f"{w[0]} {w[1]}" for w in written] == gold
    assert all(len(w) == 3 and w[2] in ("O", "B-ANIMAL") for w in written)  # token, gold, predicted


def test_run_directory_layout(runs):
    for kind, files in (("pre", {"config.json", "tokenizer.json", "model.safetensors", "metrics.jsonl"}),
                        ("clf", {"config.json", "tokenizer.json", "model.safetensors", "metrics.jsonl", "labels.json"})):
        assert files <= {p.name for p in (runs / kind).iterdir()}
        assert {p.name for p in (runs / kind / "checkpoint").iterdir()} == {
            "model.safetensors", "optimizer.safetensors", "optimizer.json", "trainer_state.json"}
    assert json.loads((runs / "clf" / "labels.json").read_text()) == ["animal", "none"]
    assert json.loads((runs / "clf" / "config.json").read_text())["kind"] == "finetuned"


def bad_cases(root):
    r = str(root)
    return {
        "missing column": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/train.tsv", "--dev", f"{r}/dev.tsv",
                            "--text-column", "sentence", "--out", f"{r}/new"], "train.tsv: no column 'sentence' for --text-column"),
        "empty file": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/empty.csv", "--dev", f"{r}/dev.tsv",
                        "--out", f"{r}/new"], "empty.csv: the file is empty"),
        "unknown dev label": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/train.tsv", "--dev",
                               f"{r}/odd.tsv", "--out", f"{r}/new"], "odd.tsv:2: label 'plant' never occurs"),
        "non-numeric target": (["finetune", "--from", f"{r}/pre", "--task", "regress", "--train", f"{r}/train.tsv",
                                "--dev", f"{r}/dev.tsv", "--out", f"{r}/new"], "train.tsv:2: 'label' is"),
        "symmetric single texts": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/train.tsv", "--dev",
                                    f"{r}/dev.tsv", "--symmetric", "--out", f"{r}/new"], "--symmetric"),
        "metric of another task": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/train.tsv", "--dev",
                                    f"{r}/dev.tsv", "--select", "pearson", "--out", f"{r}/new"], "--select 'pearson'"),
        "pair model on stdin": (["predict", "--model", f"{r}/pair"], "give --input FILE"),
        "invalid utf-8": (["pretrain", "--corpus", f"{r}/latin1.txt", "--out", f"{r}/new"] + FAST,
                          "latin1.txt:2: not valid UTF-8"),
        "run of another kind": (["evaluate", "--model", f"{r}/shards", "--data", f"{r}/dev.tsv"],
                                "shards: not a sesame run directory"),
        "classifier as pretrain resume": (["pretrain", "--corpus", f"{r}/corpus.txt", "--out", f"{r}/clf",
                                           "--resume"] + FAST, "holds a 'finetuned' run"),
        "occupied --out": (["pretrain", "--corpus", f"{r}/corpus.txt", "--out", f"{r}/pre"] + FAST,
                           "--out"),
        "negative budget": (["pretrain", "--corpus", f"{r}/corpus.txt", "--out", f"{r}/pre", "--max-steps", "-3"],
                            "--max-steps: must be positive"),
        "negative minutes": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/train.tsv", "--dev", f"{r}/dev.tsv",
                              "--out", f"{r}/clf", "--max-minutes", "-1"], "--max-minutes: must be positive"),
        "drop-mult on a transformer": (["finetune", "--from", f"{r}/pre", "--train", f"{r}/train.tsv", "--dev",
                                        f"{r}/dev.tsv", "--drop-mult", "0.5", "--out", f"{r}/new"],
                                       "--drop-mult: scales the five dropouts of a recurrent (AWD-LSTM) model"),
        "missing run": (["finetune", "--from", f"{r}/nothing", "--train", f"{r}/train.tsv", "--dev",
                         f"{r}/dev.tsv", "--out", f"{r}/new"], "--from"),
        "unknown family": (["pretrain", "--family", "bertt", "--corpus", f"{r}/corpus.txt", "--out", f"{r}/new"] + FAST,
                           "sesame: error: --family bertt: choose one of bert, roberta"),
        "unknown command": (["pretrian", "--corpus", f"{r}/corpus.txt"], "command pretrian: choose one of tokenizer"),
    }


# run as `python -m sesame` in a process of its own (the exit status and stderr a shell sees); the other cases run in
# this process through the same main(), since each process spends seconds importing torch
IN_A_PROCESS = ("unknown command", "pair model on stdin")


@pytest.mark.parametrize("case", list(bad_cases(".")))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, runs, capsys, monkeypatch):
    (runs / "empty.csv").write_text("")
    (runs / "odd.tsv").write_text("text\tlabel\nA cat.\tplant\n")
    (runs / "latin1.txt").write_bytes("fine\ncaf\xe9 au lait\n".encode("latin-1"))
    argv, message = bad_cases(runs)[case]
    if case not in IN_A_PROCESS:
        monkeypatch.setattr(sys, "stdin", io.StringIO("A cat sleeps.\n"))
        refused(argv, capsys, runs, message)
        assert not (runs / "new").exists()
        return
    before = snapshot(runs)
    result = subprocess.run([sys.executable, "-m", "sesame", "--no-progress", *argv], capture_output=True, text=True,
                            input="A cat sleeps.\n")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert message in result.stderr
    assert snapshot(runs) == before
    assert not (runs / "new").exists()


@pytest.mark.parametrize("terminal, flags, after, drawn", [(True, [], [], True), (False, [], [], False),
                                                           (True, ["--no-progress"], [], False),
                                                           (True, [], ["--no-progress"], False)])
def test_progress_bars_are_drawn_only_on_a_terminal(terminal, flags, after, drawn, tmp_path, capsys, monkeypatch):
    """--no-progress hides them, before the command or after it."""
    from .conftest import sentences

    (tmp_path / "corpus.txt").write_text("\n".join(sentences(200)) + "\n")
    tok = str(tmp_path / "tok.json")
    assert main(["tokenizer", "train", "--corpus", str(tmp_path / "corpus.txt"), "--vocab-size", "100",
                 "--out", tok]) == 0
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    capsys.readouterr()
    assert main([*flags, "prepare", "--corpus", str(tmp_path / "corpus.txt"), "--tokenizer", tok, "--out",
                 str(tmp_path / "shards"), *after]) == 0
    assert ("prepare:" in capsys.readouterr().err) == drawn


def test_an_unknown_argument_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "--model", "run", "--data", "dev.csv", "--no-progres", "--no-progress"])
    assert exit.value.code == 2 and "unrecognized arguments: --no-progres" in capsys.readouterr().err


def test_json_output_hides_progress_bars_even_on_a_terminal(monkeypatch):
    from sesame.cli import _parser, quiet

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["evaluate", "--model", "run", "--data", "dev.csv"]
    assert not quiet(_parser().parse_args(argv))
    assert quiet(_parser().parse_args([*argv, "--json"]))


FLOOD = """
import sys
import sesame.commands.predict as predict
predict.run = lambda args: [print("a prediction") for _ in iter(int, 1)]  # endless, as a long --input is
from sesame.cli import main
sys.exit(main(["predict", "--model", "m"]))
"""


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """docs/xlnet.md pipes `sesame predict` into `head -n 2`: the closed pipe gave a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"a prediction\n"
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""
