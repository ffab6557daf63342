import json
import sys
import time

import pytest
import torch

import sesame
from sesame.errors import SesameError
from sesame.runtime import Placement
from sesame.train import Interrupted, RunSettings, TrainConfig, Trainer
from sesame.train.checkpoint import load_weights
from sesame.train.optim import linear_warmup_decay
from sesame.train.trainer import LOG_EVERY

TINY = dict(family="bert", size="tiny", vocab_size=200, seq_len=32, batch_size=8, eval_every=4, save_every=4,
            progress=False)


def train_losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]


def test_schedule_warms_up_then_decays_linearly():
    assert linear_warmup_decay(0.0, 0.1) == 0.0
    assert linear_warmup_decay(0.05, 0.1) == pytest.approx(0.5)
    assert linear_warmup_decay(0.1, 0.1) == pytest.approx(1.0)
    assert linear_warmup_decay(0.55, 0.1) == pytest.approx(0.5)
    assert linear_warmup_decay(1.0, 0.1) == 0.0


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(family, corpus, tmp_path, monkeypatch):
    options = {**TINY, "family": family, "max_steps": 12}  # each run trains its tokenizer: the same one
    sesame.pretrain([str(corpus)], str(tmp_path / "straight"), **options)

    original = Trainer._train_step

    def stop_after_six(self, wrapped):
        result = original(self, wrapped)
        if self.step == 6:
            self._stop_requested = True  # what Ctrl-C does
        return result

    monkeypatch.setattr(Trainer, "_train_step", stop_after_six)
    with pytest.raises(Interrupted, match="step 6"):
        sesame.pretrain([str(corpus)], str(tmp_path / "resumed"), **options)
    monkeypatch.setattr(Trainer, "_train_step", original)
    assert json.loads((tmp_path / "resumed/checkpoint/trainer_state.json").read_text())["step"] == 6
    sesame.pretrain([str(corpus)], str(tmp_path / "resumed"), resume=True, **options)

    assert train_losses(tmp_path / "resumed") == pytest.approx(train_losses(tmp_path / "straight"), rel=1e-6)
    a = load_weights(tmp_path / "straight/model.safetensors")
    b = load_weights(tmp_path / "resumed/model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_accumulation_gives_the_same_update(corpus, tmp_path):
    sesame.pretrain([str(corpus)], str(tmp_path / "one"), max_steps=3, dropout=0.0, **TINY)
    shards = str(tmp_path / "one" / "shards")  # same shards and tokenizer
    sesame.pretrain([shards], str(tmp_path / "four"), max_steps=3, dropout=0.0, accumulate=4, **TINY)
    assert train_losses(tmp_path / "four") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)


def test_pretraining_lowers_the_loss(corpus, tmp_path):
    metrics = sesame.pretrain([str(corpus)], str(tmp_path / "run"), max_steps=60, lr=2e-3, **TINY)
    losses = train_losses(tmp_path / "run")
    assert losses[-1] < losses[0] - 1.0
    # BERT trains MLM + NSP: the loss is their sum, the perplexity the masked LM's
    assert metrics["loss"] == pytest.approx(metrics["mlm_loss"] + metrics["nsp_loss"], rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(2.718281828 ** metrics["mlm_loss"], rel=1e-6)


def test_budgets_are_checked_before_anything_is_written(corpus, tmp_path):
    for bad in ({"max_steps": -1}, {"max_minutes": 0}, {"max_minutes": -2.5}):
        with pytest.raises(SesameError, match="--max-"):
            sesame.pretrain([str(corpus)], str(tmp_path / "run"), **{**TINY, **bad})
    assert not (tmp_path / "run").exists()


def test_a_trainer_takes_its_run_settings_whole_and_its_hooks_by_name(tmp_path):
    cfg, before = TrainConfig(max_steps=1), time.time()
    settings = RunSettings(tmp_path / "run", cfg)
    trainer = Trainer(torch.nn.Linear(2, 1), settings, lambda step, progress: [])
    assert trainer.run == tmp_path / "run" and trainer.config is cfg and trainer.progress
    assert trainer.placement == Placement.cpu() and before <= trainer.started <= time.time()  # the defaults
    with pytest.raises(TypeError):
        RunSettings(tmp_path / "run", cfg, Placement.cpu())  # what follows the config is named
    with pytest.raises(TypeError):
        Trainer(torch.nn.Linear(2, 1), settings, lambda step, progress: [], lambda model: {})  # and so are the hooks


def test_a_time_budget_reads_dev_at_each_of_its_eval_points_and_schedules_by_the_clock(tmp_path, monkeypatch):
    """Under --max-minutes dev is read as each 1/eval_points of the time is spent, however few steps the machine
    makes, and the rate warms up and decays with the time (issue 37). A clock that moves 3 s per step's forward pass
    (a 1-minute budget: 20 steps) stands for the machine."""
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])

    def batches(step, progress):
        return [{"ids": torch.ones(1, 1), "targets": torch.ones(1)}]

    class Squared(torch.nn.Linear):
        def forward(self, batch):
            clock[0] += 3.0
            return super().forward(batch["ids"]).pow(2).sum()

    def run(name, **options):
        cfg = TrainConfig(max_steps=None, max_minutes=1, eval_every=1000, save_every=1000, warmup=0.25, **options)
        settings, read_at = RunSettings(tmp_path / name, cfg, progress=False, started=clock[0]), []
        trainer = Trainer(Squared(1, 1), settings, batches,
                          evaluate=lambda model: read_at.append(trainer.step) or {"x": 0.0})
        trainer.fit()
        return read_at, [r["lr"] for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())
                         if r["split"] == "train"]

    read_at, rates = run("points", eval_points=4)
    assert read_at == [6, 11, 16, 20]  # steps 6, 11, 16 begin at 25%, 50%, 75% of the minute; the end
    assert run("none", eval_points=0)[0] == [20]
    # logged at steps 1, 10, 20: warming up over the first 15 s, then down to 0 at the minute
    assert rates == pytest.approx([0.0, 5e-4 * (1 - 27 / 60) / 0.75, 5e-4 * (1 - 57 / 60) / 0.75])


