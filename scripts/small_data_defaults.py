"""Do the fine-tuning defaults serve a new user with little data? Airline with 1,000 labels, every setting default.

A bert mini pre-trained for ``--minutes`` by ``sesame pretrain`` (on WikiText-2 train, its defaults), then
fine-tuned with nothing but the files and columns given, next to its from-scratch twin (``scratch:bert:mini``,
the same tokenizer): the learning rate and the number of epochs are sesame's defaults for a model of that size
and a training set of that size (sesame.families.FINETUNE_RATES, from scratch sesame.specs.SCRATCH_TRAINING;
sesame.specs.default_epochs). The 1,000 training tweets and the 1,000 that pick the kept epoch are disjoint random
draws from airline train; accuracy is reported on airline dev, which neither saw. Resumable: finished stages are
read back from --out.

    python scripts/small_data_defaults.py --out runs/small-data    # about 35 minutes
"""
from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

from recorded import mean_sd, open_record, replace_block, stage

import sesame
from sesame.run import read_config

TEXT, LABEL = "text", "airline_sentiment"


def draws(train: Path, out: Path, n: int, seed: int) -> tuple[Path, Path]:
    """Two disjoint random sets of ``n`` rows of ``train``: the training set and the one that picks the epoch."""
    paths = out / f"train-{n}-{seed}.csv", out / f"select-{n}-{seed}.csv"
    if not all(p.exists() for p in paths):
        with train.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows, fields = list(reader), reader.fieldnames
        chosen = random.Random(seed).sample(rows, 2 * n)
        for path, part in zip(paths, (chosen[:n], chosen[n:])):
            with path.open("w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fields)
                writer.writeheader()
                writer.writerows(part)
    return paths


def majority(path: Path) -> float:
    with path.open(newline="", encoding="utf-8") as f:
        labels = [row[LABEL] for row in csv.DictReader(f)]
    return max(labels.count(x) for x in set(labels)) / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--minutes", type=float, default=20.0, help="pre-training budget")
    parser.add_argument("--labels", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--markdown", default="docs/results/foundation.md")
    args = parser.parse_args()
    data, out = Path(args.data), Path(args.out)
    record, results = open_record(out)
    pretrained = out / "bert-mini"
    stage(results, "pretrain", record, lambda: sesame.pretrain(
        [str(data / "wikitext2/train.txt")], str(pretrained), family="bert", size="mini",
        max_minutes=args.minutes, progress=False))
    dev = data / "airline/dev.csv"
    for seed in range(args.seeds):
        train, select = draws(data / "airline/train.csv", out, args.labels, seed)
        for twin, base in (("pretrained", str(pretrained)), ("scratch", "scratch:bert:mini")):
            run = out / f"{twin}-{seed}"

            def tune(base: str = base, run: Path = run, twin: str = twin) -> dict:
                tuned = sesame.finetune(base, str(train), str(select), str(run), text_column=TEXT, label_column=LABEL,
                                        tokenizer=str(pretrained) if twin == "scratch" else None, seed=seed,
                                        progress=False)
                config = read_config(run, "--model")
                return {"select_accuracy": tuned["accuracy"], "epochs": config.finetuned.epochs,
                        "lr": config.train["lr"],
                        "dev_accuracy": sesame.evaluate(str(run), str(dev))["accuracy"]}

            stage(results, f"{twin}-{seed}", record, tune)
    lines = ["### Fine-tuning defaults with 1,000 labels (airline)", "", "```bash",
             f"python scripts/small_data_defaults.py --out {args.out} --minutes {args.minutes:g} --seeds {args.seeds}",
             "```", "",
             f"bert mini pre-trained {args.minutes:g} minutes on WikiText-2 train by `sesame pretrain` with its "
             f"defaults (valid masked-LM perplexity {results['pretrain']['perplexity']:.0f}), then fine-tuned with "
             "sesame's defaults only; "
             f"{args.labels} training tweets and {args.labels} others picking the kept epoch, both drawn from airline "
             f"train per seed; accuracy on airline dev (majority class {100 * majority(dev):.1f}%), mean ± sd over "
             f"{args.seeds} seeds.", "",
             "| model | default lr | default epochs | airline dev accuracy |", "|---|---|---|---|"]
    for twin in ("pretrained", "scratch"):
        runs = [results[f"{twin}-{seed}"] for seed in range(args.seeds)]
        mean, sd = mean_sd([100 * r["dev_accuracy"] for r in runs])
        lines.append(f"| {twin} | {runs[0]['lr']:g} | {runs[0]['epochs']} | {mean:.1f} ± {sd:.1f} |")
    replace_block(Path(args.markdown), "small-data-defaults", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
