"""Batches built one step ahead on a background thread (issue 35): the model trains on exactly the batches of each
step and phase, a prefetch of the wrong phase is dropped, and no thread outlives the training loop."""
import threading
import time

import pytest
import torch

from sesame.errors import SesameError
from sesame.train import Interrupted, RunSettings, TrainConfig, Trainer
from sesame.train.prefetch import THREAD_NAME, Phased, Prefetcher

SWITCH = 0.9


def batch_of(step: int, phase: int) -> list[dict]:
    """A batch that says which step and phase it was built for."""
    return [{"ids": torch.tensor([[float(step), float(phase)]]), "targets": torch.ones(1)}]


class Recorder(torch.nn.Module):
    """Records the (step, phase) of every batch it is given; its loss is a square of one weight."""

    def __init__(self):
        super().__init__()
        self.weight, self.seen = torch.nn.Parameter(torch.ones(())), []

    def forward(self, batch):
        self.seen.append(tuple(int(v) for v in batch["ids"][0]))
        return (self.weight * batch["ids"].sum()).pow(2) * 1e-6


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def test_a_prefetch_of_the_wrong_phase_is_dropped_and_one_of_the_right_phase_is_used_as_built():
    built = []
    source = Phased(lambda step, phase: built.append((step, phase)) or batch_of(step, phase),
                    lambda progress: int(progress >= SWITCH))
    prefetcher = Prefetcher(source, stage=lambda batch: batch)
    try:
        prefetcher.ahead(3, 0.5)
        assert prefetcher.take(3, 0.6)[0]["ids"].tolist() == [[3.0, 0.0]]  # same phase: the batch built ahead
        prefetcher.ahead(4, 0.85)
        assert prefetcher.take(4, 0.95)[0]["ids"].tolist() == [[4.0, 1.0]]  # the clock crossed the switch
        assert prefetcher.take(5, 0.97)[0]["ids"].tolist() == [[5.0, 1.0]]  # nothing ahead: built now
    finally:
        prefetcher.close()
    assert built == [(3, 0), (4, 0), (4, 1), (5, 1)]
    assert not prefetch_threads()


def test_under_a_time_budget_each_step_trains_on_the_phase_its_progress_is_in(tmp_path, monkeypatch):
    """A clock that moves 3 s per forward pass (a 1-minute budget: 20 steps): the next step's batches are built
    for the phase of the progress expected then, one step behind the clock, so the switch's step is built twice."""
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    built = []
    source = Phased(lambda step, phase: built.append((step, phase)) or batch_of(step, phase),
                    lambda progress: int(progress >= SWITCH))
    progress_at = []

    class Timed(Recorder):
        def forward(self, batch):
            progress_at.append(trainer.step_progress)
            clock[0] += 3.0
            return super().forward(batch)

    model = Timed()
    cfg = TrainConfig(max_steps=None, max_minutes=1, eval_every=1000, save_every=1000)
    trainer = Trainer(model, RunSettings(tmp_path / "run", cfg, progress=False, started=clock[0]), source)
    trainer.fit()
    assert [step for step, _ in model.seen] == list(range(20))
    assert [phase for _, phase in model.seen] == [int(p >= SWITCH) for p in progress_at]
    assert 0 < sum(phase for _, phase in model.seen) < 20
    switch = next(step for step, phase in model.seen if phase)
    assert (switch, 0) in built and (switch, 1) in built  # built ahead for the first phase, then again


def test_a_failing_batch_stops_training_with_its_error_and_no_thread_left(tmp_path):
    def batches(step, progress):
        if step == 3:
            raise SesameError("--corpus: a broken window")
        return batch_of(step, 0)

    trainer = Trainer(Recorder(), RunSettings(tmp_path / "run", TrainConfig(max_steps=10), progress=False), batches)
    with pytest.raises(SesameError, match="broken window"):
        trainer.fit()
    assert [step for step, _ in trainer.model.seen] == [0, 1, 2]
    assert not prefetch_threads()


def test_an_error_in_the_step_while_a_batch_is_being_built_leaves_no_thread(tmp_path):
    started = threading.Event()

    def batches(step, progress):
        if step == 1:
            started.set()
            time.sleep(0.5)  # still building when step 0 fails
        return batch_of(step, 0)

    class Failing(Recorder):
        def forward(self, batch):
            started.wait(timeout=30)
            raise RuntimeError("out of memory")

    trainer = Trainer(Failing(), RunSettings(tmp_path / "run", TrainConfig(max_steps=10), progress=False), batches)
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.fit()
    assert not prefetch_threads()


def test_ctrl_c_while_a_batch_is_being_built_saves_and_leaves_no_thread(tmp_path):
    def batches(step, progress):
        if step == 2:
            time.sleep(0.5)
        return batch_of(step, 0)

    class Stopped(Recorder):
        def forward(self, batch):
            if trainer.step == 1:
                trainer._stop_requested = True  # what Ctrl-C does
            return super().forward(batch)

    trainer = Trainer(Stopped(), RunSettings(tmp_path / "run", TrainConfig(max_steps=10), progress=False), batches)
    with pytest.raises(Interrupted, match="step 2"):
        trainer.fit()
    assert (tmp_path / "run/checkpoint/trainer_state.json").exists()
    assert not prefetch_threads()


def test_the_model_is_given_no_padding_mask_for_a_batch_with_nothing_padded(tmp_path):
    """Whether a batch pads anything is decided where it is built, on the CPU: a mask that is all True reaches the
    model as None (so it never asks a device, which would make the host wait every step), a mask that pads keeps its
    values, and the built batch itself keeps its mask."""
    full, padded = torch.ones(2, 3, dtype=torch.bool), torch.tensor([[True, True, True], [True, True, False]])
    built = {step: [{"ids": torch.ones(2, 3), "padding": mask, "targets": torch.ones(1)}]
             for step, mask in enumerate([full, padded, full])}

    class Masks(Recorder):
        def forward(self, batch):
            self.seen.append(batch["padding"])
            return (self.weight * batch["ids"].sum()).pow(2) * 1e-6

    trainer = Trainer(Masks(), RunSettings(tmp_path / "run", TrainConfig(max_steps=3), progress=False),
                      lambda step, progress: built[step])
    trainer.fit()
    first, second, third = trainer.model.seen
    assert first is None and third is None and torch.equal(second, padded)
    assert all(batches[0]["padding"] is not None for batches in built.values())
