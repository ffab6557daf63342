"""Where pre-training pays: airline dev accuracy against the number of labeled training examples.

Fine-tunes a pre-trained run and its from-scratch twin (same architecture and tokenizer) on random
subsets of airline train (the same subset for both twins at each size and seed), at the learning
rate each twin chose on dev in ``scripts/real_data.py`` (read from its results.json), and writes
a Markdown table and a plot. Small subsets train for more epochs, so every run takes a few hundred
steps. Resumable: finished runs are read back from ``--runs``'s curve.json.

    python scripts/learning_curve.py --pretrained runs/real2/bert-mini --results runs/real2/results.json \\
        --family bert --out runs/curve-bert
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
from pathlib import Path

from recorded import mean_sd, replace_block

import sesame


def epochs_for(n: int) -> int:
    """Enough epochs for a few hundred steps of 32 examples, between 3 and 20."""
    return max(3, min(20, round(8000 / n)))


def subset(rows: list[dict], fieldnames: list[str], n: int, seed: int, path: Path) -> Path:
    if not path.exists():
        chosen = random.Random(seed).sample(rows, n) if n < len(rows) else rows
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames)
            writer.writeheader()
            writer.writerows(chosen)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", required=True, help="the pre-trained run")
    parser.add_argument("--results", required=True, help="scripts/real_data.py's results.json (the chosen lrs)")
    parser.add_argument("--family", required=True)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--markdown", default="docs/results/foundation.md")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "curve.json"
    done = json.loads(record.read_text()) if record.exists() else {}
    chosen = json.loads(Path(args.results).read_text())
    lrs = {twin: chosen[f"{args.family}-airline-{twin}"]["lr"] for twin in ("pretrained", "scratch")}
    train = Path(args.data) / "airline/train.csv"
    with train.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows, fieldnames = list(reader), list(reader.fieldnames or [])
    for n in args.sizes:
        for seed in range(args.seeds):
            part = subset(rows, fieldnames, n, seed, out / f"train-{n}-seed{seed}.csv")
            for twin, base in (("pretrained", args.pretrained), ("scratch", f"scratch:{args.family}:mini")):
                key = f"{twin}-{n}-seed{seed}"
                if key in done:
                    continue
                run = out / key
                shutil.rmtree(run, ignore_errors=True)
                result = sesame.finetune(
                    base, str(part), str(Path(args.data) / "airline/dev.csv"), str(run), text_column="text",
                    label_column="airline_sentiment", tokenizer=args.pretrained if twin == "scratch" else None,
                    max_length=64, epochs=epochs_for(n), batch_size=32, lr=lrs[twin], seed=seed, progress=False)
                done[key] = result["accuracy"]
                record.write_text(json.dumps(done, indent=1) + "\n")
                print(key, round(result["accuracy"], 4), flush=True)
                shutil.rmtree(run / "checkpoint", ignore_errors=True)  # keep the result, not the optimizer state
    write(done, args, lrs)


def write(done: dict, args: argparse.Namespace, lrs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = {twin: [mean_sd([done[f"{twin}-{n}-seed{s}"] for s in range(args.seeds)]) for n in args.sizes]
             for twin in ("pretrained", "scratch")}
    sizes = " ".join(map(str, args.sizes))
    lines = [f"### {args.family}: airline dev accuracy by number of training examples", "",
             "```bash", f"python scripts/learning_curve.py --pretrained {args.pretrained} --results {args.results} "
             f"--family {args.family} --out {args.out} --sizes {sizes} --seeds {args.seeds}", "```", "",
             f"Random subsets of airline train (the same for both twins), {args.seeds} seeds each, lr as chosen on "
             f"dev with the full training set (pre-trained {lrs['pretrained']:g}, scratch {lrs['scratch']:g}); "
             "epochs = max(3, min(20, round(8000 / n))). Accuracy in %, mean ± sd over seeds.", "",
             "| training examples | epochs | pre-trained | scratch | gain |", "|---|---|---|---|---|"]
    for i, n in enumerate(args.sizes):
        (pm, ps), (sm, ss) = table["pretrained"][i], table["scratch"][i]
        lines.append(f"| {n} | {epochs_for(n)} | {100 * pm:.1f} ± {100 * ps:.1f} | {100 * sm:.1f} ± {100 * ss:.1f} | "
                     f"{100 * (pm - sm):+.1f} |")
    figure = Path(args.markdown).parent / f"learning_curve_{args.family}.png"
    lines += ["", f"![learning curve]({figure.name})"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for twin, style in (("pretrained", "o-"), ("scratch", "s--")):
        means = [100 * m for m, _ in table[twin]]
        sds = [100 * s for _, s in table[twin]]
        ax.errorbar(args.sizes, means, yerr=sds, fmt=style, capsize=3, label=f"{args.family}-mini {twin}")
    ax.set_xscale("log")
    ax.set_xlabel("labeled training examples (log scale)")
    ax.set_ylabel("airline dev accuracy (%)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(figure, dpi=120)
    replace_block(Path(args.markdown), f"curve-{args.family}", lines)


if __name__ == "__main__":
    main()
