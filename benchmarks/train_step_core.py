"""What one comparison of ``benchmarks/train_step.py`` is made of: the shape of its models and batch
(:class:`BenchConfig`, with the analytic FLOP count of a step), how both sides run (:class:`Variant`), and a
contender, one implementation's model with its training step (:class:`Contender`, :func:`contender`).

Both sides use the same dropout rates, the same AdamW (``sesame.train.optim.adamw``: lr 1e-4,
weight decay 0.01 on matrices, fused) and the mean loss over the targets. sesame draws its dropout
masks with its own sampler (``sesame.models.transformer.dropout``: the same keep probability 0.9 and
1/0.9 scaling as ``nn.Dropout``, from cheaper random bits).

Variants. Each comparison runs in every precision of ``--precision`` (default fp32 and bf16) and, for
those of ``--compile``, once more under torch.compile, always on both sides: the step is sesame's
trainer's (the forward pass under ``sesame.runtime.Placement.autocast``, i.e. ``torch.autocast("cpu",
torch.bfloat16)`` for bf16, the loss cast to float32, backward and the optimizer outside autocast;
weights and AdamW stay float32) for transformers as for sesame, and compile wraps each side's model
with ``Placement.compiled`` (torch.compile's default inductor backend, falling back to the eager model
with a warning where compiling fails; the JSON line says whether each side ran compiled). Compiling
both sides is fair: transformers' models support torch.compile.

Model FLOPs utilisation (MFU) = model FLOPs per second / peak, where the peak is the best ``torch.mm``
rate measured on this machine in the variant's precision (``train_step_timing.matmul_peak``: float32 or
bfloat16 matrices; 2n^3 FLOPs for n x n times n x n, the best over a few sizes n up to 2048 on a CPU) and the
model FLOPs of one step are counted analytically (multiply-add = 2 FLOPs; backward = 2 x forward, so training = 3 x
forward):

    6 * L * (4h^2 + 2hI) * tokens       the blocks' matrices (QKV, attention output, feed-forward)
  + 12 * L * h * T * tokens             attention scores and weighted sum (QK^T and AV)
  + 6 * (h^2 + hV) * P                  MLM head: transform dense + vocabulary projection, or
  + 6 * hV * tokens                     CLM head: vocabulary projection

and for an encoder-decoder the blocks' terms of the encoder (its S source tokens a row) and of the decoder (its T
target tokens), the decoder's cross-attention 12 * L * h^2 * (S + T) * batch (query and output projections of the
targets, key and value projections of the sources) + 12 * L * h * S * T * batch, and its vocabulary projection
6 * hV * targets.

with L layers, h hidden, I feed-forward width, V vocabulary, T sequence length and tokens = batch x T.
``P`` is the number of positions the MLM head is evaluated at: every position for transformers (it
projects all of them and ignores the unselected ones in the loss), only the selected ~15% for sesame
(the real work it does). Attention is counted in full for the causal model too: with attention
dropout in training both implementations compute the whole T x T score matrix. Embedding look-ups,
LayerNorm, GELU, softmax, dropout and the optimizer are not counted. XLNet's count: ``train_step_xlnet.py``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from sesame.runtime import Placement
from sesame.train.optim import adamw

LR, WEIGHT_DECAY = 1e-4, 0.01
PRECISIONS = ("fp32", "bf16")  # the CPU's (fp16 autocast is CUDA-only in sesame)
SIZES = ("tiny", "mini", "base")  # bench_config's
MODELS = {"mlm": "bert", "clm": "gpt2", "t5": "t5", "bart": "bart", "xlnet": "xlnet"}
# bert-base-uncased's, GPT-2's, T5's, BART's and xlnet-base-cased's vocabulary
VOCABULARIES = {"mlm": 30522, "clm": 50257, "t5": 32128, "bart": 50265, "xlnet": 32000}
SEGMENTS = {"xlnet": 2}  # the plm objective's default: a second segment read after the first's memory; others 1


@dataclass(frozen=True)
class BenchConfig:
    """The model and batch shape one comparison uses; written into its JSON line."""

    model: str
    vocab_size: int
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    max_positions: int = 512
    dropout: float = 0.1
    batch: int = 32
    seq_len: int = 128
    segments: int = 1  # consecutive segments of ``seq_len`` tokens per row, read one after another (XLNet's)

    @property
    def tokens(self) -> int:
        """The input tokens of one step."""
        return self.batch * self.segments * self.seq_len

    def block_flops(self, length: int | None = None) -> float:
        """Training FLOPs of a block stack (matrices and attention) for one batch of rows of ``length`` tokens (the
        sequence length by default)."""
        h, t = self.hidden, length or self.seq_len
        matrices = self.layers * (4 * h * h + 2 * h * self.intermediate)
        return (6 * matrices + 12 * self.layers * h * t) * self.batch * t

    def cross_attention_flops(self, source: int, target: int) -> float:
        """Training FLOPs of a decoder's cross-attention for one batch: query and output projections of the
        ``target`` tokens, key and value projections of the ``source`` tokens, scores and weighted sum."""
        h = self.hidden
        return self.layers * self.batch * (12 * h * h * (source + target) + 12 * h * source * target)


def bench_config(step: str, size: str) -> BenchConfig:
    """``step``'s (mlm, clm, t5, bart or xlnet) shape: ``mini`` is the benchmark, ``tiny`` a smoke test in seconds,
    ``base`` the papers' base size (hidden 768, 12 layers per stack, 12 heads), for a GPU, where mini's steps are
    too small to keep it busy."""
    model, segments = MODELS[step] + "-" + size, SEGMENTS.get(step, 1)
    if size == "mini":
        return BenchConfig(model, vocab_size=VOCABULARIES[step], segments=segments)
    if size == "base":
        return BenchConfig(model, vocab_size=VOCABULARIES[step], hidden=768, layers=12, heads=12, intermediate=3072,
                           segments=segments)
    return BenchConfig(model, vocab_size=512, hidden=32, layers=2, heads=2, intermediate=64, max_positions=64,
                       batch=4, seq_len=16, segments=segments)


@dataclass(frozen=True)
class Variant:
    """How both sides run: a precision (sesame's autocast), compiled or not, on a device."""

    precision: str
    compile: bool = False
    device: torch.device = torch.device("cpu")

    @property
    def name(self) -> str:
        return self.precision + ("-compile" if self.compile else "")

    def placement(self) -> Placement:
        return Placement(device=self.device, precision=self.precision, compile=self.compile)


@dataclass
class Contender:
    """One implementation in one variant: a model, what its step calls, the step, and its FLOPs."""

    name: str
    variant: Variant
    model: nn.Module
    forward: Callable
    loss: Callable[[], torch.Tensor]  # the step's loss, through ``forward``
    step: Callable[[], None]
    flops: float
    graph_breaks: dict[str, int] | None = None  # compiled: why torch.compile split the model, and how often

    @property
    def key(self) -> str:
        return f"{self.name} {self.variant.name}"

    @property
    def compiled(self) -> bool:
        """Whether the step still calls torch.compile's graph (``Placement.compiled`` drops it, with a warning,
        where compiling fails, and then runs the model as it is)."""
        return getattr(self.forward, "compiled", None) is not None


def make_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor], placement: Placement,
              lr: float = LR) -> Callable[[], None]:
    """A closure running one training step as sesame's trainer does: the forward pass under the placement's
    autocast, the loss in float32, backward, an AdamW step."""
    optimizer = adamw(model, lr=lr, weight_decay=WEIGHT_DECAY)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with placement.autocast():
            loss = loss_fn()
        loss.float().backward()
        optimizer.step()

    return step


