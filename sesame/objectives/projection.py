"""The vocabulary projection fused with cross-entropy, chunk by chunk.

For these models the vocabulary projection is most of the arithmetic, and allocating, faulting in
and streaming a (positions × vocabulary) logits matrix and its gradient of hundreds of megabytes
each step costs more than the projection itself on a CPU. :func:`linear_cross_entropy` never
materialises them: it computes each chunk's logits in a reused buffer and turns them into gradients
at once (∂loss/∂logits = softmax − one-hot).
"""
from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx

# By default one chunk of logits holds at most this many floats (64 MB in fp32): large enough that
# the output matrix is streamed only a few times per batch, small enough to be a bounded workspace.
CHUNK_ELEMENTS = 1 << 24


class Workspace:
    """Scratch memory kept between calls, so a large buffer is not handed back to the operating
    system and faulted in again every step. Its contents never outlive a call; it is never saved."""

    def __init__(self) -> None:
        self._flat: torch.Tensor | None = None

    def matrix(self, rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised (rows, cols) matrix of ``like``'s dtype and device."""
        n = rows * cols
        flat = self._flat
        if flat is None or flat.numel() < n or flat.dtype != like.dtype or flat.device != like.device:
            flat = self._flat = like.new_empty(n)
        return flat[:n].view(rows, cols)


_Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def _chunked_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  chunk_size: int, workspace: Workspace, grads: bool) -> tuple[torch.Tensor, _Grads | None]:
    """Summed cross-entropy of ``hidden @ weight.T + bias`` against ``targets``, chunk by chunk.

    With ``grads``, also return the gradients of that sum with respect to hidden, weight and bias,
    computed from each chunk's softmax while it is at hand: ∂loss/∂logits = softmax − one-hot.
    One (chunk_size × vocabulary) matrix of ``workspace`` holds every chunk's logits in turn.
    """
    n = hidden.shape[0]
    buffer = workspace.matrix(min(chunk_size, n), weight.shape[0], hidden)
    loss = hidden.new_zeros(())
    grad_hidden = torch.empty_like(hidden) if grads else None
    new = torch.empty_like if n else torch.zeros_like  # the first chunk overwrites, later ones add
    grad_weight = new(weight) if grads else None
    grad_bias = new(bias) if grads and bias is not None else None
    for start in range(0, n, chunk_size):
        x, t = hidden[start:start + chunk_size], targets[start:start + chunk_size]
        rows = torch.arange(x.shape[0], device=x.device)
        logits = buffer[: x.shape[0]]
        if bias is None:
            torch.mm(x, weight.t(), out=logits)
        else:
            torch.addmm(bias, x, weight.t(), out=logits)
        log_probs = torch.log_softmax(logits, dim=1, out=logits)  # in place
        loss -= log_probs[rows, t].sum()
        if not grads:
            continue
        probs = log_probs.exp_()
        probs[rows, t] -= 1.0  # now ∂loss/∂logits
        torch.mm(probs, weight, out=grad_hidden[start:start + chunk_size])
        if start == 0:
            torch.mm(probs.t(), x, out=grad_weight)
            if grad_bias is not None:
                torch.sum(probs, 0, out=grad_bias)
        else:
            grad_weight.addmm_(probs.t(), x)
            if grad_bias is not None:
                grad_bias += probs.sum(0)
    return loss, ((grad_hidden, grad_weight, grad_bias) if grads else None)


class _LinearCrossEntropy(torch.autograd.Function):
    """Autograd wrapper of :func:`_chunked_loss`: the gradients are computed in the forward pass and
    only scaled by the incoming gradient in the backward pass (which may therefore run once)."""

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk_size: int, workspace: Workspace) -> torch.Tensor:
        loss, ctx.grads = _chunked_loss(hidden, weight, bias, targets, chunk_size, workspace, grads=True)
        return loss

    @staticmethod
    def backward(ctx: FunctionCtx, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.grads is None:
            raise RuntimeError("linear_cross_entropy: backward can run only once per forward")
        grads, ctx.grads = ctx.grads, None
        grad_hidden, grad_weight, grad_bias = (g.mul_(grad_loss) if g is not None else None for g in grads)
        return grad_hidden, grad_weight, grad_bias, None, None, None


@torch.compiler.disable
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, chunk_size: int | None = None,
                         workspace: Workspace | None = None) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, targets, reduction="sum")`` without the full logits.

    ``hidden`` is (positions, features), ``weight`` (vocabulary, features), ``targets`` (positions,)
    holding valid class ids. Logits are computed ``chunk_size`` rows at a time (by default in the
    fewest equal chunks of at most :data:`CHUNK_ELEMENTS` floats) in one reused matrix (of
    ``workspace`` when given, so callers that keep a workspace skip the allocation next time) and,
    when gradients are needed, turned into the gradients of ``hidden``, ``weight`` and ``bias`` at
    once, so neither the logits nor their gradient ever exist in full. Computes in float32 at least:
    half-precision inputs are upcast first. Under ``--compile`` it stays eager (a graph break): Dynamo
    cannot trace an autograd function that writes its gradients into buffers in the forward pass.
    """
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    bias = bias.to(dtype) if bias is not None else None
    if chunk_size is None:  # as few chunks as the bound allows, of equal size
        chunks = max(1, -(-hidden.shape[0] // max(1, CHUNK_ELEMENTS // weight.shape[0])))
        chunk_size = max(1, -(-hidden.shape[0] // chunks))
    workspace = workspace or Workspace()
    if torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in (hidden, weight, bias)):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_size, workspace)
    return _chunked_loss(hidden, weight, bias, targets, chunk_size, workspace, grads=False)[0]
