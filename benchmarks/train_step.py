"""Training-step throughput of sesame against Hugging Face transformers on the same config and batch.

Two comparisons, each one full training step (forward, backward, AdamW step) on one batch:

* ``mlm``: a BERT-mini masked LM (4 layers, hidden 256, 4 heads, feed-forward 1024, vocabulary 30522,
  512 positions, dropout 0.1 on hidden states and attention probabilities), batch 32 x 128.
  sesame: ``Transformer`` + ``MaskedLM`` with the batch from ``MaskedLM.make_batch``; transformers:
  ``BertForMaskedLM`` on the same corrupted ids, labels -100 at the unselected positions.
* ``clm``: a GPT-2-style causal LM of the same size (pre-LayerNorm, final LayerNorm, no embedding
  LayerNorm, LayerNorm eps 1e-5, no token-type embeddings, exact GELU, tied output matrix) with
  GPT-2's real vocabulary of 50257 tokens, batch 32 x 128. sesame: ``Transformer`` + ``CausalLM``;
  transformers: ``GPT2LMHeadModel`` (``activation_function="gelu"``), fed the same 128 inputs and the
  same 128 next-token targets per row (``shift_labels``).

Both sides use fp32, the same dropout rates, the same AdamW (``sesame.train.optim.adamw``: lr 1e-4,
weight decay 0.01 on matrices, fused) and the mean loss over the targets. sesame draws its dropout
masks with its own sampler (``sesame.models.transformer.dropout``: the same keep probability 0.9 and
1/0.9 scaling as ``nn.Dropout``, from cheaper random bits). The two implementations
alternate in one process: each round runs ``--steps`` steps of each (the order flips every round),
the first round is a discarded warm-up, and the reported throughput is the median over the other
rounds. Throughput counts input tokens (batch x sequence length) per second.

Model FLOPs utilisation (MFU) = model FLOPs per second / peak, where the peak is the best fp32
``torch.mm`` rate measured on this machine (2n^3 FLOPs for n x n times n x n) and the model FLOPs of
one step are counted analytically (multiply-add = 2 FLOPs; backward = 2 x forward, so training = 3 x
forward):

    6 * L * (4h^2 + 2hI) * tokens       the blocks' matrices (QKV, attention output, feed-forward)
  + 12 * L * h * T * tokens             attention scores and weighted sum (QK^T and AV)
  + 6 * (h^2 + hV) * P                  MLM head: transform dense + vocabulary projection, or
  + 6 * hV * tokens                     CLM head: vocabulary projection

with L layers, h hidden, I feed-forward width, V vocabulary, T sequence length and tokens = batch x T.
``P`` is the number of positions the MLM head is evaluated at: every position for transformers (it
projects all of them and ignores the unselected ones in the loss), only the selected ~15% for sesame
(the real work it does). Attention is counted in full for the causal model too: with attention
dropout in training both implementations compute the whole T x T score matrix. Embedding look-ups,
LayerNorm, GELU, softmax, dropout and the optimizer are not counted.

Each result records the share of the machine's CPUs that other processes used while it ran. On a
shared machine they slow both sides, and multi-threaded operators most (each waits for a descheduled
thread), which compresses the ratio; compare ratios from the same run only.

    python benchmarks/train_step.py                    # both comparisons, about 2-5 minutes
    python benchmarks/train_step.py --which clm --rounds 4 --steps 2 --json-only
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import transformers
from torch import nn
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from sesame.models import Transformer, TransformerConfig
from sesame.objectives import CausalLM, MaskedLM
from sesame.tokenizer import SpecialIds
from sesame.train.optim import adamw

LR, WEIGHT_DECAY = 1e-4, 0.01
BERT_SPECIALS = SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103)  # bert-base-uncased ids
GPT2_SPECIALS = SpecialIds(pad=50256, unk=50256, cls=50256, sep=50256, mask=50256)  # <|endoftext|>


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

    def block_flops(self) -> float:
        """Training FLOPs of the block stack (matrices and attention) for one batch."""
        h = self.hidden
        matrices = self.layers * (4 * h * h + 2 * h * self.intermediate)
        return (6 * matrices + 12 * self.layers * h * self.seq_len) * self.tokens


@dataclass
class Contender:
    """One implementation: a model, its training step, and the FLOPs one step performs."""

    name: str
    model: nn.Module
    step: Callable[[], None]
    flops: float


def make_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """A closure running one training step: forward, backward and an AdamW step."""
    optimizer = adamw(model, lr=LR, weight_decay=WEIGHT_DECAY)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn().backward()
        optimizer.step()

    return step


def generators(n: int, seed: int) -> list[torch.Generator]:
    """One generator per batch row, as ``Objective.make_batch`` takes them."""
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def sesame_backbone(cfg: BenchConfig, **style) -> Transformer:
    """sesame's Transformer in the benchmark's shape; ``style`` picks BERT or GPT-2 (norm, segments, ...)."""
    return Transformer(TransformerConfig(
        vocab_size=cfg.vocab_size, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
        intermediate=cfg.intermediate, max_positions=cfg.max_positions, dropout=cfg.dropout, **style))


def mlm_contenders(cfg: BenchConfig, seed: int) -> list[Contender]:
    """sesame ``MaskedLM`` and ``BertForMaskedLM`` on one masked batch."""
    torch.manual_seed(seed)
    backbone = sesame_backbone(cfg, type_vocab_size=2, causal=False, norm="post", embedding_norm=True,
                               layer_norm_eps=1e-12)
    sesame = MaskedLM(backbone, BERT_SPECIALS).train()
    hf = BertForMaskedLM(BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_positions, type_vocab_size=2, hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout, layer_norm_eps=1e-12,
        attn_implementation="sdpa")).train()
    check_same_size(sesame, hf)

    first_plain_id = max(BERT_SPECIALS.all) + 1
    windows = torch.randint(first_plain_id, cfg.vocab_size, (cfg.batch, MaskedLM.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = sesame.make_batch(windows, generators(cfg.batch, seed))
    n_targets = batch["targets"].numel()
    labels = torch.full((cfg.batch * cfg.seq_len,), -100, dtype=torch.long)
    labels[batch["positions"]] = batch["targets"]
    labels = labels.view(cfg.batch, cfg.seq_len)

    h, v = cfg.hidden, cfg.vocab_size
    head = 6 * (h * h + h * v)
    return [
        Contender("sesame", sesame, make_step(sesame, lambda: sesame(batch) / n_targets),
                  cfg.block_flops() + head * n_targets),
        Contender("transformers", hf, make_step(hf, lambda: hf(input_ids=batch["ids"], labels=labels).loss),
                  cfg.block_flops() + head * cfg.tokens),
    ]


def clm_contenders(cfg: BenchConfig, seed: int) -> list[Contender]:
    """sesame ``CausalLM`` (GPT-2 family) and ``GPT2LMHeadModel`` on one batch of next-token targets."""
    torch.manual_seed(seed)
    backbone = sesame_backbone(cfg, type_vocab_size=0, causal=True, norm="pre", embedding_norm=False,
                               layer_norm_eps=1e-5)
    sesame = CausalLM(backbone, GPT2_SPECIALS).train()
    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=cfg.vocab_size, n_embd=cfg.hidden, n_layer=cfg.layers, n_head=cfg.heads,
        n_inner=cfg.intermediate, n_positions=cfg.max_positions, activation_function="gelu",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5,
        attn_implementation="sdpa")).train()
    check_same_size(sesame, hf)

    windows = torch.randint(0, cfg.vocab_size, (cfg.batch, CausalLM.window_length(cfg.seq_len)),
                            generator=torch.Generator().manual_seed(seed))
    batch = sesame.make_batch(windows, generators(cfg.batch, seed))
    n_targets = batch["targets"].numel()
    ids, targets = batch["ids"].contiguous(), batch["targets"].contiguous()

    flops = cfg.block_flops() + 6 * cfg.hidden * cfg.vocab_size * cfg.tokens
    return [
        Contender("sesame", sesame, make_step(sesame, lambda: sesame(batch) / n_targets), flops),
        Contender("transformers", hf,
                  make_step(hf, lambda: hf(input_ids=ids, labels=ids, shift_labels=targets).loss), flops),
    ]


def check_same_size(sesame: nn.Module, hf: nn.Module) -> None:
    """Both sides must train the same number of parameters (tied matrices counted once)."""
    counts = [sum(p.numel() for p in m.parameters()) for m in (sesame, hf)]
    if counts[0] != counts[1]:
        raise AssertionError(f"parameter counts differ: sesame {counts[0]}, transformers {counts[1]}")


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 ``torch.mm`` rate on this machine, in FLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


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


def measure(contenders: list[Contender], rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per step of each contender in every round after the first ``warmup`` rounds."""
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    for r in range(rounds):
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            start = time.perf_counter()
            for _ in range(steps):
                c.step()
            if r >= warmup:
                times[c.name].append((time.perf_counter() - start) / steps)
    return times


