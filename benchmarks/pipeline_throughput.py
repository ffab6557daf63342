"""End to end: the tokens/s of a whole ``sesame pretrain`` or ``sesame finetune`` against its bare training step on
the same batches, the share of the loop spent building batches, and transformers' loop on the same data.

Jobs (``--which``): pre-training of ``bert``, ``gpt``, ``t5`` and ``electra`` (each family's own objective, as
``sesame pretrain --family F`` runs it) and ``finetune`` (a classifier from the bert run; ``bert`` is pre-trained
first when not asked for). Three sides per job, in one process, on ``--device`` in ``--precision``:

* ``command``: the pipeline as a user runs it, through sesame's Python API (tokenizer training, preparation,
  evaluation and all); its first ``--warmup`` steps are left out and the next ``--steps`` timed, wall seconds (a
  GPU's queue drained at both ends) and this process's CPU seconds. The trainer builds each step's batches on a
  background thread while the step before trains (``sesame.train.prefetch``), so two shares are reported: the wall
  time the training thread waits for its batches (what building adds to the critical path) and the CPU time spent
  building them, on whichever thread, against the process's.
* ``bare``: the same model (the command's, as placed and trained) stepping over batches built beforehand and
  already on the device: forward under autocast, backward, AdamW (``train_step_core.make_step``), no data work.
* ``peer`` (bert, gpt): transformers' ``BertForMaskedLM`` / ``GPT2LMHeadModel`` of the run's shape on the run's
  shard tokens packed into blocks of the sequence length (run_mlm/run_clm's ``group_texts``), batches from a torch
  ``DataLoader`` with ``DataCollatorForLanguageModeling`` (``--workers`` loader processes, pinned memory on CUDA),
  autocast in the same precision and the same fused AdamW: transformers' ``Trainer``'s inner loop, written out,
  because ``Trainer`` needs ``accelerate``, which sesame's environment does not install. sesame's bert runs its
  family's objective (MLM + NSP), the peer MLM alone; the causal pair is like for like.

MFU = the FLOPs of one step × steps/s / the best ``torch.mm`` rate in the precision (``train_step_timing.
matmul_peak``: the best of products up to 2048 x 2048 on a CPU, 8192 x 8192 on a GPU, whatever the model's size). A
step's FLOPs are counted by ``torch.utils.flop_counter`` on one bare step (one peer step): what each side executes, so
sesame's masked-LM head counts only its masked positions, as ``train_step_core``'s analytic count does. On a machine
shared with other work the seconds are noise in absolute terms: read the ratios, taken in one process, and the CPU
shares.

    python benchmarks/pipeline_throughput.py --size tiny --batch-size 128 --which bert gpt t5   # CPU, minutes
    python benchmarks/pipeline_throughput.py --device cuda --size base --precision bf16 --batch-size 128
    python benchmarks/pipeline_throughput.py --smoke            # tiny model, few steps: the plumbing (tests)
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import random
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop, sdpa_flop

import sesame
from sesame.data.shards import Shards
from sesame.errors import SesameError
from sesame.run import load_tokenizer, read_config
from sesame.runtime import DTYPES, check_precision, resolve_device
from sesame.tokenizer import SPECIAL_TOKENS
from sesame.train.prefetch import Phased
from sesame.train.trainer import mean_loss

sys.path.insert(0, str(Path(__file__).parent))
from train_step_core import SIZES, make_step  # noqa: E402
from train_step_timing import matmul_peak, native_bf16, synchronize  # noqa: E402

JOBS = ("bert", "gpt", "t5", "electra", "finetune")
PIPELINES = {"pretrain": "sesame.pipelines.pretrain", "finetune": "sesame.pipelines.finetune"}  # (the package's
# names pretrain and finetune are the functions)
PEERS = {"bert": ("BertConfig", "BertForMaskedLM"), "gpt": ("GPT2Config", "GPT2LMHeadModel")}
SMOKE = {"size": "tiny", "batch_size": 8, "seq_len": 32, "steps": 2, "warmup": 1, "vocab_size": 200}
WORDS = ("the a cat dog bird fish tree river stone cloud runs sleeps sings jumps over under near quickly slowly "
         "happy sad green blue old young small large house garden city road").split()

aten = torch.ops.aten  # the CPU's fused attention, which flop_counter does not count by itself
register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)(sdpa_flop)
register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)(sdpa_backward_flop)


@dataclass
class Loop:
    """What the timed steps of one side took: input tokens, wall and CPU seconds, those spent building (or fetching)
    batches, and the FLOPs per input token (None where not counted)."""
    steps: int = 0
    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    batch_wall: float = 0.0
    batch_cpu: float = 0.0
    flops_per_token: float | None = None

    def report(self, peak: float) -> dict:
        tokens_per_s = self.tokens / self.wall
        return {"tokens_per_s": round(tokens_per_s), "cpu_ms_per_step": round(1000 * self.cpu / self.steps, 2),
                "batches_wall_share": round(self.batch_wall / self.wall, 4),
                "batches_cpu_share": round(self.batch_cpu / max(self.cpu, 1e-9), 4),
                "mfu": None if self.flops_per_token is None else round(self.flops_per_token * tokens_per_s / peak, 4),
                **asdict(self)}

    def add_batch(self, wall: float, cpu: float) -> None:
        self.batch_wall, self.batch_cpu = self.batch_wall + time.perf_counter() - wall, \
            self.batch_cpu + time.process_time() - cpu


class Feed:
    """The batches a bare or peer step reads, each fetched (and moved to the device) on the clock of ``loop``, its
    input tokens counted."""

    def __init__(self, batches: Iterator[dict], move: Callable[[dict], dict]):
        self.batches, self.move, self.loop = batches, move, Loop()

    def __call__(self) -> dict:
        wall, cpu = time.perf_counter(), time.process_time()
        batch = self.move(next(self.batches))
        self.loop.add_batch(wall, cpu)
        self.loop.tokens += batch["ids" if "ids" in batch else "input_ids"].numel()
        return batch


class Clock:
    """Wall and process CPU seconds of a span; a GPU's queue drained when it starts and when it is read."""

    def __init__(self, device: torch.device):
        self.device = device
        synchronize(device)
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        synchronize(self.device)
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


