"""benchmarks/ulmfit_vs_fastai.py: its smoke mode (both libraries' ULMFiT classifiers, stage by stage, on real data;
needs fastai) and its --drop-mult, checked and recorded (without fastai)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script, shared_data

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ulmfit_vs_fastai.py"
NO_FASTAI = "the fastai extra is not installed (pip install -c constraints.txt -e '.[fastai]')"


@pytest.mark.slow
def test_both_sides_run_every_stage_from_every_start_and_a_rerun_reuses_them(tmp_path: Path, capsys, one_thread):
    pytest.importorskip("fastai", reason=NO_FASTAI)
    shared_data()
    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    benchmark.main(["--out", str(tmp_path / "out"), "--smoke"])
    results = json.loads((tmp_path / "out/results.json").read_text())
    assert results["settings"]["drop_mult"] == 0.5
    assert results["lm/fastai"]["steps"] > 0 and results["lm/sesame"]["perplexity"] > 1
    runs = [f"{start}/{side}/0" for start in ("scratch", "pretrained") for side in ("sesame", "fastai")]
    for run in [results[key] for key in runs + ["fastai-lm/sesame/0"]]:  # fastai-lm's fastai side is pretrained's
        assert list(run["stages"]) == list(benchmark.STAGES) and len(run["epochs"]) == 5
        assert all(0 <= s["accuracy"] <= 1 and s["seconds"] > 0 for s in run["stages"].values())
        assert run["stages"]["all"]["accuracy"] == run["epochs"][-1]
    table = capsys.readouterr().out.split("| start |", 1)[1]
    assert table.count("| scratch |") == 4 and table.count("| own LM |") == 4 and table.count("| fastai's LM |") == 4
    before = (tmp_path / "out/results.json").read_text()
    benchmark.main(["--out", str(tmp_path / "out"), "--smoke"])  # every stage recorded: nothing runs again
    assert (tmp_path / "out/results.json").read_text() == before


def every_stage_recorded(benchmark, out: Path, settings: dict) -> None:
    """``out/results.json`` as a finished run of the full benchmark leaves it: main only checks the settings and
    prints the table."""
    stages = {"stages": {name: {"accuracy": 0.7, "seconds": 1.0} for name in benchmark.STAGES}, "epochs": [0.7] * 5}
    out.mkdir()
    (out / "results.json").write_text(json.dumps({
        "settings": settings, "lm/sesame": {"perplexity": 900.0}, "lm/fastai": {"perplexity": 500.0},
        **{f"{start}/{side}/0": stages for start in ("scratch", "pretrained") for side in ("sesame", "fastai")},
        "fastai-lm/sesame/0": stages}))


def test_a_run_recorded_before_drop_mult_is_the_defaults_and_refuses_another(tmp_path: Path, capsys):
    shared_data()  # the table reads airline dev's majority class
    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    out = tmp_path / "out"
    every_stage_recorded(benchmark, out, {**benchmark.FULL, "lm_minutes": 20.0, "epochs": 5})
    benchmark.main(["--out", str(out)])
    assert "both classifiers' dropouts x 0.5 (--drop-mult)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        benchmark.main(["--out", str(out), "--drop-mult", "1"])
    assert "made with other settings" in capsys.readouterr().err


def test_drop_mult_is_checked_by_sesames_rule_before_anything_is_written(tmp_path: Path, capsys):
    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    with pytest.raises(SystemExit):
        benchmark.main(["--out", str(tmp_path / "out"), "--drop-mult", "2.5"])
    assert "--drop-mult 2.5: makes" in capsys.readouterr().err and not (tmp_path / "out").exists()


class Stop(Exception):
    """Raised by a stand-in for a library's model builder once it has seen its arguments."""


def stop_with(given: dict):
    def builder(*args, **kwargs):
        given.update(kwargs)
        raise Stop
    return builder


def test_sesames_classifier_takes_the_drop_mult(tmp_path: Path, monkeypatch):
    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    given = {}
    monkeypatch.setattr(benchmark.api, "finetune", stop_with(given))
    with pytest.raises(Stop):
        benchmark.sesame_classifier("scratch:ulmfit:tiny", benchmark.real_data(), tmp_path / "run", benchmark.SMOKE, 5,
                                    0, drop_mult=1.0)
    assert given["drop_mult"] == 1.0 and given["dropout"] == benchmark.OUTPUT_DROPOUT


def test_fastais_classifier_takes_the_drop_mult(monkeypatch):
    fastai_text = pytest.importorskip("fastai.text.all", reason=NO_FASTAI)
    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    given = {}
    monkeypatch.setattr(fastai_text, "get_text_classifier", stop_with(given))
    inputs = {"train": [([5, 6], 0)] * 4, "dev": [([5, 6], 1)] * 2, "vocab_size": 10, "pad": 1, "labels": ["a", "b"]}
    with pytest.raises(Stop):
        benchmark.fastai_classifier(inputs, None, benchmark.SMOKE, 5, 0, drop_mult=1.0)
    assert given["drop_mult"] == 1.0


def test_fastais_lm_encoder_becomes_a_sesame_run_with_the_same_tensors(tmp_path: Path, corpus):
    """Without fastai: an encoder named as fastai's AWD_LSTM names it (WeightDropout's ``weight_hh_l0_raw``, the
    embedding dropout's copy of the embedding), made of a sesame LM's own tensors, maps back onto them exactly."""
    import sesame
    from sesame.train.checkpoint import load_weights, save_weights

    benchmark = load_script(SCRIPT, "ulmfit_vs_fastai")
    lm = tmp_path / "lm"
    sesame.pretrain([str(corpus)], str(lm), family="ulmfit", size="tiny", max_steps=1, batch_size=4, seq_len=16,
                    vocab_size=300, progress=False)
    own = load_weights(lm / "model.safetensors")
    fastai = {"encoder.weight": own["backbone.embed.tokens.weight"],
              "encoder_dp.emb.weight": own["backbone.embed.tokens.weight"].clone()}
    for key, tensor in own.items():
        if key.startswith("backbone.layers."):
            layer, name = key.split(".")[2], key.split(".")[-1]
            fastai[f"rnns.{layer}.weight_hh_l0_raw" if name == "weight_hh_l0" else f"rnns.{layer}.module.{name}"] = (
                tensor + 1)  # + 1: not sesame's own values, so a mix-up of names shows
    save_weights(tmp_path / "encoder.safetensors", fastai)
    run = benchmark.sesame_run_of_fastai_lm(lm, tmp_path / "encoder.safetensors", tmp_path / "as-sesame")
    converted = load_weights(run / "model.safetensors")
    assert converted.keys() == own.keys()
    for key, tensor in own.items():
        shift = 0 if key == "backbone.embed.tokens.weight" else 1
        assert (converted[key] == tensor + shift).all(), key
    assert (run / "config.json").read_text() == (lm / "config.json").read_text()
