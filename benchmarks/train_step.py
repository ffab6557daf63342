"""Training-step throughput of sesame against Hugging Face transformers on the same config, batch and precision.

Four comparisons (``--which``: mlm and clm by default), each one full training step (forward, backward, AdamW step)
on one batch:

* ``mlm``: a BERT-mini masked LM (4 layers, hidden 256, 4 heads, feed-forward 1024, vocabulary 30522,
  512 positions, dropout 0.1 on hidden states and attention probabilities), batch 32 x 128.
  sesame: ``Transformer`` + ``MaskedLM`` with the batch from ``MaskedLM.make_batch``; transformers:
  ``BertForMaskedLM`` on the same corrupted ids, labels -100 at the unselected positions.
* ``clm``: a GPT-2-style causal LM of the same size (pre-LayerNorm, final LayerNorm, no embedding
  LayerNorm, LayerNorm eps 1e-5, no token-type embeddings, exact GELU, tied output matrix) with
  GPT-2's real vocabulary of 50257 tokens, batch 32 x 128. sesame: ``Transformer`` + ``CausalLM``;
  transformers: ``GPT2LMHeadModel`` (``activation_function="gelu"``), fed the same 128 inputs and the
  same 128 next-token targets per row (``shift_labels``).
* ``t5``: T5 v1.0's span corruption (Raffel et al. 2020, §3.1.4: 15% noise in spans of mean length 3) with an
  encoder-decoder of the same size in each stack (4 + 4 layers, hidden 256, 4 heads, feed-forward 1024: the sizes
  of the t5 family's mini, ``sesame.families.SIZES``; 512 positions) and T5's vocabulary of 32128 tokens, batch
  32 x 128 encoder tokens (about 30 targets per row). sesame: ``EncoderDecoder`` + ``SpanCorruption``; transformers:
  ``T5ForConditionalGeneration``, fed the same corrupted ids and targets as ``labels`` (it shifts them right behind
  its start token, as sesame does).
* ``bart``: BART's denoising (Lewis et al. 2020: text infilling and sentence permutation) with the bart family's
  mini (the same sizes) and BART's vocabulary of 50265 tokens, batch 32 x 128 (encoder inputs padded to the
  longest row, an attention mask; 128 targets per row). sesame: ``EncoderDecoder`` + ``Denoising``;
  transformers: ``BartForConditionalGeneration``.
  Both encoder-decoder comparisons build transformers' configuration from sesame's with the interop's
  ``hf_config`` and copy transformers' random initial weights into sesame's model (``encoder_decoder_pair.py``),
  so both sides start from the same function; windows are random ids. Words and sentences of random ids for
  BART: a seeded draw makes 3 ids in 4 begin a word and 1 in 20 end a sentence. Dropout 0.1 on both sides,
  transformers' where its models put it: T5's also inside the feed-forward and after the final norm, where sesame
  has none (``sesame.models.encoder_decoder``'s deviations), so T5's transformers step does a little more.

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
both sides is fair: transformers' models support torch.compile. A compiled contender first takes 3
untimed steps (sesame's model compiles on its first two calls: the guard on its loss's reused buffer
fails once the buffer exists), which also count the graph breaks torch.compile met, by reason.

All contenders of one comparison (two per variant) alternate in one process: each round runs
``--steps`` steps of each (the order flips every round), the first round is a discarded warm-up, and
the reported throughput is the median over the other rounds. Throughput counts input tokens (batch x
sequence length) per second.

Model FLOPs utilisation (MFU) = model FLOPs per second / peak, where the peak is the best ``torch.mm``
rate measured on this machine in the variant's precision (float32 or bfloat16 matrices; 2n^3 FLOPs for
n x n times n x n, n = 2048) and the model FLOPs of
one step are counted analytically (multiply-add = 2 FLOPs; backward = 2 x forward, so training = 3 x
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
LayerNorm, GELU, softmax, dropout and the optimizer are not counted.

Output: one JSON line per variant, ``bench`` naming the step and variant (``mlm-fp32``, ``mlm-bf16``,
``clm-bf16-compile``, ``t5-fp32``, ``bart-bf16``), ``ratio`` = sesame's tokens/s over transformers' (the
encoder-decoders' tokens are the encoder's batch x 128 positions); then, when fp32 is among the
precisions, one line per other variant with sesame's own speed-up over its fp32 step (``bench``
``mlm-bf16-vs-fp32``, ``ratio``, ``peak_ratio`` = that precision's matmul peak over fp32's, measured in
the same run, ``share_of_peak_ratio`` = ratio / peak_ratio, ``transformers_ratio`` the same speed-up
for transformers, ``native_bf16`` whether this CPU has AVX512-BF16 or AMX). A CPU without native
bfloat16 computes bf16 matrix products by conversion, slower than fp32: its ``peak_ratio`` is below 1
and the bf16 lines report that slowdown as measured. Whether bf16 trains as well as fp32 is
``benchmarks/precision_loss.py``'s question.

Devices. ``--device cpu`` (the default) or ``cuda``/``cuda:N``: both sides' models, batches and the matmul peak on that
device (it must run every ``--precision``, as sesame's flags require); on CUDA the clock is read only after
``torch.cuda.synchronize``, and each JSON line adds each side's peak step memory
(``{side}_peak_step_memory_mib``: ``torch.cuda.max_memory_allocated`` during its timed steps above what was
allocated when they began, i.e. activations, gradients and temporaries; the weights and AdamW state, equal on both
sides, are left out; null on a CPU). ``native_bf16`` is the GPU's bfloat16 support there.

Each result records the share of the machine's CPUs that other processes used while it ran. On a
shared machine they slow both sides, and multi-threaded operators most (each waits for a descheduled
thread), which compresses the ratio; compare ratios from the same run only.

Durations on the two cores of a quiet machine: fp32 from docs/results.md; bf16 and compile estimated, not
yet timed there (bf16 from the fp32 step times, their MFU and a bf16/fp32 matmul peak ratio of about 0.2, as
measured on this CPU without native bfloat16: about 1.7 s and 6 s per MLM step for sesame and transformers,
6 s and 8 s per causal step; compile adds a few minutes of compiling, while priming, per model):

    python benchmarks/train_step.py                       # fp32 and bf16, mlm and clm: about 5-8 minutes
    python benchmarks/train_step.py --compile bf16        # and bf16 + compile: about 10-20 minutes
    python benchmarks/train_step.py --precision fp32      # the fp32 comparison alone: about 2-5 minutes
    python benchmarks/train_step.py --which clm --rounds 4 --steps 2 --json-only
    python benchmarks/train_step.py --which t5 bart       # the encoder-decoders, fp32 and bf16 (not yet timed)
    python benchmarks/train_step.py --which all           # all four steps
    python benchmarks/train_step.py --size tiny --rounds 2 --threads 1    # smoke test: seconds of CPU time
    python benchmarks/train_step.py --device cuda --precision fp32 bf16   # on a GPU (scripts/gpu_check.sh)
    python benchmarks/train_step.py --device cuda --size base --which all  # base size: mini leaves a GPU idle

The encoder-decoder steps have not been timed here. By the FLOP count above (a pencil estimate, not a
measurement) a t5 step is about 0.4x the causal step's work (its decoder reads some 30 targets a row: ~170 GFLOP
against ~400) and a bart step about 1.25x (~500 GFLOP, two thirds of it the 50265-token projection of 128 targets a
row), so with the causal step's times ``--which t5 bart`` should take minutes, like the default's mlm and clm.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn
from torch._dynamo.utils import counters
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from sesame.interop.encoder_decoder import POSITION_OFFSET
from sesame.models import Transformer, TransformerConfig
from sesame.errors import SesameError
from sesame.objectives import CausalLM, MaskedLM
from sesame.objectives.mlm import masked_entries
from sesame.runtime import DTYPES, Placement, check_precision, native_bf16_cpu, resolve_device
from sesame.tokenizer import SpecialIds
from sesame.train.optim import adamw

sys.path.insert(0, str(Path(__file__).parent))
from encoder_decoder_pair import OBJECTIVES, SENTINELS, SPECIALS, build_pair  # noqa: E402

LR, WEIGHT_DECAY = 1e-4, 0.01
BERT_SPECIALS = SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103)  # bert-base-uncased ids
PRECISIONS = ("fp32", "bf16")  # the CPU's (fp16 autocast is CUDA-only in sesame)
PEAK_N = {"base": 4096, "mini": 2048, "tiny": 256}  # the matrix size of the matmul peak
PRIMING_STEPS = 3  # untimed steps of a compiled contender: sesame's model compiles on its first two calls
MODELS = {"mlm": "bert", "clm": "gpt2", "t5": "t5", "bart": "bart"}
VOCABULARIES = {"mlm": 30522, "clm": 50257, "t5": 32128, "bart": 50265}  # bert-base-uncased's, GPT-2's, T5's, BART's


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

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

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
    """``step``'s (mlm, clm, t5 or bart) shape: ``mini`` is the benchmark, ``tiny`` a smoke test in seconds,
    ``base`` the papers' base size (hidden 768, 12 layers per stack, 12 heads), for a GPU, where mini's steps are
    too small to keep it busy."""
    model = MODELS[step] + "-" + size
    if size == "mini":
        return BenchConfig(model, vocab_size=VOCABULARIES[step])
    if size == "base":
        return BenchConfig(model, vocab_size=VOCABULARIES[step], hidden=768, layers=12, heads=12, intermediate=3072)
    return BenchConfig(model, vocab_size=512, hidden=32, layers=2, heads=2, intermediate=64, max_positions=64,
                       batch=4, seq_len=16)


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


def sesame_model(step: str, cfg: BenchConfig) -> MaskedLM | CausalLM:
    """sesame's ``MaskedLM`` (BERT style) or ``CausalLM`` (GPT-2 style) in the benchmark's shape, training."""
    bert = step == "mlm"
    backbone = Transformer(TransformerConfig(
        vocab_size=cfg.vocab_size, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
        intermediate=cfg.intermediate, max_positions=cfg.max_positions, dropout=cfg.dropout,
        type_vocab_size=2 if bert else 0, causal=not bert, norm="post" if bert else "pre", embedding_norm=bert,
        layer_norm_eps=1e-12 if bert else 1e-5))
    if bert:
        return MaskedLM(backbone, BERT_SPECIALS).train()
    eos = cfg.vocab_size - 1  # GPT-2's <|endoftext|> is its last id
    return CausalLM(backbone, SpecialIds(pad=eos, unk=eos, cls=eos, sep=eos, mask=eos)).train()


def first_plain_id(step: str) -> int:
    """The smallest id a window may hold: above BERT's, T5's or BART's special tokens, any for GPT-2."""
    specials = {"mlm": BERT_SPECIALS, **SPECIALS}.get(step)
    return max(specials.all) + 1 if specials else 0