def test_bf16_runs_the_forward_pass_in_bfloat16_and_keeps_fp32_weights(corpus, tmp_path, monkeypatch):
    seen = set()
    original = torch.nn.Linear.forward

    def record(self, x):
        out = original(self, x)
        seen.add(out.dtype)
        return out

    monkeypatch.setattr(torch.nn.Linear, "forward", record)
    sesame.pretrain([str(corpus)], str(tmp_path / "run"), max_steps=60, lr=2e-3, precision="bf16", **TINY)
    assert torch.bfloat16 in seen  # matrix products under autocast
    losses = train_losses(tmp_path / "run")
    assert losses[-1] < losses[0] - 1.0  # and it trains as fp32 does (test above)
    weights = load_weights(tmp_path / "run/model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.float32}
    assert json.loads((tmp_path / "run/config.json").read_text())["runtime"]["precision"] == "bf16"
    with pytest.raises(SesameError, match="--precision fp16: float16 training needs a CUDA GPU"):
        sesame.pretrain([str(corpus)], str(tmp_path / "bad"), max_steps=2, precision="fp16", device="cpu", **TINY)
    assert not (tmp_path / "bad").exists()


class Squares(torch.nn.Linear):
    """A one-weight model whose loss is a square: no host reads of its own."""

    def __init__(self):
        super().__init__(1, 1)

    def forward(self, batch):
        return super().forward(batch["ids"]).pow(2).sum()


def one_example(step, progress):
    return [{"ids": torch.ones(1, 1), "targets": torch.ones(1)}]


def test_the_host_reads_the_loss_from_the_device_only_where_it_is_logged_or_checked(tmp_path, monkeypatch):
    """No host-device synchronisation per step (issue 35): sesame's reads of tensor values (item, tolist, float,
    int, bool) during 40 steps are those of the records at steps 1, 10, 20, 30, 40 and of the end's check."""
    reads = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if sys._getframe(1).f_globals.get("__name__", "").startswith("sesame"):
                reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    cfg = TrainConfig(max_steps=40, eval_every=1000, save_every=1000)
    Trainer(Squares(), RunSettings(tmp_path / "run", cfg, progress=False), one_example).fit()
    assert len(reads) <= 40 // LOG_EVERY + 2, reads


def test_a_non_finite_loss_between_records_is_caught_before_anything_is_saved(tmp_path):
    class Diverging(Squares):
        def forward(self, batch):
            loss = super().forward(batch)
            return loss * float("nan") if trainer.step == 3 else loss

    trainer = Trainer(Diverging(), RunSettings(tmp_path / "run", TrainConfig(max_steps=5), progress=False),
                      one_example)
    with pytest.raises(SesameError, match="loss became nan by step 5"):
        trainer.fit()
    assert not (tmp_path / "run/model.safetensors").exists() and not (tmp_path / "run/checkpoint").exists()
