"""metrics.jsonl and its TensorBoard mirror (sesame.train.metrics_log)."""
import json
import sys

import pytest

import sesame
from sesame.errors import SesameError
from sesame.train import Trainer
from sesame.train.metrics_log import MetricsLog, _tensorboard, read_metrics, scalars

TINY = dict(family="bert", size="tiny", vocab_size=200, seq_len=32, batch_size=8, eval_every=4, progress=False)


class Killed(Exception):
    """What a SIGKILL does to the run, without the process: nothing after it is saved."""


def board(run) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for ``run``: (step, value) by tag, read back with its own loader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def logged(run) -> dict[str, list[tuple[int, float]]]:
    """The same, read from metrics.jsonl."""
    found: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(run / "metrics.jsonl"):
        for tag, value in scalars(record).items():
            found.setdefault(tag, []).append((record["step"], value))
    return found


def test_scalars_are_the_numbers_of_a_record_by_split_and_name():
    record = {"step": 3, "split": "dev", "accuracy": 0.5, "n": 40, "per_class": {"cat": {"f1": 1.0}},
              "kept": True, "label": "cat", "confusion": [[1, 0], [0, 1]]}
    assert scalars(record) == {"dev/accuracy": 0.5, "dev/n": 40.0, "dev/per_class/cat/f1": 1.0}


def test_every_jsonl_scalar_is_in_tensorboard_at_its_step_also_after_a_kill_and_resume(corpus, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the optional TensorBoard files need `pip install tensorboard`")
    options = {**TINY, "max_steps": 14, "save_every": 8}
    original = Trainer._train_step

    def killed_at_eleven(self, wrapped):
        if self.step == 11:
            raise Killed  # steps 9-11 and the records of step 10 are after the checkpoint of step 8
        return original(self, wrapped)

    monkeypatch.setattr(Trainer, "_train_step", killed_at_eleven)
    with pytest.raises(Killed):
        sesame.pretrain([str(corpus)], str(tmp_path / "run"), **options)
    run = tmp_path / "run"
    assert max(r["step"] for r in read_metrics(run / "metrics.jsonl")) == 10
    monkeypatch.setattr(Trainer, "_train_step", original)
    sesame.pretrain([str(corpus)], str(run), resume=True, **options)

    jsonl = logged(run)
    assert {"train/loss", "train/lr", "train/tokens_per_s", "dev/loss", "dev/perplexity"} <= set(jsonl)
    assert [step for step, _ in jsonl["train/loss"]] == [1, 10]  # step 10 logged again, once
    assert [step for step, _ in jsonl["dev/loss"]] == [4, 8, 12, 14]
    shown = board(run)
    assert set(shown) == set(jsonl)
    for tag, points in jsonl.items():  # TensorBoard keeps float32
        assert [s for s, _ in shown[tag]] == [s for s, _ in points], tag
        assert [v for _, v in shown[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
    assert len(list((run / "tensorboard").iterdir())) == 2  # one event file per command


def test_without_tensorboard_the_log_is_unchanged_and_says_once_how_to_enable(tmp_path, monkeypatch, capsys):
    for name in ["tensorboard", *(n for n in sys.modules if n.startswith("tensorboard."))]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails, as when it is not installed
    _tensorboard.cache_clear()
    try:
        log = MetricsLog(tmp_path)
        for step in (1, 10):
            log.append({"step": step, "split": "train", "loss": 1.0 / step})
        MetricsLog(tmp_path).append({"step": 10, "split": "dev", "loss": 0.2})
    finally:
        _tensorboard.cache_clear()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 10, 10]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "pip install" in err[0], err


def test_a_bad_line_is_named_and_a_last_line_being_written_is_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "split": "train", "loss": 2.0}\n{"step": 2, "spl')
    assert read_metrics(path) == [{"step": 1, "split": "train", "loss": 2.0}]
    path.write_text('{"step": 1, "split": "train"}\n[1, 2]\n')
    with pytest.raises(SesameError, match="metrics.jsonl, line 2: not a metrics record"):
        read_metrics(path)
