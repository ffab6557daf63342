"""Downstream tasks on real data: a pre-trained checkpoint against its from-scratch twin, and the recipes.

For each task (GLUE SST-2, CoLA, MRPC, RTE, STS-B; CoNLL-2003 NER; SQuAD v1.1) fine-tunes the
pre-trained run and a randomly initialised twin of the same architecture and tokenizer with the same
settings, and reports the task's metrics on its dev split. ``--recipes`` adds an airline ablation of
the fine-tuning recipes from the pre-trained run. Every stage is recorded in ``OUT/results.json``
as it finishes, so an interrupted run continues where it stopped; the tables go into
docs/results/foundation.md between the ``downstream`` markers.

    python scripts/downstream.py --pretrained runs/real2/bert-mini --family bert --out runs/downstream
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from recorded import open_record, replace_block, stage

import sesame

# name: (task, train, dev, task options, max length, epochs, the metrics reported)
TASKS = {
    "sst2": ("classify", "glue/SST-2/train.tsv", "glue/SST-2/dev.tsv", {"text_column": "sentence"}, 64, 1,
             ("accuracy",)),
    "cola": ("classify", "glue/CoLA/train.tsv", "glue/CoLA/dev.tsv", {"text_column": "3", "label_column": "1"}, 64, 3,
             ("mcc", "accuracy")),
    "mrpc": ("pair", "glue/MRPC/train.tsv", "glue/MRPC/dev.tsv",
             {"text_column": "#1 String", "pair_column": "#2 String", "label_column": "Quality"}, 128, 3,
             ("accuracy", "f1")),
    "rte": ("pair", "glue/RTE/train.tsv", "glue/RTE/dev.tsv", {}, 128, 3, ("accuracy",)),
    "stsb": ("regress", "glue/STS-B/train.tsv", "glue/STS-B/dev.tsv",
             {"text_column": "sentence1", "pair_column": "sentence2", "label_column": "score"}, 128, 3,
             ("pearson", "spearman")),
    "conll": ("tag", "conll2003/train.txt", "conll2003/valid.txt", {}, 128, 3, ("f1", "accuracy")),
    "squad": ("span_qa", "squad/train.json", "squad/dev.json", {}, 256, 2, ("f1", "exact")),
}
SELECT = {"cola": "mcc"}

# airline recipe ablation: name → finetune options (lrs: the full model at BERT-style rates, the
# few-parameter recipes higher, as their papers do)
RECIPES = {
    "full fine-tuning": {"lr": 2e-4},
    "discriminative (2.6) + STLR": {"lr": 5e-4, "discriminative": 2.6, "schedule": "stlr"},
    "gradual unfreezing + discriminative + STLR": {"lr": 5e-4, "discriminative": 2.6, "schedule": "stlr",
                                                   "gradual_unfreezing": True, "epochs": 5},
    "adapters (m = 64)": {"lr": 1e-3, "adapters": 64},
    "frozen features, scalar mix": {"lr": 1e-3, "features": True},
}


def fresh(run: Path) -> str:
    shutil.rmtree(run, ignore_errors=True)  # a stage that did not finish starts over
    return str(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", required=True)
    parser.add_argument("--family", required=True)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--recipes", action="store_true", help="also the airline recipe ablation")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--markdown", default="docs/results/foundation.md")
    args = parser.parse_args()
    data, out = Path(args.data), Path(args.out)
    record, results = open_record(out)
    for name in args.tasks:
        task, train, dev, options, max_length, epochs, _ = TASKS[name]
        for twin, base in (("pretrained", args.pretrained), ("scratch", f"scratch:{args.family}:mini")):
            stage(results, f"{name}-{twin}", record, lambda: sesame.finetune(
                base, str(data / train), str(data / dev), fresh(out / f"{name}-{twin}"), task=task,
                task_options=options, tokenizer=args.pretrained if twin == "scratch" else None,
                max_length=max_length, epochs=epochs, batch_size=32, lr=args.lr, select=SELECT.get(name),
                progress=False))
    if args.recipes:
        airline = dict(text_column="text", label_column="airline_sentiment", max_length=64, batch_size=32,
                       progress=False)
        for i, (name, options) in enumerate(RECIPES.items()):
            stage(results, f"airline-recipe-{i}", record, lambda: sesame.finetune(
                args.pretrained, str(data / "airline/train.csv"), str(data / "airline/dev.csv"),
                fresh(out / f"airline-recipe-{i}"), **{"epochs": 3, **airline, **options}))
    write(results, args)


def write(results: dict, args: argparse.Namespace) -> None:
    lines = [f"## Downstream tasks from `{args.pretrained}` ({args.family}-mini)", "", "```bash",
             f"python scripts/downstream.py --pretrained {args.pretrained} --family {args.family} --out {args.out} "
             f"--tasks {' '.join(args.tasks)}" + (" --recipes" if args.recipes else "") + f" --lr {args.lr:g}",
             "```", "",
             f"Both twins fine-tune with the same settings (lr {args.lr:g}, batch 32, the epochs below, the best "
             "epoch on dev kept); the scratch twin has the same architecture and tokenizer. Dev splits; one seed.",
             "", "| task | data | epochs | metric | pre-trained | scratch | gain |", "|---|---|---|---|---|---|---|"]
    for name in args.tasks:
        task, train, dev, _, _, epochs, metrics = TASKS[name]
        a, b = results.get(f"{name}-pretrained"), results.get(f"{name}-scratch")
        for metric in metrics:
            cells = [f"{100 * r[metric]:.1f}" if r else "?" for r in (a, b)]
            gain = f"{100 * (a[metric] - b[metric]):+.1f}" if a and b else "?"
            lines.append(f"| {name} ({task}) | {train} → {dev} | {epochs} | {metric} | {cells[0]} | {cells[1]} | {gain} |")
    if args.recipes:
        lines += ["", "Fine-tuning recipes on airline (train → dev, text → airline_sentiment), from the same "
                  "checkpoint, 3 epochs unless said:", "",
                  "| recipe | options | trainable parameters | dev accuracy | dev macro-F1 |", "|---|---|---|---|---|"]
        for i, (name, options) in enumerate(RECIPES.items()):
            r = results.get(f"airline-recipe-{i}")
            shown = ", ".join(f"{k}={v}" for k, v in options.items())
            lines.append(f"| {name} | {shown} | {r['trainable_parameters']:,} of {r['parameters']:,} | "
                         f"{100 * r['accuracy']:.1f} | {100 * r['macro_f1']:.1f} |" if r else f"| {name} | {shown} | ? | ? | ? |")
    lines += ["", "Metrics in % (STS-B: correlation × 100; SQuAD: exact match and F1 with the official "
              "normalisation)."]
    replace_block(Path(args.markdown), "downstream", lines)


if __name__ == "__main__":
    main()
