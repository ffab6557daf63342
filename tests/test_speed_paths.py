"""The fast paths compute exactly what the plain formulas compute (within float32 rounding; under bfloat16 autocast,
within bfloat16 rounding of what autocast makes of the plain formulas)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from sesame.models import Transformer, TransformerConfig
from sesame.models.transformer import Dropout, dropout, explicit_attention
from sesame.objectives import CausalLM, MaskedLM
from sesame.objectives import projection
from sesame.objectives.projection import default_chunk_size, linear_cross_entropy
from sesame.tokenizer import SpecialIds

RTOL = 1e-5
# Under bf16 autocast the fused projection and autocast's plain linear + float32 cross-entropy round the same
# bfloat16 operands and logits, and each gradient element to bfloat16 once (a relative error up to u = 2^-8, bf16's
# unit roundoff); they differ in where ∂loss/∂logits is rounded (before or after the incoming gradient's scale) and
# in summing ∂W over chunks, so their gradients differ by about one or two u of the largest (measured: up to 1.5 u).
# Four u leaves room without admitting a real error: wrong gradients are off by O(1) of the largest.
BF16_RTOL = 4 * 2 ** -8
# Under bf16 on an accelerator (the narrow path, which these tests take on the CPU by emptying WIDE_LOGITS) each row's
# log-sum-exp sums the bfloat16 terms exp(x − m) in float32, so it is off from float32's of the same bfloat16 logits by a fraction of 2^-8 of the mass away from the largest logit, which averages out (measured:
# 1e-4 nats a row); 2^-9 nats a row leaves room without admitting a real error (O(1) nats a row).
BF16_LOSS_PER_ROW = 2 ** -9
SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def deviation(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference relative to the largest magnitude of ``expected``."""
    return float((actual.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-30))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = RTOL) -> None:
    """Equal within ``rtol`` relative to the largest magnitude of ``expected``."""
    assert deviation(actual, expected) <= rtol


@pytest.fixture(params=["wide", "narrow"])
def logit_width(request, monkeypatch) -> str:
    """Under bf16, the CPU's float32 logits (wide) or the accelerators' bfloat16 ones (narrow), both run here."""
    if request.param == "narrow":
        monkeypatch.setattr(projection, "WIDE_LOGITS", set())
    return request.param


def leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


