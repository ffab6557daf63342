"""benchmarks/train_step.py and benchmarks/precision_loss.py on tiny models: the JSON lines of every variant."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from sesame.objectives.plm import permutation_masks  # noqa: E402
from sesame.runtime import native_bf16_cpu  # noqa: E402

from .conftest import load_script  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY = ["--size", "tiny", "--threads", "1"]


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def train_step():
    return load_script(BENCHMARKS / "train_step.py", "train_step")


def test_each_precision_against_transformers_and_against_fp32(capsys) -> None:
    train_step().main([*TINY, "--rounds", "2", "--which", "all", "--json-only"])
    rows = json_lines(capsys.readouterr().out)
    assert [r["bench"] for r in rows] == [f"{step}-{variant}" for step in ("mlm", "clm", "t5", "bart", "xlnet")
                                          for variant in ("fp32", "bf16", "bf16-vs-fp32")]
    for row in (r for r in rows if "config" in r):
        assert row["config"]["precision"] == row["bench"].split("-")[1] and row["config"]["compile"] is False
        assert row["ratio"] == pytest.approx(row["sesame_tokens_per_s"] / row["transformers_tokens_per_s"])
        assert len(row["sesame_s_per_step_by_round"]) == 1
        assert row["sesame_mfu"] > 0 and row["transformers_mfu"] > 0
        if row["config"]["precision"] == "fp32" or native_bf16_cpu():  # the peak beats what a model reaches
            assert row["sesame_mfu"] <= 1 and row["transformers_mfu"] <= 1
        assert row["sesame_compiled"] is row["transformers_compiled"] is False and row["sesame_graph_breaks"] is None
        assert row["config"]["device"] == "cpu" and row["sesame_peak_step_memory_mib"] is None  # CUDA only
    mlm_fp32, mlm_bf16 = rows[0], rows[1]
    assert mlm_bf16["peak_gflop_per_s"] != mlm_fp32["peak_gflop_per_s"]  # each precision's MFU on its own peak
    for row in (r for r in rows if r["bench"].endswith("-vs-fp32")):
        assert row["ratio"] > 0 and row["peak_ratio"] > 0 and row["native_bf16"] is native_bf16_cpu()
        assert row["share_of_peak_ratio"] == pytest.approx(row["ratio"] / row["peak_ratio"])
    assert rows[2]["peak_ratio"] == pytest.approx(mlm_bf16["peak_gflop_per_s"] / mlm_fp32["peak_gflop_per_s"])


def counted_products(monkeypatch) -> Counter:
    """``torch.mm``'s calls from now on, counted by their first operand's shape."""
    products: Counter = Counter()
    mm = torch.mm

    def counted(a, b, *, out=None):
        products[a.shape] += 1
        return mm(a, b, out=out)

    monkeypatch.setattr(torch, "mm", counted)
    return products


def test_the_matmul_peak_is_taken_on_products_that_fill_the_machine(monkeypatch) -> None:
    """Whatever the model's size, the peak is the best of square products up to 2048 x 2048 on a CPU, each size timed
    at least PEAK_REPEATS times after a warm-up: at --size tiny one 256 x 256 product once set it, which read 4 GFLOP/s
    on two loaded cores in one run and 101 in another."""
    train_step()
    import train_step_timing  # importable once the script put benchmarks/ on the path
    products = counted_products(monkeypatch)
    assert train_step_timing.matmul_peak(seconds=0) > 0
    assert max(n for n, _ in products) >= 2048 and all(n == m for n, m in products)
    assert min(products.values()) == 1 + train_step_timing.PEAK_REPEATS


def test_the_peak_stops_before_a_product_too_slow_to_be_it(monkeypatch) -> None:
    """On a CPU without native bfloat16 one 2048 x 2048 bfloat16 product took a minute (0.3 GFLOP/s against 1.1 at
    512): a size whose product would take over PEAK_PRODUCT_SECONDS at the best rate so far is not timed."""
    train_step()
    import train_step_timing
    products = counted_products(monkeypatch)
    monkeypatch.setattr(train_step_timing, "PEAK_PRODUCT_SECONDS", 1e-9)  # any product is too slow after the first
    assert train_step_timing.matmul_peak(seconds=0) > 0
    assert {n for n, _ in products} == {train_step_timing.PEAK_SIZES["cpu"][0]}


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_both_sides_of_an_encoder_decoder_step_compute_one_function(style: str) -> None:
    """transformers' model has the configuration the interop derives from sesame's, and sesame's model its weights:
    without dropout both give the same loss on the step's batch, and are credited the same work."""
    script = train_step()
    ours, theirs = script.CONTENDERS[style](script.bench_config(style, "tiny"), 0, script.Variant("fp32"))
    for side in (ours, theirs):
        side.model.eval()
    with torch.no_grad():
        losses = [side.loss().item() for side in (ours, theirs)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert ours.flops == theirs.flops > 0


def test_xlnets_step_gives_transformers_sesames_permutations_and_memory_and_checks_the_loss_before_timing() -> None:
    """XLNetLMHeadModel is fed the orders sesame sampled: each target's perm_mask row is the complement of sesame's
    query mask, target_mapping picks the predicted positions, the text of a segment is kept as memory (reuse_len);
    both compute one loss without dropout (checked as the contenders are made, and failing on a changed weight), both
    train, and each is credited its own work over two segments of tokens."""
    script = train_step()
    cfg = script.bench_config("xlnet", "tiny")
    ours, theirs = script.CONTENDERS["xlnet"](cfg, 0, script.Variant("fp32"))
    assert cfg.segments == 2 and cfg.tokens == cfg.batch * 2 * cfg.seq_len
    assert theirs.model.config.reuse_len == cfg.seq_len - 2 and theirs.model.config.mem_len == 128

    from train_step_core import check_same_loss  # importable once the script put benchmarks/ on the path
    from train_step_xlnet import hf_segments
    windows = torch.randint(9, cfg.vocab_size, (cfg.batch, ours.model.window_length(cfg.seq_len)))
    batch = ours.model.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(cfg.batch)])
    for s, inputs in enumerate(hf_segments(batch)):
        predict = batch["predict"][:, s]
        _, query = permutation_masks(batch["rank"][:, s], predict)
        hidden = inputs["perm_mask"].gather(1, predict[:, :, None].expand(-1, -1, cfg.seq_len)).bool()
        assert torch.equal(query, ~hidden) and torch.equal(inputs["target_mapping"].argmax(-1), predict)
        assert torch.equal(inputs["labels"], inputs["input_ids"].gather(1, predict))

    for side in (ours, theirs):
        side.model.eval()
    with torch.no_grad():
        losses = [side.loss().item() for side in (ours, theirs)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4) and losses[0] > 1
    with torch.no_grad():
        theirs.model.lm_loss.bias.add_(0.1 * torch.randn_like(theirs.model.lm_loss.bias))
    with pytest.raises(AssertionError, match="losses differ without dropout"):
        check_same_loss((ours.model, lambda _: ours.loss()), (theirs.model, lambda _: theirs.loss()))
    for side in (ours, theirs):
        side.model.train()
        before = [p.detach().clone() for p in side.model.parameters()]
        side.step()
        assert any(not torch.equal(a, b) for a, b in zip(before, side.model.parameters()))
    assert 0 < ours.flops < theirs.flops


