"""The vocabulary projection fused with cross-entropy, chunk by chunk.

For these models the vocabulary projection is most of the arithmetic, and allocating, faulting in
and streaming a (positions × vocabulary) logits matrix and its gradient of hundreds of megabytes
each step costs more than the projection itself on a CPU. :func:`linear_cross_entropy` never
materialises them: it computes each chunk's logits in a reused buffer and turns them into gradients
at once (∂loss/∂logits = softmax − one-hot).

Precision. Without autocast everything computes in float32 (half-precision inputs are upcast). Under
bfloat16 autocast (``--precision bf16``) the three matrix products of each chunk, the logits x Wᵀ + b,
∂hidden = G W and ∂W += Gᵀ x (G = ∂loss/∂logits), take bfloat16 operands and give bfloat16 results
(the product itself accumulates in float32). On an accelerator the logits then stay in bfloat16: no float32
copy of a chunk is made, which halves the memory each chunk reads and writes (what bounds these passes on a GPU).
The reductions are float32's: each row's log-sum-exp is m + log Σ exp(x − m) with m the row's largest logit and the sum
accumulated in float32 (the terms exp(x − m) ≤ 1, rounded to bfloat16 each, so the error is a fraction 2⁻⁸ of the
mass away from the largest and averages out), the loss Σ (lse − x_target) is summed in float32, G = softmax −
one-hot is the softmax (computed in float32, rounded once) but its target entries, p − 1, are computed in float32 from the logit and
the log-sum-exp before rounding (rounded after, p ≈ 1 would make them 0: a confident token would lose its
gradient), and the weight's and bias's gradients are summed over chunks in float32: Micikevicius et al. 2018,
"Mixed precision training", §3 (float32 master weights and gradient accumulation) and §3.3 (products in half
precision accumulating in float32; large reductions such as the softmax in float32). It matches autocast's
``F.cross_entropy(F.linear(h, W, b).float(), t)`` (the linear in bfloat16, the cross-entropy in float32) within
bfloat16 rounding. On a CPU (:data:`WIDE_LOGITS`) the bfloat16 logits are copied into float32 and the log-softmax
and G computed there, then G rounded to bfloat16 for its products, which is autocast's plain computation exactly.
The gradients come back in their inputs' types. Deviation from exact float32: the operands,
the logits, G and each chunk's ∂W are rounded to bfloat16 (8 significant bits, a relative error up to 2⁻⁸ each),
as in autocast's own products.

float16 autocast (CUDA's ``--precision fp16``) keeps the float32 path: G is formed in the forward pass,
before the loss scale is known, so in float16 its entries below 6·10⁻⁸ (most of a 50k-word softmax) would
flush to zero and those below 6·10⁻⁵ keep only a few bits, which a gradient scaler cannot prevent.
"""
from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx

# By default one chunk of logits holds at most this many floats. On a CPU, 64 MB in fp32 (under bf16
# autocast a bf16 copy adds half as much): large enough that the output matrix is streamed only a few
# times per batch, small enough to be a bounded workspace. On a GPU, where each chunk's dozen kernel
# launches and its smaller matrix products cost more than memory does (an H100 profile of the GPT-mini
# step: 13 chunks of 316 rows, 525 kernels a step against transformers' 257), 1 GB in fp32: a 32 x 128
# batch of a 50k vocabulary is one chunk, still less than the logits and their gradient that an
# unfused loss holds.
CHUNK_ELEMENTS = {"cpu": 1 << 24}
ACCELERATOR_CHUNK_ELEMENTS = 1 << 28
# Devices whose bfloat16 logits are widened to float32 for the softmax (module docstring): a CPU without native
# bfloat16 runs bfloat16 element-wise passes and float32 sums of bfloat16 terms at a fraction of float32's speed (the
# projection's forward and backward took 25% more CPU time narrow, 2 cores under load, issue 35); elsewhere they stay
# narrow.
WIDE_LOGITS = {"cpu"}