@pytest.mark.parametrize("chunk_size", [None, 1, 7, 50, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_cross_entropy_matches_the_plain_loss_and_gradients(chunk_size: int | None, with_bias: bool) -> None:
    hidden, weight, bias = leaves((50, 16), (97, 16), (97,))
    targets = torch.randint(0, 97, (50,), generator=torch.Generator().manual_seed(1))
    b = bias if with_bias else None
    scale = 0.37  # the incoming gradient, as when the trainer divides by the number of targets

    fused = linear_cross_entropy(hidden, weight, targets, b, chunk_size=chunk_size)
    (fused * scale).backward()
    got = [hidden.grad, weight.grad, bias.grad]
    for p in (hidden, weight, bias):
        p.grad = None
    logits = hidden @ weight.t() + (bias if with_bias else 0)
    plain = F.cross_entropy(logits, targets, reduction="sum")
    (plain * scale).backward()

    assert_close(fused.detach(), plain.detach())
    assert_close(got[0], hidden.grad)
    assert_close(got[1], weight.grad)
    if with_bias:
        assert_close(got[2], bias.grad)
    else:
        assert got[2] is None
    with torch.no_grad():
        assert_close(linear_cross_entropy(hidden, weight, targets, b, chunk_size=chunk_size), plain.detach())


def test_the_default_chunks_are_small_on_a_cpu_and_one_on_a_gpu_for_a_gpt_mini_batch() -> None:
    rows, vocab = 32 * 128, 50257  # benchmarks/train_step.py's causal step
    on_cpu = default_chunk_size(rows, vocab, torch.device("cpu"))
    assert on_cpu * vocab <= 1 << 24 and -(-rows // on_cpu) == 13  # 64 MB of fp32 logits at a time, equal chunks
    assert default_chunk_size(rows, vocab, torch.device("cuda")) == rows  # launches cost more than memory there
    assert default_chunk_size(64 * 1024, vocab, torch.device("cuda")) * vocab <= 1 << 28  # still bounded


def test_linear_cross_entropy_of_no_positions_is_zero_with_zero_gradients() -> None:
    hidden, weight, bias = leaves((0, 4), (11, 4), (11,))
    loss = linear_cross_entropy(hidden, weight, torch.zeros(0, dtype=torch.long), bias)
    loss.backward()
    assert loss.item() == 0.0
    assert not weight.grad.any() and not bias.grad.any() and hidden.grad.shape == (0, 4)


def test_linear_cross_entropy_refuses_a_second_backward() -> None:
    hidden, weight = leaves((5, 4), (11, 4))
    loss = linear_cross_entropy(hidden, weight, torch.arange(5))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()


def loss_and_gradients(loss: Callable[[], torch.Tensor], params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The loss and its gradients with respect to ``params``, the loss scaled by an incoming gradient that is
    not a power of two (as when the trainer divides by the number of targets)."""
    for p in params:
        p.grad = None
    value = loss()
    (value * 0.37).backward()
    return [value.detach(), *(p.grad for p in params)]


def bf16_case(with_bias: bool = True) -> tuple[list[torch.Tensor], torch.Tensor]:
    hidden, weight, bias = leaves((50, 16), (97, 16), (97,), seed=4)
    targets = torch.randint(0, 97, (50,), generator=torch.Generator().manual_seed(5))
    return [hidden, weight, bias] if with_bias else [hidden, weight], targets


@pytest.mark.parametrize("chunk_size", [None, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_under_bf16_autocast_the_fused_projection_matches_autocasts_plain_linear_and_cross_entropy(
        chunk_size: int | None, with_bias: bool, logit_width: str) -> None:
    params, targets = bf16_case(with_bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = loss_and_gradients(lambda: linear_cross_entropy(params[0], params[1], targets, *params[2:],
                                                                chunk_size=chunk_size), params)
        plain = loss_and_gradients(lambda: F.cross_entropy(F.linear(*params).float(), targets, reduction="sum"),
                                   params)
    assert [t.dtype for t in fused] == [torch.float32] * len(fused)
    assert_loss_close(fused[0], plain[0], len(targets), logit_width)  # the same bfloat16 logits, float32 sums
    for got, want in zip(fused[1:], plain[1:], strict=True):
        assert_close(got, want, BF16_RTOL)


def test_under_bf16_autocast_every_product_of_every_chunk_takes_bfloat16_operands(logit_width: str) -> None:
    params, targets = bf16_case()
    calls = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
                calls.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
            return func(*args, **(kwargs or {}))

    with torch.autocast("cpu", dtype=torch.bfloat16), Products():
        fused = loss_and_gradients(lambda: linear_cross_entropy(params[0], params[1], targets, params[2],
                                                                chunk_size=7), params)
    assert calls == [{torch.bfloat16}] * (3 * 8)  # logits, ∂hidden and ∂W of each of the 8 chunks
    # and so the result is not float32's: it differs by far more than float32 rounding
    exact = loss_and_gradients(lambda: linear_cross_entropy(params[0], params[1], targets, params[2]), params)
    for got, want in zip(fused, exact, strict=True):
        assert 10 * RTOL < deviation(got, want) < 4 * BF16_RTOL


def test_under_bf16_autocast_on_an_accelerator_no_float32_matrix_of_logits_is_made(monkeypatch) -> None:
    """The logits stay in bfloat16 (issue 35): no operation gives a float32 tensor as large as the chunk of logits
    (one chunk of 50 rows of 97 classes; the largest float32 results are ∂W and ∂hidden, 97 x 16 and 50 x 16)."""
    monkeypatch.setattr(projection, "WIDE_LOGITS", set())
    params, targets = bf16_case()
    largest = []

    class Results(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            largest.extend(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                           if isinstance(t, torch.Tensor) and t.dtype == torch.float32)
            return out

    with torch.autocast("cpu", dtype=torch.bfloat16), Results():
        loss_and_gradients(lambda: linear_cross_entropy(params[0], params[1], targets, params[2]), params)
    assert 0 < max(largest) < 50 * 97


def test_under_bf16_autocast_a_confident_prediction_keeps_its_gradient(logit_width: str) -> None:
    """Where the target's probability p is near 1, p − 1 is computed before it is rounded to bfloat16 (rounded first,
    p = 0.995 would become 1, bfloat16's nearest, and the gradient 0): on the rows where 0.99 < p < 0.999 (float32's
    p − 1 still exact to 1e-4) ∂hidden matches autocast's plain loss row by row as closely as elsewhere."""
    hidden, weight, bias = leaves((50, 16), (97, 16), (97,), seed=6)
    with torch.no_grad():
        targets = (hidden @ weight.t()).argmax(1)
        weight.mul_(4.0)  # the targets' logits lead by several nats
        p = torch.softmax(hidden @ weight.t() + bias, 1)[torch.arange(50), targets]
    confident = (p > 0.99) & (p < 0.999)
    assert confident.sum() >= 3
    params = [hidden, weight, bias]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = loss_and_gradients(lambda: linear_cross_entropy(hidden, weight, targets, bias), params)[1]
        plain = loss_and_gradients(lambda: F.cross_entropy(F.linear(*params).float(), targets, reduction="sum"),
                                   params)[1]
    for row in confident.nonzero().flatten().tolist():
        assert_close(fused[row], plain[row], BF16_RTOL)


def tiny_backbone(causal: bool) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(
        vocab_size=101, hidden=32, layers=2, heads=4, intermediate=64, max_positions=64, dropout=0.0,
        causal=causal, norm="pre" if causal else "post", embedding_norm=not causal))


def gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# The models' gradients under bf16 autocast: the backbone's bfloat16 backward carries the projection's rounding
# differences (BF16_RTOL) through its layers and rounds again; measured up to 4 u of the largest (2 layers).
PRECISIONS = {"fp32": (nullcontext, RTOL), "bf16": (partial(torch.autocast, "cpu", dtype=torch.bfloat16), 8 * 2 ** -8)}
MODEL_CASES = [("fp32", "wide"), ("bf16", "wide"), ("bf16", "narrow")]  # (precision, logit_width)


def assert_loss_close(fused: torch.Tensor, plain: torch.Tensor, rows: int, precision: str) -> None:
    """The fused loss against the plain one: within float32 rounding (float32, and bf16's wide logits, which
    autocast's plain loss also takes), or with bf16's narrow logits BF16_LOSS_PER_ROW a row."""
    if precision == "narrow":
        assert abs(fused.detach() - plain.detach()) <= rows * BF16_LOSS_PER_ROW
    else:
        assert_close(fused.detach(), plain.detach())


@pytest.mark.parametrize("precision, logit_width", MODEL_CASES, indirect=["logit_width"])
def test_causal_lm_loss_and_gradients_match_the_plain_tied_projection(precision: str, logit_width: str) -> None:
    model = CausalLM(tiny_backbone(causal=True), SPECIALS).train()
    windows = torch.randint(5, 101, (3, CausalLM.window_length(20)), generator=torch.Generator().manual_seed(2))
    batch = model.make_batch(windows, [])
    context, rtol = PRECISIONS[precision]

    with context():
        fused = model(batch)
        got = gradients(model, fused)
        logits = model.tied_logits(model.backbone(batch["ids"]))
        plain = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten(), reduction="sum")
        expected = gradients(model, plain)

    assert_loss_close(fused, plain, batch["targets"].numel(), logit_width)
    assert got.keys() == expected.keys()
    for name in expected:
        assert_close(got[name], expected[name], rtol)


@pytest.mark.parametrize("precision, logit_width", MODEL_CASES, indirect=["logit_width"])
def test_masked_lm_loss_and_gradients_match_the_plain_head(precision: str, logit_width: str) -> None:
    model = MaskedLM(tiny_backbone(causal=False), SPECIALS).train()
    windows = torch.randint(5, 101, (4, MaskedLM.window_length(24)), generator=torch.Generator().manual_seed(3))
    batch = model.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(4)])
    assert batch["targets"].numel() > 0
    context, rtol = PRECISIONS[precision]

    with context():
        fused = model(batch)
        got = gradients(model, fused)
        hidden = model.backbone(batch["ids"]).flatten(0, 1)[batch["positions"]]
        logits = F.linear(model.transform(hidden), model.backbone.embed.tokens.weight, model.bias)
        plain = F.cross_entropy(logits.float(), batch["targets"], reduction="sum")
        expected = gradients(model, plain)

    assert_loss_close(fused, plain, batch["targets"].numel(), logit_width)
    assert got.keys() == expected.keys()
    for name in expected:
        assert_close(got[name], expected[name], rtol)