def contender(name: str, variant: Variant, model: nn.Module, loss: Callable[[Callable], torch.Tensor],
              flops: float) -> Contender:
    """``model`` run as ``variant`` says (moved to its device): its forward (compiled or not) and a training step on
    ``loss(forward)``."""
    placement = variant.placement()
    forward = placement.compiled(placement.model(model), f"{name} model")
    return Contender(name, variant, model, forward, lambda: loss(forward),
                     make_step(model, lambda: loss(forward), placement), flops)


def generators(n: int, seed: int) -> list[torch.Generator]:
    """One generator per batch row, as ``Objective.make_batch`` takes them."""
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def check_same_size(sesame: nn.Module, hf: nn.Module, unused: int = 0) -> None:
    """Both sides must train the same number of parameters (tied matrices counted once), but for ``unused``
    parameters of transformers' that nothing reads (BART's two leading rows of each position table)."""
    counts = [sum(p.numel() for p in m.parameters()) for m in (sesame, hf)]
    if counts[0] + unused != counts[1]:
        raise AssertionError(f"parameter counts differ: sesame {counts[0]}, transformers {counts[1]} "
                             f"({unused} of them unused)")


def check_same_loss(*sides: tuple[nn.Module, Callable[[Callable], torch.Tensor]], rel: float = 1e-4) -> None:
    """Both sides compute one function: each (model, loss of a forward) without dropout (eval mode), gradients or
    autocast gives the same loss on the step's batch, within ``rel``; the models are left training."""
    losses = []
    for model, loss in sides:
        model.eval()
        with torch.no_grad():
            losses.append(loss(model).item())
        model.train()
    if not math.isclose(*losses, rel_tol=rel):
        raise AssertionError(f"losses differ without dropout: sesame {losses[0]:.6f}, transformers {losses[1]:.6f}")
