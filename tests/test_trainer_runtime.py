"""The trainer under a Placement (sesame.runtime) on the CPU: bf16 autocast training and resuming exactly with its
precision, fp16's gradient scaler (CPU autocast runs float16 too), and --compile with its fallback."""
import json

import torch
from torch import nn

import sesame
from sesame.runtime import Placement, Runtime
from sesame.train import RunSettings, TrainConfig, Trainer

from .device_helpers import TINY, same_weights, stopped_at_2_then_resumed


def test_bf16_on_the_cpu_trains_with_finite_loss_and_resumes_exactly_keeping_its_precision(corpus, tmp_path,
                                                                                          monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sesame.pretrain([str(corpus)], str(whole), max_steps=4, precision="bf16", device="cpu", **TINY)
    stopped_at_2_then_resumed(corpus, cut, monkeypatch, precision="bf16", device="cpu")
    losses = [r["loss"] for r in map(json.loads, (cut / "metrics.jsonl").read_text().splitlines())]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert json.loads((cut / "config.json").read_text())["runtime"]["precision"] == "bf16"
    assert same_weights(whole, cut)


def test_older_runs_precision_in_their_training_config_is_the_one_resume_takes():
    from sesame.resume import _runtime
    from sesame.specs import PretrainSpec
    from sesame.models import TransformerConfig
    from sesame.run import RunConfig

    spec = PretrainSpec(corpus="c", out="o")
    old = RunConfig(kind="pretrained", family="bert", model=TransformerConfig(vocab_size=8),
                    train={"precision": "bf16"})
    assert _runtime(spec, old).precision == "bf16"
    given = PretrainSpec(corpus="c", out="o", runtime=Runtime(precision="fp32"))
    assert _runtime(given, old).precision == "fp32"  # the runtime may change on resume (sesame.runtime)


# -- the trainer's fp16 path (its gradient scaler) on the CPU: CPU autocast runs float16 too -----------------

class Scaled(nn.Module):
    """Σ w·x over a batch: a model whose gradients a test can make overflow."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, batch):
        return (self.w * batch["x"]).sum()


def fp16_trainer(run, steps, x):
    batches = lambda step, progress: [{"ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.zeros(1),
                                       "x": x.clone()}]
    cfg = TrainConfig(max_steps=steps, save_every=2, eval_every=100, clip=0.0, warmup=0.0, lr=1e-3)
    placement = Placement(device=torch.device("cpu"), precision="fp16")
    return Trainer(Scaled(), RunSettings(run, cfg, placement=placement, progress=False), batches)


def test_fp16_saves_its_scaler_with_the_checkpoint_and_resume_restores_it(tmp_path):
    trainer = fp16_trainer(tmp_path / "run", 2, torch.ones(4))
    trainer.fit()
    state = json.loads((tmp_path / "run/checkpoint/trainer_state.json").read_text())
    assert state["scaler"]["scale"] == trainer.scaler.get_scale() == 65536.0
    state["scaler"]["scale"] = 1024.0  # a scale a longer run would have reached
    (tmp_path / "run/checkpoint/trainer_state.json").write_text(json.dumps(state))
    resumed = fp16_trainer(tmp_path / "run", 3, torch.ones(4))
    resumed.resume()
    assert resumed.scaler.get_scale() == 1024.0 and resumed.step == 2


def test_fp16_skips_a_step_whose_gradients_overflow_and_halves_the_scale(tmp_path):
    trainer = fp16_trainer(tmp_path / "run", 1, torch.full((4,), 1e37))  # finite loss, but x·scale overflows
    trainer.fit()
    assert torch.equal(trainer.model.w.detach(), torch.ones(4))  # the step was skipped
    assert trainer.scaler.get_scale() == 32768.0


def test_compile_falls_back_with_one_warning_where_it_fails(tmp_path, monkeypatch, capsys):
    class Failed(torch._dynamo.exc.TorchDynamoException):
        pass

    def failing(fn, **kwargs):
        def call(*args, **kw):
            raise Failed("no backend for this device")
        return call

    monkeypatch.setattr(torch, "compile", failing)
    batches = lambda step, progress: [{"ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.zeros(1),
                                       "x": torch.ones(4)}]
    cfg = TrainConfig(max_steps=3, save_every=100, eval_every=100, clip=0.0, warmup=0.0)
    placement = Placement(device=torch.device("cpu"), compile=True)
    trainer = Trainer(Scaled(), RunSettings(tmp_path / "run", cfg, placement=placement, progress=False), batches)
    trainer.fit()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "--compile" in line]
    assert len(warnings) == 1 and "running it uncompiled" in warnings[0] and "Failed" in warnings[0]
    assert trainer.step == 3 and not torch.equal(trainer.model.w.detach(), torch.ones(4))


def test_compile_wraps_the_training_forward_pass(tmp_path, monkeypatch):
    compiled = []

    def fake(fn, **kwargs):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake)
    model = Scaled()
    batches = lambda step, progress: [{"ids": torch.zeros(1, 4, dtype=torch.long), "targets": torch.zeros(1),
                                       "x": torch.ones(4)}]
    cfg = TrainConfig(max_steps=1, save_every=100, eval_every=100)
    placement = Placement(device=torch.device("cpu"), compile=True)
    Trainer(model, RunSettings(tmp_path / "run", cfg, placement=placement, progress=False), batches).fit()
    assert compiled == [model]