def test_dropout_keeps_one_minus_p_of_the_elements_scaled_by_its_inverse() -> None:
    torch.manual_seed(0)
    x = torch.ones(1_000_000, requires_grad=True)
    y = dropout(x, 0.1, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 5 * (0.9 * 0.1 / x.numel()) ** 0.5  # five sigma
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(x·mask)/dx = mask
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0, training=True) is x
    assert not dropout(x, 1.0, training=True).any()
    module = Dropout(0.1).eval()
    assert isinstance(module, torch.nn.Dropout) and module(x) is x


@pytest.mark.parametrize("causal, mask", [(False, None), (True, None), (False, "padding"), (True, "padding"),
                                          (False, "bias")])
def test_explicit_attention_matches_sdpa(causal: bool, mask: str | None) -> None:
    # the path attention dropout takes: with no dropout it computes SDPA's function, with any mask SDPA reads (a
    # boolean one overrides causal, as SDPA's attn_mask replaces is_causal; a float one, T5's bias, is added)
    q, k, v = leaves((2, 3, 10, 8), (2, 3, 10, 8), (2, 3, 10, 8))
    masks = {None: None, "padding": torch.arange(10)[None, None, None, :] < torch.tensor([7, 10])[:, None, None, None],
             "bias": torch.randn(3, 10, 10, generator=torch.Generator().manual_seed(1)).requires_grad_()}
    inputs = (q, k, v) + ((masks[mask],) if mask == "bias" else ())  # T5's bias is learned: its gradient too
    got = explicit_attention(q, k, v, masks[mask], causal, dropout_p=0.0)
    got_grads = torch.autograd.grad(got.square().sum(), inputs)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[mask], is_causal=causal and mask is None)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    assert_close(got.detach(), expected.detach())
    for a, b in zip(got_grads, expected_grads, strict=True):
        assert_close(a, b)


def test_the_fused_projection_runs_under_torch_compile_as_an_eager_island() -> None:
    # Dynamo cannot trace an autograd function that fills gradient buffers in its forward pass ("grad_bias ...
    # aliases an input or output"); --compile then fell back to the whole model uncompiled. The eager backend
    # traces exactly as inductor does, without building C++ kernels.
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(10, 8), torch.randn(50, 8), torch.randn(50)
    targets = torch.randint(0, 50, (10,))

    def loss_and_grads(fn):
        params = [p.clone().requires_grad_() for p in (hidden, weight, bias)]
        loss = fn(*params)
        loss.backward()
        return [loss.detach(), *(p.grad for p in params)]

    fused = lambda h, w, b: linear_cross_entropy(h * 2, w, targets, bias=b, chunk_size=4)
    compiled = torch.compile(fused, backend="eager", fullgraph=False)
    for got, want in zip(loss_and_grads(compiled), loss_and_grads(fused)):
        torch.testing.assert_close(got, want)
