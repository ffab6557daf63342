"""benchmarks/pure_bf16.py on tiny models: a JSON line per step and variant, and a pure-bf16 step that holds bfloat16
weights, steps float32 masters and copies them back."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")  # train_step.py, whose models and helpers the benchmark reuses, imports it

from sesame.runtime import native_bf16_cpu  # noqa: E402

from .conftest import load_script  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def pure_bf16():
    return load_script(BENCHMARKS / "pure_bf16.py", "pure_bf16")


def test_one_line_per_step_and_variant_against_fp32_and_autocast(capsys) -> None:
    pure_bf16().main(["--size", "tiny", "--threads", "1", "--rounds", "1", "--warmup", "0", "--json-only"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["bench"] for r in rows] == [f"{step}-{variant}" for step in ("mlm", "clm")
                                          for variant in ("fp32", "bf16-autocast", "bf16-pure")]
    for step in (rows[:3], rows[3:]):
        fp32, autocast, pure = step
        assert [r["config"]["precision"] for r in step] == ["fp32", "bf16", "bf16"]
        assert fp32["vs_fp32"] == autocast["vs_bf16_autocast"] == 1.0
        assert pure["vs_fp32"] == pytest.approx(pure["tokens_per_s"] / fp32["tokens_per_s"])
        assert pure["vs_bf16_autocast"] == pytest.approx(pure["tokens_per_s"] / autocast["tokens_per_s"])
        for row in step:
            assert len(row["s_per_step_by_round"]) == 1 and row["mfu"] > 0 and row["peak_ratio"] > 0
            assert row["native_bf16"] is native_bf16_cpu()


@pytest.mark.parametrize("step", ["mlm", "clm"])
def test_the_pure_step_holds_bf16_weights_and_steps_fp32_masters(step) -> None:
    bench = pure_bf16()
    contender = bench.contenders(step, bench.bench_config(step, "tiny"), seed=0)["bf16-pure"]
    pure = contender.step.__self__  # the step is a method of the PureBf16 that holds the weights
    assert pure.model is contender.model and len(pure.pairs) == len(list(pure.master.parameters()))
    assert all(low.dtype == torch.bfloat16 and high.dtype == torch.float32 for low, high in pure.pairs)
    before = [high.detach().clone() for _, high in pure.pairs]
    contender.step()
    for (_, high), old in zip(pure.pairs, before):  # every master has a float32 gradient and moved
        assert high.grad is not None and high.grad.dtype == torch.float32 and not torch.equal(high, old)
    assert all(torch.equal(low, high.to(torch.bfloat16)) for low, high in pure.pairs)  # copied back, rounded