def test_without_fp32_there_is_no_line_against_it(capsys) -> None:
    train_step().main([*TINY, "--rounds", "2", "--precision", "bf16", "--json-only"])
    assert [r["bench"] for r in json_lines(capsys.readouterr().out)] == ["mlm-bf16", "clm-bf16"]  # the default steps


@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp32", "--compile", "bf16"], "--compile bf16: compile only precisions of --precision"),
    (["--precision", "fp16"], "invalid choice: 'fp16'"),
    (["--rounds", "1"], "--rounds must exceed --warmup"),
    (["--device", "mps"], "--device mps: choose cpu, cuda or cuda:N"),
    pytest.param(["--device", "cuda"], "--device cuda: this machine has no CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")),
])
def test_bad_flags_fail_in_one_line(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit):
        train_step().main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not os.environ.get("SESAME_COMPILE_TESTS"),
                    reason="torch.compile builds C++ kernels with the system compiler on its first call: minutes on "
                           "two shared cores, not seconds; SESAME_COMPILE_TESTS=1 runs it")
def test_compiled_variant_runs_compiled(capsys) -> None:
    train_step().main([*TINY, "--rounds", "2", "--which", "mlm", "--precision", "bf16", "--compile", "bf16",
                       "--json-only"])
    rows = json_lines(capsys.readouterr().out)
    assert [r["bench"] for r in rows] == ["mlm-bf16", "mlm-bf16-compile"]
    compiled = rows[1]
    assert compiled["config"]["compile"] and compiled["sesame_compiled"] and compiled["transformers_compiled"]
    assert all(isinstance(compiled[f"{side}_graph_breaks"], dict) for side in ("sesame", "transformers"))


def precision_loss():
    return load_script(BENCHMARKS / "precision_loss.py", "precision_loss")


def test_the_chain_takes_only_successors() -> None:
    successors = torch.tensor([[11, 12, 13, 14], [10, 10, 12, 13], [14, 14, 14, 14], [10, 11, 12, 14],
                               [13, 13, 13, 13]])
    windows = precision_loss().markov_windows(successors, 10, 50, 20, torch.Generator().manual_seed(0))
    assert windows.shape == (50, 20) and windows.min() >= 10 and windows.max() <= 14
    for a, b in zip(windows[:, :-1].flatten().tolist(), windows[:, 1:].flatten().tolist()):
        assert b in successors[a - 10].tolist()


def test_loss_check_trains_each_precision_from_one_start(capsys) -> None:
    precision_loss().main([*TINY, "--which", "mlm", "--steps", "8", "--valid-batches", "2"])
    [row] = json_lines(capsys.readouterr().out)
    assert row["bench"] == "mlm-loss-check" and row["config"]["steps"] == 8
    losses = row["valid_loss"]
    assert set(losses) == {"fp32", "bf16", "fp32-reseeded"}
    assert all(loss < row["initial_valid_loss"] for loss in losses.values())  # every run learned
    assert row["noise"] == pytest.approx(abs(losses["fp32-reseeded"] - losses["fp32"])) and row["noise"] > 0
    assert row["difference"] == pytest.approx(losses["bf16"] - losses["fp32"])
    assert row["within_noise"] is (abs(row["difference"]) <= row["noise"])
