"""scripts/multi30k_bleu.py, scripts/text_vs_head.py and scripts/bart_init.py: what they select on, score and compare, without training."""
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import load_script

SCRIPTS = Path(__file__).parents[1] / "scripts"
multi30k = load_script(SCRIPTS / "multi30k_bleu.py", "multi30k_bleu")
text_vs_head = load_script(SCRIPTS / "text_vs_head.py", "text_vs_head")


def _val(root: Path, lines: int = 6) -> Path:
    """``root/multi30k/val.{en,de}``: ``lines`` numbered lines each."""
    (root / "multi30k").mkdir(parents=True)
    for lang in ("en", "de"):
        (root / "multi30k" / f"val.{lang}").write_text("".join(f"{lang} {i}\n" for i in range(lines)),
                                                       encoding="utf-8")
    return root


def test_multi30k_selects_on_the_first_val_lines_and_scores_the_rest(tmp_path):
    files = multi30k.split_val(_val(tmp_path / "data", lines=10), tmp_path / "out", dev_lines=3)
    for lang in ("en", "de"):
        dev = Path(f"{files['dev']}.{lang}").read_text(encoding="utf-8").splitlines()
        held = Path(f"{files['held']}.{lang}").read_text(encoding="utf-8").splitlines()
        assert dev == [f"{lang} {i}" for i in range(3)] and held == [f"{lang} {i}" for i in range(3, 10)]


def test_multi30k_table_has_every_row_and_its_examples(tmp_path):
    files = multi30k.split_val(_val(tmp_path), tmp_path, dev_lines=1)
    rows = [{"approach": name, "start": "s", "minutes": 1.5, "steps": 1234, "bleu_13a_uncased": bleu,
             "bleu_intl_cased": bleu, "examples": [f"{name} {i}" for i in range(multi30k.EXAMPLES)]}
            for name, bleu in (("t5", 7.3), ("mt-lstm", 2.0))]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    text = multi30k.table(tmp_path, files)
    assert "| t5 | s | 1.5 min | 1,234 | 7.30 | 7.30 |" in text and "| mt-lstm |" in text
    assert "- en 1 → reference: de 1" in text and "  - mt-lstm: mt-lstm 0" in text


def test_text_and_head_fine_tunes_get_the_same_budget(tmp_path, monkeypatch):
    """The two ways differ only in the task flags: same start, files, steps, batch, lr and length; each run's
    last and best dev accuracy are read back."""
    commands = []

    def run(command, check):
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        out.mkdir()
        rows = [{"step": 2, "split": "dev", "accuracy": 0.6}, {"step": 4, "split": "dev", "accuracy": 0.5}]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.setattr(subprocess, "run", run)
    args = text_vs_head.argparse.Namespace(data=tmp_path, steps=None, lr=2e-4)
    text = text_vs_head.finetune(tmp_path / "a", ["runs/t5"], "rte", "text", args)
    head = text_vs_head.finetune(tmp_path / "b", ["runs/t5"], "rte", "head", args)
    assert text["last"] == head["last"] == 0.5 and text["kept"] == 0.6 and text["steps"] == 4
    assert commands[0][commands[0].index("--epochs") + 1] == "3"  # RTE's three epochs

    def shared(command):
        task = command.index("--task")
        return [c for c in command[:task] if c not in (str(tmp_path / "a"), str(tmp_path / "b"))]

    assert shared(commands[0]) == shared(commands[1])
    assert "text2text" in commands[0] and "cast=pair" in commands[0] and "pair" in commands[1]


def test_scratch_twins_start_from_the_runs_family_size_and_tokenizer(tmp_path):
    run = tmp_path / "t5-mini"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"kind": "pretrained", "family": "t5", "size": "mini",
                                                        "model": {"arch": "encoder_decoder", "vocab_size": 8}}))
    rows = text_vs_head.starts({"t5": str(run)}, twins=True)
    assert rows == {"t5": [str(run)], "t5-scratch": ["scratch:t5:mini", "--tokenizer", str(run / "tokenizer.json")]}
    assert text_vs_head.starts({"t5": str(run)}, twins=False) == {"t5": [str(run)]}


def test_bart_init_refuses_a_non_positive_std(capsys):
    bart_init = load_script(SCRIPTS / "bart_init.py", "bart_init")
    try:
        bart_init.main(["--embedding-std", "0", "--size", "tiny"])
    except SystemExit as exit:
        assert exit.code == 2 and "--embedding-std 0.0: must be positive" in capsys.readouterr().err
    else:
        raise AssertionError("bart_init accepted --embedding-std 0")


def test_bart_init_wants_an_initialisation_to_change(capsys):
    bart_init = load_script(SCRIPTS / "bart_init.py", "bart_init")
    with pytest.raises(SystemExit) as exit:
        bart_init.main(["--size", "tiny"])
    assert exit.value.code == 2 and "give --embedding-std, --weight-init, --norm or several" in capsys.readouterr().err