class Recording:
    """What a sesame command's trainer did in its timed steps (:func:`recorded`), and the trainer itself."""

    def __init__(self, warmup: int, device: torch.device):
        self.warmup, self.device, self.loop = warmup, device, Loop()
        self.trainer, self.batches, self.clock = None, None, None

    def timed(self, batches: Callable) -> Callable:
        """``batches`` (a trainer's), the CPU seconds of its calls in timed steps (on whichever thread builds them:
        the trainer's prefetching one) added to the loop's batch-building CPU time."""
        def build(*args):
            cpu = time.thread_time()
            made = batches.build(*args) if isinstance(batches, Phased) else batches(*args)
            if self.clock is not None:
                self.loop.batch_cpu += time.thread_time() - cpu
            return made
        self.batches = batches
        return Phased(build, batches.phase) if isinstance(batches, Phased) else build

    def waited(self, take: Callable) -> Callable:
        """The prefetcher's ``take``, the training thread's wall seconds waiting in it (its batches not yet built:
        the time batch building adds to the critical path) added to the loop's batch wall time."""
        def call(*args):
            wall = time.perf_counter()
            made = take(*args)
            if self.clock is not None:
                self.loop.batch_wall += time.perf_counter() - wall
            return made
        return call

    def step(self, trainer, take_step: Callable[[], int]) -> int:
        if trainer.step == self.warmup:
            self.clock = Clock(self.device)
        tokens = take_step()
        if self.clock is not None:
            self.loop.steps, self.loop.tokens = self.loop.steps + 1, self.loop.tokens + tokens
            if trainer.step == trainer.config.max_steps:
                self.loop.wall, self.loop.cpu = self.clock.read()
                self.clock = None
        return tokens


@contextmanager
def recorded(pipeline, warmup: int, device: torch.device) -> Iterator[Recording]:
    """While the block runs, ``pipeline.Trainer`` (a pipeline module's) records its steps into the recording."""
    record, original = Recording(warmup, device), pipeline.Trainer

    class Recorded(original):
        def __init__(self, model, settings, batches, **options):
            super().__init__(model, settings, record.timed(batches), **options)
            record.trainer = self

        def _train_step(self, wrapped):
            if not hasattr(self._prefetcher, "waited"):  # a new one each fit
                self._prefetcher.take, self._prefetcher.waited = record.waited(self._prefetcher.take), True
            return record.step(self, lambda: super(Recorded, self)._train_step(wrapped))

    pipeline.Trainer = Recorded
    try:
        yield record
    finally:
        pipeline.Trainer = original


def run_loop(step: Callable[[], None], feed: Feed, *, steps: int, warmup: int, device: torch.device) -> Loop:
    """``warmup`` untimed calls of ``step``, then ``steps`` timed ones reading ``feed``; then one more under
    ``torch.utils.flop_counter`` for the FLOPs per token (matrix products and attention)."""
    for _ in range(warmup):
        step()
    loop = feed.loop = Loop()
    clock = Clock(device)
    for _ in range(steps):
        step()
    loop.wall, loop.cpu = clock.read()
    loop.steps, tokens = steps, loop.tokens
    with FlopCounterMode(display=False) as counter:
        step()
    loop.flops_per_token, loop.tokens = counter.get_total_flops() / (loop.tokens - tokens), tokens
    return loop