class Workspace:
    """Scratch memory kept between calls, so a large buffer is not handed back to the operating
    system and faulted in again every step. One buffer per use (the chunk's logits, ...), replaced
    when a call needs more room or another dtype or device. Its contents never outlive a call; it is
    never saved."""

    def __init__(self) -> None:
        self._flats: dict[str, torch.Tensor] = {}

    def matrix(self, use: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised (rows, cols) matrix of ``dtype`` on ``device``: the buffer of ``use``."""
        n = rows * cols
        flat = self._flats.get(use)
        if flat is None or flat.numel() < n or flat.dtype != dtype or flat.device != device:
            flat = self._flats[use] = torch.empty(n, dtype=dtype, device=device)
        return flat[:n].view(rows, cols)


_Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def product_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The operand type of the projection's matrix products for ``hidden``: bfloat16 under bfloat16
    autocast on its device, else float32 at least (module docstring). A device without autocast (``meta``, where a
    model is sized without memory) has float32 at least."""
    wide = torch.promote_types(hidden.dtype, torch.float32)
    kind = hidden.device.type
    if wide == torch.float32 and torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind) \
            and torch.get_autocast_dtype(kind) == torch.bfloat16:
        return torch.bfloat16
    return wide


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool, workspace: Workspace) -> None:
    """``total = a @ b`` if ``first``, else ``total += a @ b``. When ``a`` and ``b`` are of a lower type than
    ``total``, their product is made in that type (a buffer of ``workspace``), then added in ``total``'s."""
    if a.dtype == total.dtype:
        if first:
            torch.mm(a, b, out=total)
        else:
            total.addmm_(a, b)
        return
    part = torch.mm(a, b, out=workspace.matrix("low product", *total.shape, a.dtype, a.device))
    if first:
        total.copy_(part)
    else:
        total += part


def _chunked_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  chunk_size: int, workspace: Workspace, grads: bool,
                  low: torch.dtype) -> tuple[torch.Tensor, _Grads | None]:
    """Summed cross-entropy of ``hidden @ weight.T + bias`` against ``targets``, chunk by chunk.

    With ``grads``, also return the gradients of that sum with respect to hidden (in ``low``), weight and
    bias (in ``wide``), computed from each chunk's softmax while it is at hand: ∂loss/∂logits = softmax − one-hot.
    The matrix products take operands of type ``low`` (:func:`product_dtype`); the loss and the sums over
    chunks are in ``wide``, float32 at least. One (chunk_size × vocabulary) matrix of ``workspace``, of type
    ``low``, holds every chunk's logits in turn; when ``low`` is narrower, another holds their exponentials
    (:func:`_narrow_softmax`), or on a device of :data:`WIDE_LOGITS` their float32 copy.
    """
    n, (vocab, features), device = hidden.shape[0], weight.shape, hidden.device
    wide = torch.promote_types(hidden.dtype, torch.float32)
    narrow = low != wide and device.type not in WIDE_LOGITS
    products = workspace.matrix("logits", min(chunk_size, n), vocab, low, device)
    scores = products if low == wide or narrow else workspace.matrix("wide logits", *products.shape, wide, device)
    x_all = hidden.to(low)
    w = weight if weight.dtype == low else workspace.matrix("low weight", vocab, features, low, device).copy_(weight)
    b = bias.to(low) if bias is not None else None
    loss = torch.zeros((), dtype=wide, device=device)
    grad_hidden = torch.empty(hidden.shape, dtype=low, device=device) if grads else None
    new = torch.empty if n else torch.zeros  # the first chunk overwrites, later ones add
    grad_weight = new(weight.shape, dtype=wide, device=device) if grads else None
    grad_bias = new(bias.shape, dtype=wide, device=device) if grads and bias is not None else None
    for start in range(0, n, chunk_size):
        x, t = x_all[start:start + chunk_size], targets[start:start + chunk_size]
        rows = torch.arange(x.shape[0], device=device)
        product = products[: x.shape[0]]
        if b is None:
            torch.mm(x, w.t(), out=product)
        else:
            torch.addmm(b, x, w.t(), out=product)
        if narrow:
            chunk_loss, probs = _narrow_softmax(product, t, rows, workspace, grads=grads, wide=wide)
            loss += chunk_loss
        else:
            logits = product if low == wide else scores[: x.shape[0]].copy_(product)
            log_probs = torch.log_softmax(logits, dim=1, out=logits)  # in place
            loss -= log_probs[rows, t].sum()
            probs = log_probs.exp_() if grads else None
            if probs is not None:
                probs[rows, t] -= 1.0  # now ∂loss/∂logits
        if probs is None:
            continue
        g = probs if probs.dtype == low else product.copy_(probs)
        torch.mm(g, w, out=grad_hidden[start:start + chunk_size])
        _add_product(grad_weight, g.t(), x, start == 0, workspace)
        if grad_bias is not None:
            if start == 0:
                torch.sum(probs, 0, dtype=wide, out=grad_bias)
            else:
                grad_bias += probs.sum(0, dtype=wide)
    return loss, ((grad_hidden, grad_weight, grad_bias) if grads else None)