def mlm_contenders(cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame ``MaskedLM`` and ``BertForMaskedLM`` on one masked batch."""
    torch.manual_seed(seed)
    sesame = sesame_model("mlm", cfg)
    hf = BertForMaskedLM(BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_positions, type_vocab_size=2, hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout, layer_norm_eps=1e-12,
        attn_implementation="sdpa")).train()
    check_same_size(sesame, hf)

    windows = torch.randint(first_plain_id("mlm"), cfg.vocab_size, (cfg.batch, MaskedLM.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = sesame.make_batch(windows, generators(cfg.batch, seed))
    n_targets = batch["masked"]
    labels = torch.full((cfg.batch * cfg.seq_len,), -100, dtype=torch.long)
    labels[masked_entries(batch, "positions")] = masked_entries(batch, "targets")
    batch, labels = variant.placement().move((batch, labels.view(cfg.batch, cfg.seq_len)))

    h, v = cfg.hidden, cfg.vocab_size
    head = 6 * (h * h + h * v)
    return [
        contender("sesame", variant, sesame, lambda forward: forward(batch).float() / n_targets,
                  cfg.block_flops() + head * n_targets),
        contender("transformers", variant, hf, lambda forward: forward(input_ids=batch["ids"], labels=labels).loss,
                  cfg.block_flops() + head * cfg.tokens),
    ]


def clm_contenders(cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame ``CausalLM`` (GPT-2 family) and ``GPT2LMHeadModel`` on one batch of next-token targets."""
    torch.manual_seed(seed)
    sesame = sesame_model("clm", cfg)
    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=cfg.vocab_size, n_embd=cfg.hidden, n_layer=cfg.layers, n_head=cfg.heads,
        n_inner=cfg.intermediate, n_positions=cfg.max_positions, activation_function="gelu",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5,
        attn_implementation="sdpa")).train()
    check_same_size(sesame, hf)

    windows = torch.randint(0, cfg.vocab_size, (cfg.batch, CausalLM.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = variant.placement().move(sesame.make_batch(windows, generators(cfg.batch, seed)))
    n_targets = batch["targets"].numel()
    ids, targets = batch["ids"].contiguous(), batch["targets"].contiguous()

    flops = cfg.block_flops() + 6 * cfg.hidden * cfg.vocab_size * cfg.tokens
    return [
        contender("sesame", variant, sesame, lambda forward: forward(batch).float() / n_targets, flops),
        contender("transformers", variant, hf,
                  lambda forward: forward(input_ids=ids, labels=ids, shift_labels=targets).loss, flops),
    ]


def seq2seq_contenders(style: str, cfg: BenchConfig, seed: int, variant: Variant) -> list[Contender]:
    """sesame's ``SpanCorruption`` (t5) or ``Denoising`` (bart) and ``T5ForConditionalGeneration`` or
    ``BartForConditionalGeneration`` of the configuration the interop derives from sesame's, both from the same
    weights (``encoder_decoder_pair.build_pair``), on one batch of sesame's corruption of random windows."""
    backbone, hf = build_pair(style, vocab_size=cfg.vocab_size, hidden=cfg.hidden, layers=cfg.layers,
                              heads=cfg.heads, intermediate=cfg.intermediate, max_positions=cfg.max_positions,
                              dropout=cfg.dropout, seed=seed)
    sesame = OBJECTIVES[style](backbone, cfg.vocab_size, seed).train()
    check_same_size(sesame, hf, unused=2 * POSITION_OFFSET[style] * cfg.hidden)

    windows = torch.randint(first_plain_id(style), cfg.vocab_size - SENTINELS, (cfg.batch, sesame.window_length(
        cfg.seq_len)), generator=torch.Generator().manual_seed(seed))  # below T5's sentinels
    batch = variant.placement().move(sesame.make_batch(windows, generators(cfg.batch, seed)))
    ids, targets, padding = batch["ids"], batch["targets"], batch.get("padding")
    mask = None if padding is None else padding.long()
    n_targets = targets.numel()

    source, target = ids.shape[1], targets.shape[1]
    flops = (cfg.block_flops(source) + cfg.block_flops(target) + cfg.cross_attention_flops(source, target)
             + 6 * cfg.hidden * cfg.vocab_size * n_targets)
    return [
        contender("sesame", variant, sesame, lambda forward: forward(batch).float() / n_targets, flops),
        contender("transformers", variant, hf,
                  lambda forward: forward(input_ids=ids, attention_mask=mask, labels=targets).loss, flops),
    ]


CONTENDERS = {"mlm": mlm_contenders, "clm": clm_contenders, "t5": partial(seq2seq_contenders, "t5"),
              "bart": partial(seq2seq_contenders, "bart")}
DEFAULT_STEPS = ("mlm", "clm")  # the steps of the commands docs/results.md records, which the default still runs


def check_same_size(sesame: nn.Module, hf: nn.Module, unused: int = 0) -> None:
    """Both sides must train the same number of parameters (tied matrices counted once), but for ``unused``
    parameters of transformers' that nothing reads (BART's two leading rows of each position table)."""
    counts = [sum(p.numel() for p in m.parameters()) for m in (sesame, hf)]
    if counts[0] + unused != counts[1]:
        raise AssertionError(f"parameter counts differ: sesame {counts[0]}, transformers {counts[1]} "
                             f"({unused} of them unused)")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CUDA GPU runs it asynchronously), before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32,
                device: torch.device = torch.device("cpu")) -> float:
    """Best ``torch.mm`` rate on ``device`` for ``dtype`` matrices, in FLOP/s."""
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    out = torch.empty(n, n, dtype=dtype, device=device)
    torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 natively: a CPU with AVX512-BF16 or AMX, a GPU that supports it."""
    return torch.cuda.is_bf16_supported() if device.type == "cuda" else native_bf16_cpu()


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux ``/proc/stat``), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prime(contender: Contender) -> None:
    """Untimed steps of a compiled contender, so that compiling stays out of every round (sesame's model compiles
    twice: the guard on its loss's reused buffer fails on the second call, once the buffer exists); records the
    graph breaks torch.compile met meanwhile (torch._dynamo's counters), reason: count."""
    before = Counter(counters["graph_break"])
    for _ in range(PRIMING_STEPS):
        contender.step()
    breaks = Counter(counters["graph_break"]) - before
    contender.graph_breaks = {reason.strip().splitlines()[0][:160]: n for reason, n in breaks.items()}


def measure(contenders: list[Contender], rounds: int, steps: int, warmup: int
            ) -> tuple[dict[str, list[float]], dict[str, float | None]]:
    """Seconds per step of each contender in every round after the first ``warmup`` rounds (compiled ones
    primed first; a GPU's queue drained before each clock reading), and on CUDA each one's peak step memory in
    MiB over those rounds: ``torch.cuda.max_memory_allocated`` above what was allocated when its steps began
    (activations, gradients and temporaries; every contender's weights and AdamW state, resident throughout, left
    out: both sides train the same number of parameters), None on a CPU."""
    for c in contenders:
        if c.variant.compile:
            prime(c)
    times: dict[str, list[float]] = {c.key: [] for c in contenders}
    peaks: dict[str, float | None] = {c.key: None for c in contenders}
    for r in range(rounds):
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            device = c.variant.device
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                resident = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            for _ in range(steps):
                c.step()
            synchronize(device)
            if r >= warmup:
                times[c.key].append((time.perf_counter() - start) / steps)
                if device.type == "cuda":
                    peak = (torch.cuda.max_memory_allocated(device) - resident) / 2 ** 20
                    peaks[c.key] = max(peaks[c.key] or 0.0, peak)
    return times, peaks


def compare(step: str, cfg: BenchConfig, contenders: list[Contender], peaks: dict[str, float],
            args: argparse.Namespace) -> list[dict]:
    """Time every contender (all variants alternating in one loop), print the human-readable summary (unless
    ``--json-only``), a JSON line per variant (sesame against transformers) and one per variant but fp32
    (sesame's speed-up over its own fp32 step)."""
    wall, busy, own = time.perf_counter(), machine_busy_seconds(), own_cpu_seconds()
    times, memory = measure(contenders, args.rounds, args.steps, args.warmup)
    others = None  # share of the machine's CPUs that other processes used meanwhile
    if busy is not None:
        others_seconds = machine_busy_seconds() - busy - (own_cpu_seconds() - own)
        others = max(0.0, others_seconds / ((time.perf_counter() - wall) * os.cpu_count()))
    seconds = {key: statistics.median(ts) for key, ts in times.items()}
    pairs = [(contenders[i], contenders[i + 1]) for i in range(0, len(contenders), 2)]  # (sesame, transformers)
    results = []
    for ours, theirs in pairs:
        variant, peak = ours.variant, peaks[ours.variant.precision]
        results.append({
            "bench": f"{step}-{variant.name}",
            "config": {**asdict(cfg), "params": sum(p.numel() for p in ours.model.parameters()),
                       "precision": variant.precision, "compile": variant.compile, "optimizer": "AdamW",
                       "threads": args.threads, "rounds": args.rounds, "warmup_rounds": args.warmup,
                       "steps_per_round": args.steps, "device": str(variant.device)},
            "sesame_tokens_per_s": cfg.tokens / seconds[ours.key],
            "transformers_tokens_per_s": cfg.tokens / seconds[theirs.key],
            "ratio": seconds[theirs.key] / seconds[ours.key],
            "sesame_mfu": ours.flops / seconds[ours.key] / peak,
            "transformers_mfu": theirs.flops / seconds[theirs.key] / peak,
            "sesame_gflop_per_step": ours.flops / 1e9,
            "transformers_gflop_per_step": theirs.flops / 1e9,
            "peak_gflop_per_s": peak / 1e9,
            "sesame_compiled": ours.compiled,
            "transformers_compiled": theirs.compiled,
            "sesame_peak_step_memory_mib": memory[ours.key],
            "transformers_peak_step_memory_mib": memory[theirs.key],
            "sesame_graph_breaks": ours.graph_breaks,
            "transformers_graph_breaks": theirs.graph_breaks,
            "sesame_s_per_step_by_round": times[ours.key],
            "transformers_s_per_step_by_round": times[theirs.key],
            "other_processes_cpu_share": others,
        })
    results += speedups(step, pairs, seconds, peaks, others)
    if not args.json_only:
        print_summary(step, cfg, contenders, results, seconds, peaks, others, memory)
    for r in results:
        print(json.dumps(r), flush=True)
    return results


def speedups(step: str, pairs: list[tuple[Contender, Contender]], seconds: dict[str, float],
             peaks: dict[str, float], others: float | None) -> list[dict]:
    """Each variant's speed-up over the fp32 step, against the matmul peak ratio of its precision (none
    without an fp32 variant)."""
    base = next((pair for pair in pairs if pair[0].variant.name == "fp32"), None)
    lines = []
    for ours, theirs in pairs if base else []:
        if ours is base[0]:
            continue
        ratio = seconds[base[0].key] / seconds[ours.key]
        peak_ratio = peaks[ours.variant.precision] / peaks["fp32"]
        lines.append({
            "bench": f"{step}-{ours.variant.name}-vs-fp32",
            "ratio": ratio,
            "peak_ratio": peak_ratio,
            "share_of_peak_ratio": ratio / peak_ratio,
            "transformers_ratio": seconds[base[1].key] / seconds[theirs.key],
            "native_bf16": native_bf16(ours.variant.device),
            "other_processes_cpu_share": others,
        })
    return lines


def print_summary(step: str, cfg: BenchConfig, contenders: list[Contender], results: list[dict],
                  seconds: dict[str, float], peaks: dict[str, float], others: float | None,
                  memory: dict[str, float | None]) -> None:
    print(f"{step}: {cfg.model}, batch {cfg.batch} x {cfg.seq_len}, vocabulary {cfg.vocab_size}, "
          f"{results[0]['config']['params'] / 1e6:.1f}M parameters")
    for c in contenders:
        s, peak = seconds[c.key], peaks[c.variant.precision]
        compiled = "" if not c.variant.compile else "  compile failed: eager" if not c.compiled else \
            f"  {sum(c.graph_breaks.values())} graph breaks"
        held = "" if memory[c.key] is None else f"  peak step memory {memory[c.key]:.0f} MiB"
        print(f"  {c.key:<26} {cfg.tokens / s:>7.0f} tokens/s  {s * 1e3:>7.0f} ms/step"
              f"  MFU {c.flops / s / peak:6.1%}  ({c.flops / 1e9:.1f} GFLOP/step){held}{compiled}")
    for r in results:
        against = f"over sesame fp32 (peak ratio {r['peak_ratio']:.2f})" if "peak_ratio" in r else "sesame/transformers"
        print(f"  {r['bench']}: {against} {r['ratio']:.2f}x")
    if others is not None and others > 0.1:
        print(f"  contended: other processes used {others:.0%} of the {os.cpu_count()} CPUs meanwhile")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per comparison, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="leading rounds left out of the medians")
    parser.add_argument("--steps", type=int, default=1, help="training steps per implementation per round")
    parser.add_argument("--which", nargs="+", choices=[*CONTENDERS, "all"], default=list(DEFAULT_STEPS),
                        help=f"the steps to compare (default {' '.join(DEFAULT_STEPS)}, as docs/results.md's commands "
                             "ran; all: every one)")
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                        help="autocast precisions to run, on both sides (fp32 also gives the X-vs-fp32 lines)")
    parser.add_argument("--compile", nargs="+", choices=PRECISIONS, default=[], metavar="PRECISION",
                        help="precisions (of --precision) to run once more under torch.compile, on both sides")
    parser.add_argument("--size", choices=["mini", "tiny", "base"], default="mini",
                        help="mini: the benchmark; tiny: a smoke test in seconds (its numbers mean nothing); base: "
                             "hidden 768 and 12 layers, for a GPU (minutes per round on a CPU)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch intra-op threads (2 as specified; 1 is steadier on a busy machine)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (the default), cuda or cuda:N: where both sides run (as sesame's --device)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-only", action="store_true", help="print only the JSON lines")
    args = parser.parse_args(argv)
    if args.rounds <= args.warmup:
        parser.error("--rounds must exceed --warmup")
    if not set(args.compile) <= set(args.precision):
        parser.error(f"--compile {' '.join(args.compile)}: compile only precisions of --precision "
                     f"({' '.join(args.precision)})")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device}: choose cpu, cuda or cuda:N")
    try:  # the device must exist and run every precision asked for, as sesame's --device and --precision
        device = resolve_device(args.device)
        for precision in args.precision:
            check_precision(device, precision)
    except SesameError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    precisions = list(dict.fromkeys(["fp32", *args.precision]))  # fp32's peak is the peak ratio's reference
    peaks = {p: matmul_peak(PEAK_N[args.size], dtype=DTYPES.get(p, torch.float32), device=device)
             for p in precisions}
    if not args.json_only:
        print(", ".join(f"{p} matmul peak {peaks[p] / 1e9:.0f} GFLOP/s" for p in precisions)
              + f" on {device} with {args.threads} torch thread(s); native bf16: {native_bf16(device)}")
    variants = [Variant(p, device=device) for p in dict.fromkeys(args.precision)]
    variants += [Variant(p, compile=True, device=device) for p in dict.fromkeys(args.compile)]
    for step in CONTENDERS if "all" in args.which else dict.fromkeys(args.which):
        cfg = bench_config(step, args.size)
        contenders = [c for v in variants for c in CONTENDERS[step](cfg, args.seed, v)]
        compare(step, cfg, contenders, peaks, args)


if __name__ == "__main__":
    main()