def bare(record: Recording, *, steps: int, warmup: int) -> Loop:
    """The command's model stepping over the batches of the very steps the command timed, built and moved
    beforehand: its warm-up steps take the first of them, then the timed steps take each once, in order (a T5
    batch's target length varies from step to step, so other batches would be another workload)."""
    trainer = record.trainer
    placement, model = trainer.placement, trainer.model
    timed = [placement.move(b) for s in range(warmup, warmup + steps) for b in record.batches(s, 0.0)]
    feed = Feed(itertools.chain(itertools.islice(itertools.cycle(timed), warmup), itertools.cycle(timed)), dict)
    forward = placement.compiled(model, "bare step")
    step = make_step(model, lambda: mean_loss(forward, feed()), placement)
    return run_loop(step, feed, steps=steps, warmup=warmup, device=placement.device)


def peer(job: str, record: Recording, run: Path, args) -> Loop:
    """transformers' model of the run's shape on the run's tokens, run_mlm/run_clm style (the module's docstring)."""
    import transformers
    from torch.utils.data import DataLoader

    config, tok = read_config(run, "--out"), load_tokenizer(run)
    m, placement = config.model, record.trainer.placement
    names = dict(zip(("config", "model"), PEERS[job]))
    shape = ({"hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
              "intermediate_size": m.intermediate, "max_position_embeddings": m.max_positions} if job == "bert" else
             {"n_embd": m.hidden, "n_layer": m.layers, "n_head": m.heads, "n_inner": m.intermediate,
              "n_positions": m.max_positions})
    torch.manual_seed(args.seed)
    model = getattr(transformers, names["model"])(getattr(transformers, names["config"])(
        vocab_size=m.vocab_size, **shape))
    model = placement.model(model)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend, **{
        f"{role}_token": token for role, token in SPECIAL_TOKENS[tok.kind].items()})
    ids = np.concatenate(Shards(config.pretrained.shards).arrays).astype(np.int64)
    length = config.pretrained.seq_len
    blocks = torch.from_numpy(ids[: len(ids) // length * length].reshape(-1, length))  # group_texts
    loader = DataLoader([{"input_ids": b} for b in blocks], batch_size=args.batch_size, shuffle=True, drop_last=True,
                        collate_fn=transformers.DataCollatorForLanguageModeling(hf_tok, mlm=job == "bert"),
                        num_workers=args.workers, pin_memory=placement.device.type == "cuda",
                        persistent_workers=args.workers > 0, generator=torch.Generator().manual_seed(args.seed))
    if len(loader) == 0:
        raise SesameError(f"--corpus: {len(blocks)} blocks of {length} tokens, fewer than a batch of the peer's")
    feed = Feed((b for _ in itertools.count() for b in loader), placement.move)
    forward = placement.compiled(model, "peer step")
    step = make_step(model, lambda: forward(**feed()).loss, placement)
    return run_loop(step, feed, steps=args.steps, warmup=args.warmup, device=placement.device)


def command(job: str, data: dict, out: Path, args) -> tuple[Path, Recording]:
    """Run the job's sesame command into ``out``, its trainer recorded."""
    device = resolve_device(args.device)
    common = {"batch_size": args.batch_size, "max_steps": args.warmup + args.steps, "eval_every": 10 ** 6,
              "save_every": 10 ** 6, "device": args.device, "precision": args.precision, "progress": False,
              "seed": args.seed}
    if job == "finetune":
        with recorded(importlib.import_module(PIPELINES["finetune"]), args.warmup, device) as record:
            sesame.finetune(str(data["base"]), str(data["train"]), str(data["dev"]), str(out),
                            text_column=data["text"], label_column=data["label"], max_length=args.seq_len, **common)
    else:
        with recorded(importlib.import_module(PIPELINES["pretrain"]), args.warmup, device) as record:
            vocab = {"vocab_size": args.vocab_size} if args.vocab_size else {}
            sesame.pretrain([str(data["corpus"])], str(out), family=job, size=args.size, seq_len=args.seq_len,
                            **vocab, **common)
    return out, record


def measure(job: str, data: dict, work: Path, args, peak: float) -> dict:
    run, record = command(job, data, work / job, args)
    sides = {"command": record.loop, "bare": bare(record, steps=args.steps, warmup=args.warmup)}
    sides["command"].flops_per_token = sides["bare"].flops_per_token  # the same model on the same batches
    if job in PEERS and not args.no_peer:
        sides["peer"] = peer(job, record, run, args)
    report = {name: loop.report(peak) for name, loop in sides.items()}
    tokens_per_s = {name: r["tokens_per_s"] for name, r in report.items()}
    return {"bench": f"pipeline-{job}", "device": str(resolve_device(args.device)), "precision": args.precision,
            "size": args.size, "batch_size": args.batch_size, "seq_len": args.seq_len, "steps": args.steps,
            "command_vs_bare": round(tokens_per_s["command"] / tokens_per_s["bare"], 3),
            "command_vs_peer": round(tokens_per_s["command"] / tokens_per_s["peer"], 3) if "peer" in report else None,
            "peak_flops": peak, **report}


def smoke_data(folder: Path) -> dict:
    """A generated corpus and labeled files, for ``--smoke``."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(1200)]
    (folder / "corpus.txt").write_text("\n\n".join("\n".join(lines[i: i + 40]) for i in range(0, 1200, 40)) + "\n")
    for split, rows in (("train", lines[:200]), ("dev", lines[200:240])):
        labeled = [f'"{s}",{"animal" if {"cat", "dog"} & set(s.lower().split()) else "none"}' for s in rows]
        (folder / f"{split}.csv").write_text("text,label\n" + "\n".join(labeled) + "\n")
    return {"corpus": folder / "corpus.txt", "train": folder / "train.csv", "dev": folder / "dev.csv",
            "text": "text", "label": "label"}


def real_data(args) -> dict:
    """The corpus given (WikiText-2's validation text by default) and the airline sentiment set."""
    root = Path(os.environ.get("SESAME_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    corpus = Path(args.corpus) if args.corpus else root / "wikitext2" / "valid.txt"
    if not corpus.exists():
        raise SesameError(f"--corpus {corpus}: no such file; give one, or set SESAME_DATA to the shared data")
    return {"corpus": corpus, "train": root / "airline" / "train.csv", "dev": root / "airline" / "dev.csv",
            "text": "text", "label": "airline_sentiment"}


def print_table(rows: list[dict]) -> None:
    print(f"{'job':<9} {'side':<8} {'tokens/s':>10} {'CPU ms/step':>12} {'batches %wall':>14} {'%CPU':>6} "
          f"{'MFU':>7}  ratio")
    for row in rows:
        for side in ("command", "bare", "peer"):
            if side not in row:
                continue
            r = row[side]
            mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.2f}%"
            ratio = {"command": f"command/bare {row['command_vs_bare']}", "peer": f"command/peer {row['command_vs_peer']}"}
            print(f"{row['bench'][9:]:<9} {side:<8} {r['tokens_per_s']:>10,} {r['cpu_ms_per_step']:>12.1f} "
                  f"{100 * r['batches_wall_share']:>13.1f}% {100 * r['batches_cpu_share']:>5.1f}% {mfu:>7}  "
                  f"{ratio.get(side, '')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--which", nargs="+", choices=JOBS, default=list(JOBS))
    parser.add_argument("--device", default="cpu", help="cpu (the default), cuda or cuda:N")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                        help="autocast precision of every side (default: bf16 where the device runs it natively)")
    parser.add_argument("--size", choices=SIZES, default="mini")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--vocab-size", type=int, help="of the tokenizer each command trains (default: sesame's)")
    parser.add_argument("--corpus", help="the text to pre-train on (default: $SESAME_DATA/wikitext2/valid.txt)")
    parser.add_argument("--workers", type=int, default=0, help="the peer's DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--no-peer", action="store_true", help="leave transformers' side out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a generated corpus, a few steps: the "
                                                             "plumbing, not the numbers")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per job, as it ends")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1 (the first step compiles, allocates, warms caches)")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device}: choose cpu, cuda or cuda:N")
    try:
        device = resolve_device(args.device)
        args.precision = args.precision or ("bf16" if native_bf16(device) else "fp32")
        check_precision(device, args.precision)
    except SesameError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    peak = matmul_peak(dtype=DTYPES.get(args.precision, torch.float32), device=device)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipeline-throughput-") as tmp:
        work = Path(tmp)
        data = smoke_data(work) if args.smoke else real_data(args)
        jobs = [j for j in JOBS if j in args.which]
        if "finetune" in jobs and "bert" not in jobs:
            command("bert", data, work / "bert", args)
        for job in jobs:
            data["base"] = work / "bert"
            rows.append(measure(job, data, work, args, peak))
            if args.json:
                print(json.dumps(rows[-1]), flush=True)
    print(f"{args.device}, {args.precision}, size {args.size}, batch {args.batch_size} x {args.seq_len}, "
          f"{args.steps} timed steps after {args.warmup}; matmul peak {peak / 1e9:,.0f} GFLOP/s, "
          f"{args.threads} torch thread(s)")
    print_table(rows)


if __name__ == "__main__":
    main()