def compare(bench: str, cfg: BenchConfig, contenders: list[Contender], peak: float,
            args: argparse.Namespace) -> dict:
    """Time the contenders, print the human-readable summary (unless ``--json-only``) and the JSON line."""
    wall, busy, own = time.perf_counter(), machine_busy_seconds(), own_cpu_seconds()
    times = measure(contenders, args.rounds, args.steps, args.warmup)
    others = None  # share of the machine's CPUs that other processes used meanwhile
    if busy is not None:
        others_seconds = machine_busy_seconds() - busy - (own_cpu_seconds() - own)
        others = max(0.0, others_seconds / ((time.perf_counter() - wall) * os.cpu_count()))
    seconds = {name: statistics.median(ts) for name, ts in times.items()}
    ours, theirs = contenders
    result = {
        "bench": bench,
        "config": {**asdict(cfg), "params": sum(p.numel() for p in ours.model.parameters()), "dtype": "float32",
                   "optimizer": "AdamW", "threads": args.threads, "rounds": args.rounds,
                   "warmup_rounds": args.warmup, "steps_per_round": args.steps},
        "sesame_tokens_per_s": cfg.tokens / seconds[ours.name],
        "transformers_tokens_per_s": cfg.tokens / seconds[theirs.name],
        "ratio": seconds[theirs.name] / seconds[ours.name],
        "sesame_mfu": ours.flops / seconds[ours.name] / peak,
        "transformers_mfu": theirs.flops / seconds[theirs.name] / peak,
        "sesame_gflop_per_step": ours.flops / 1e9,
        "transformers_gflop_per_step": theirs.flops / 1e9,
        "peak_gflop_per_s": peak / 1e9,
        "sesame_s_per_step_by_round": times[ours.name],
        "transformers_s_per_step_by_round": times[theirs.name],
        "other_processes_cpu_share": others,
    }
    if not args.json_only:
        print(f"{bench}: {cfg.model}, batch {cfg.batch} x {cfg.seq_len}, vocabulary {cfg.vocab_size}, "
              f"{result['config']['params'] / 1e6:.1f}M parameters")
        for c in contenders:
            print(f"  {c.name:<13} {cfg.tokens / seconds[c.name]:>7.0f} tokens/s  {seconds[c.name] * 1e3:>7.0f} ms/step"
                  f"  MFU {c.flops / seconds[c.name] / peak:6.1%}  ({c.flops / 1e9:.0f} GFLOP/step)")
        print(f"  ratio sesame/transformers {result['ratio']:.2f}x")
        if others is not None and others > 0.1:
            print(f"  contended: other processes used {others:.0%} of the {os.cpu_count()} CPUs meanwhile")
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per comparison, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="leading rounds left out of the medians")
    parser.add_argument("--steps", type=int, default=1, help="training steps per implementation per round")
    parser.add_argument("--which", choices=["mlm", "clm", "all"], default="all")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch intra-op threads (2 as specified; 1 is steadier on a busy machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-only", action="store_true", help="print only the JSON lines")
    args = parser.parse_args(argv)
    if args.rounds <= args.warmup:
        parser.error("--rounds must exceed --warmup")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    peak = matmul_peak()
    if not args.json_only:
        print(f"fp32 matmul peak: {peak / 1e9:.0f} GFLOP/s with {args.threads} torch thread(s)")
    if args.which in ("mlm", "all"):
        cfg = BenchConfig("bert-mini", vocab_size=30522)
        compare("mlm-train-step", cfg, mlm_contenders(cfg, args.seed), peak, args)
    if args.which in ("clm", "all"):
        cfg = BenchConfig("gpt2-mini", vocab_size=50257)
        compare("clm-train-step", cfg, clm_contenders(cfg, args.seed), peak, args)


if __name__ == "__main__":
    main()
