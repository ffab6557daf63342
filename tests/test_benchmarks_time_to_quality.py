"""benchmarks/time_to_quality.py --smoke: its plumbing, not its numbers. Every stage runs on tiny cuts of the real
data sets and is recorded; the page holds a row per task, labels and budget, with MiniLM's skip and its reason where
the weights are absent; a second command redoes nothing, and one whose stage was lost redoes that stage alone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import sesame

from .conftest import load_script, shared_data

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_quality.py"


def test_smoke_runs_every_stage_records_it_and_resumes(tmp_path, monkeypatch, one_thread) -> None:
    data = shared_data()
    benchmark = load_script(SCRIPT, "time_to_quality")
    monkeypatch.setattr(benchmark, "minilm_missing", lambda: "minilm: the MiniLM weights are not installed")
    argv = ["--smoke", "--seeds", "1", "--data", str(data), "--out", str(tmp_path / "ttq")]
    results = benchmark.main(argv)

    budget = benchmark.SMOKE["budgets"][0]
    for task in ("airline", "sst2"):
        assert results[f"{task}/pretrain/{budget:g}"]["size"] == "tiny"
        for labels in ("32", "all"):
            assert 0 <= results[f"{task}/{labels}/tfidf"]["accuracy"] <= 1
            assert results[f"{task}/{labels}/minilm/seed0"]["skipped"] == "minilm: the MiniLM weights are not installed"
            for twin in ("pretrained", "scratch", "counts"):
                assert 0 <= results[f"{task}/{labels}/{budget:g}/{twin}/seed0"]["accuracy"] <= 1
    assert sum(1 for line in (tmp_path / "ttq/sst2-train-32.tsv").read_text().splitlines()) == 33  # header + 32
    page = (tmp_path / "ttq/time_to_quality.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith(("| airline |", "| sst2 |"))]
    assert len(rows) == 4 and all("| skipped |" in row for row in rows)
    assert "MiniLM skipped: minilm: the MiniLM weights are not installed" in page
    assert (tmp_path / "ttq/time_to_quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    ran = []
    monkeypatch.setattr(sesame, "pretrain", lambda *args, **kwargs: pytest.fail("pre-trained again"))
    monkeypatch.setattr(sesame, "finetune", lambda base, *args, **kwargs: ran.append(base) or {"accuracy": 0.5})
    assert benchmark.main(argv) == results and ran == []  # every stage was recorded
    record = tmp_path / "ttq/results.json"
    lost = f"sst2/all/{budget:g}/scratch/seed0"
    record.write_text(json.dumps({k: v for k, v in results.items() if k != lost}))
    assert benchmark.main(argv)[lost]["accuracy"] == 0.5
    assert ran == [f"scratch:{tmp_path / 'ttq' / f'pretrained-sst2-{budget:g}min'}"]


def test_an_ablation_reaches_sesame_gets_its_own_block_and_cannot_mix_with_other_runs(tmp_path, monkeypatch) -> None:
    benchmark = load_script(SCRIPT, "time_to_quality")
    assert benchmark.keyword("objective=mlm") == ("objective", "mlm")
    assert benchmark.keyword("mask_prob=0.3") == ("mask_prob", 0.3)
    with pytest.raises(SystemExit) as bad:
        benchmark.main(["--out", str(tmp_path / "bad"), "--pretrain-option", "objective"])
    assert bad.value.code == 2 and not (tmp_path / "bad").exists()

    seen = []
    monkeypatch.setattr(benchmark, "pretrained", lambda corpus, task, run, budget, settings, runtime:
                        seen.append((corpus, settings.pretrain)) or {"size": "mini"})
    monkeypatch.setattr(benchmark, "finetuned", lambda base, task, train, run, seed, settings, runtime:
                        seen.append(settings.finetune) or {"accuracy": 0.5})
    monkeypatch.setattr(benchmark, "tfidf_baseline", lambda files, seed: {"dev": {"accuracy": 0.75}})
    page = tmp_path / "page.md"
    out = tmp_path / "ttq-mlm"
    argv = ["--out", str(out), "--data", str(shared_data()), "--budgets", "15", "--labels", "1000", "--seeds", "1",
            "--tasks", "airline", "--approaches", "pretrained", "scratch", "tfidf", "--markdown", str(page),
            "--pretrain-option", "objective=mlm", "--finetune-option", "lr=0.001", "--task-text-only"]
    results = benchmark.main(argv)
    assert seen == [([], {"objective": "mlm"}), {"lr": 0.001}, {"lr": 0.001}]  # the task's texts alone
    assert results["ablation"]["changes"] == ["corpus=task", "pretrain.objective=mlm", "finetune.lr=0.001"]
    text = page.read_text()
    assert "<!-- time-to-quality corpus=task pretrain.objective=mlm finetune.lr=0.001:start -->" in text
    assert "--pretrain-option objective=mlm" in text and "| airline | 1000 | 15 | 50.0 ± 0.0 | 50.0 ± 0.0 | +0.0 | not run | 75.0 | not run |" in text
    assert (tmp_path / "time_to_quality_corpus-task_pretrain.objective-mlm_finetune.lr-0.001.png").exists()

    before = (out / "results.json").read_bytes()
    with pytest.raises(SystemExit) as mixed:  # the defaults into the ablation's folder
        benchmark.main([arg for arg in argv if arg not in ("--pretrain-option", "objective=mlm", "--finetune-option",
                                                           "lr=0.001", "--task-text-only")])
    assert mixed.value.code == 2 and (out / "results.json").read_bytes() == before


def test_a_json_option_names_its_ablation_compactly_and_its_plot_a_plain_file() -> None:
    benchmark = load_script(SCRIPT, "time_to_quality")
    args = benchmark.parser().parse_args(["--out", "x", "--pretrain-option", 'model_options={"norm": "pre"}',
                                          "--pretrain-option", "mixing_temperature=3"])
    changes = benchmark.changes(args)
    assert changes == ['pretrain.model_options={"norm":"pre"}', "pretrain.mixing_temperature=3"]
    assert benchmark.figure_name(changes) == \
        "time_to_quality_pretrain.model_options-norm-pre-_pretrain.mixing_temperature-3.png"
    assert benchmark.figure_name(["pretrain.size=auto"]) == "time_to_quality_pretrain.size-auto.png"  # as before


def test_a_fine_tuning_ablation_reuses_the_runs_another_folder_pre_trained(tmp_path, monkeypatch, capsys) -> None:
    benchmark = load_script(SCRIPT, "time_to_quality")
    theirs = tmp_path / "ttq-mlm"
    theirs.mkdir()
    (theirs / "results.json").write_text(json.dumps({"ablation": {"changes": ["pretrain.objective=mlm"]},
                                                     "airline/pretrain/15": {"size": "mini", "steps": 9}}))
    bases = []
    monkeypatch.setattr(benchmark, "pretrained", lambda *args: pytest.fail("pre-trained again"))
    monkeypatch.setattr(benchmark, "finetuned", lambda base, task, train, run, seed, settings, runtime:
                        bases.append((base, settings.finetune)) or {"accuracy": 0.5})
    argv = ["--out", str(tmp_path / "mean"), "--data", str(shared_data()), "--budgets", "15", "--labels", "1000",
            "--seeds", "1", "--tasks", "airline", "--approaches", "pretrained", "scratch", "--markdown",
            str(tmp_path / "page.md"), "--pretrain-option", "objective=mlm", "--finetune-option", "pooling=mean"]
    results = benchmark.main([*argv, "--pretrained-from", str(theirs)])
    run = theirs / "pretrained-airline-15min"
    assert bases == [(str(run), {"pooling": "mean"}), (f"scratch:{run}", {"pooling": "mean"})]
    assert results["airline/pretrain/15"]["steps"] == 9
    other = [{"objective=mlm": "objective=mlm_nsp", str(tmp_path / "mean"): str(tmp_path / "nsp")}.get(arg, arg)
             for arg in argv]
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # another pre-training than the folder's
        benchmark.main([*other, "--pretrained-from", str(theirs)])
    assert refused.value.code == 2
    assert "pre-trained with ['pretrain.objective=mlm'], not ['pretrain.objective=mlm_nsp']" in capsys.readouterr().err


def test_a_missing_data_file_exits_2_naming_it_before_anything_is_written(tmp_path, capsys) -> None:
    benchmark = load_script(SCRIPT, "time_to_quality")
    data = tmp_path / "data"
    (data / "airline").mkdir(parents=True)
    (data / "airline/train.csv").write_text("text,airline_sentiment\ngood,positive\n")
    with pytest.raises(SystemExit) as missing:
        benchmark.main(["--data", str(data), "--out", str(tmp_path / "ttq"), "--tasks", "airline"])
    assert missing.value.code == 2
    assert f"{data / 'airline/dev.csv'} not found: point --data (or SESAME_DATA)" in capsys.readouterr().err
    assert not (tmp_path / "ttq").exists()