def _narrow_softmax(logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, workspace: Workspace, *,
                    grads: bool, wide: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The summed cross-entropy of a chunk of bfloat16 ``logits`` (in ``wide``) and, with ``grads``, ∂loss/∂logits
    in their type, with float32's reductions and no float32 copy of the chunk (module docstring): each row's
    log-sum-exp m + log Σ exp(x − m) summed in ``wide``, and the target entries of softmax − one-hot computed in
    ``wide`` before they are rounded."""
    largest = logits.amax(1, keepdim=True)
    exps = torch.sub(logits, largest, out=workspace.matrix("exps", *logits.shape, logits.dtype, logits.device)).exp_()
    total = exps.sum(1, dtype=wide)
    log_sum_exp = largest.squeeze(1).to(wide) + total.log()
    chosen = logits[rows, targets].to(wide) - log_sum_exp  # the targets' log-probabilities
    if not grads:
        return -chosen.sum(), None
    g = torch.softmax(logits, dim=1, out=logits)  # in place, computed in float32 and rounded once
    g[rows, targets] = chosen.expm1().to(g.dtype)  # p − 1 before rounding, so p ≈ 1 keeps its gradient
    return -chosen.sum(), g


class _LinearCrossEntropy(torch.autograd.Function):
    """Autograd wrapper of :func:`_chunked_loss`: the gradients are computed in the forward pass and
    only scaled by the incoming gradient in the backward pass (which may therefore run once), in the
    wider of their type and their input's, and returned in their input's type."""

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk_size: int, workspace: Workspace, low: torch.dtype) -> torch.Tensor:
        loss, ctx.grads = _chunked_loss(hidden, weight, bias, targets, chunk_size, workspace, grads=True, low=low)
        ctx.dtypes = tuple(p.dtype if p is not None else None for p in (hidden, weight, bias))
        return loss

    @staticmethod
    def backward(ctx: FunctionCtx, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.grads is None:
            raise RuntimeError("linear_cross_entropy: backward can run only once per forward")
        grads, ctx.grads = ctx.grads, None
        grad_hidden, grad_weight, grad_bias = (
            g.to(torch.promote_types(g.dtype, dtype)).mul_(grad_loss).to(dtype) if g is not None else None
            for g, dtype in zip(grads, ctx.dtypes))
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def default_chunk_size(rows: int, vocab: int, device: torch.device) -> int:
    """Rows per chunk of ``rows`` positions over ``vocab`` classes on ``device``: as few chunks as the device's bound
    (:data:`CHUNK_ELEMENTS`) allows, of equal size."""
    bound = CHUNK_ELEMENTS.get(device.type, ACCELERATOR_CHUNK_ELEMENTS)
    chunks = max(1, -(-rows // max(1, bound // vocab)))
    return max(1, -(-rows // chunks))


@torch.compiler.disable
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, chunk_size: int | None = None,
                         workspace: Workspace | None = None) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, targets, reduction="sum")`` without the full logits.

    ``hidden`` is (positions, features), ``weight`` (vocabulary, features), ``targets`` (positions,)
    holding valid class ids. Logits are computed ``chunk_size`` rows at a time (by default in the
    fewest equal chunks of at most :data:`CHUNK_ELEMENTS` floats for the device) in one reused matrix (of
    ``workspace`` when given, so callers that keep a workspace skip the allocation next time) and,
    when gradients are needed, turned into the gradients of ``hidden``, ``weight`` and ``bias`` at
    once, so neither the logits nor their gradient ever exist in full. The loss is in float32 at
    least; under bfloat16 autocast the matrix products run in bfloat16 (module docstring), otherwise
    everything computes in float32 at least (half-precision inputs are upcast). Under ``--compile`` it
    stays eager (a graph break): Dynamo cannot trace an autograd function that writes its gradients
    into buffers in the forward pass.
    """
    low = product_dtype(hidden)
    chunk_size = chunk_size or default_chunk_size(hidden.shape[0], weight.shape[0], hidden.device)
    workspace = workspace or Workspace()
    if torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in (hidden, weight, bias)):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_size, workspace, low)
    return _chunked_loss(hidden, weight, bias, targets, chunk_size, workspace, grads=False, low=low)[0]
