"""SST-2 and RTE as text to text against the same encoder-decoder with a classification head.

For each run (``t5``, ``bart``) and task, two fine-tunes with the same epochs, batch, learning rate and length:
``--task text2text`` with ``cast=classify``/``pair`` (T5's inputs: ``sst2 sentence: …``, ``rte sentence1: …
sentence2: …``; the answer is the label's word, Raffel et al. 2020, Appendix D) and ``--task classify``/``pair``
with the family's head (the encoder's pooled state for ``t5``, BART's last decoder state, Lewis et al. 2020
§3.1). ``--scratch-twins`` adds each run's from-scratch twin (``scratch:FAMILY:SIZE`` with the run's tokenizer),
fine-tuned both ways too. The budget is the 15-minute compare's (one SST-2 epoch, three of RTE's, 64 and 128
tokens), or ``--steps``. Reported: dev accuracy after the last step (no selection) and at the kept evaluation
(fine-tuning evaluates at each epoch's end and at the last step; the best of those selects on the dev set it is
scored on: read it as an upper bound), and the minutes each took. Rows are appended to ``OUT/rows.jsonl``;
``OUT/results.md`` tables them.

    python scripts/text_vs_head.py --run t5=runs/compare-20min/pretrain/t5-mini \\
        --run bart=runs/compare-20min/pretrain/bart-mini --scratch-twins --out runs/text-vs-head
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sesame.apps.compare.tasks import SHORTCUTS, default_data
from sesame.run import read_config

WORDS = {"sst2": '{"0": "negative", "1": "positive"}', "rte": None}  # RTE's labels are words already
EPOCHS = {"sst2": 1, "rte": 3}  # the 15-minute compare's fine-tuning (docs/results/encoders.md)
LENGTHS = {"sst2": 64, "rte": 128}


def finetune(out: Path, start: list[str], task: str, way: str, args: argparse.Namespace) -> dict:
    """One fine-tune of ``start`` (``--from``'s value, and a ``--tokenizer`` for a scratch twin) on ``task`` as
    ``way`` (``text`` or ``head``); its dev accuracies and steps."""
    files = SHORTCUTS[task]
    paired = "pair_column" in files
    budget = ["--max-steps", str(args.steps)] if args.steps else ["--epochs", str(EPOCHS[task])]
    common = ["--from", *start, "--train", str(args.data / files["train"]), "--dev", str(args.data / files["dev"]),
              *budget, "--batch-size", "32",
              "--lr", str(args.lr), "--max-length", str(LENGTHS[task]), "--out", str(out)]
    if way == "text":
        cast = ["--task", "text2text", "--task-option", f"cast={'pair' if paired else 'classify'}",
                "--task-option", f"prefix={task}", "--task-option", f"source_column={files['text_column']}",
                "--task-option", f"target_column={files['label_column']}", "--task-option", "max_target_length=8"]
        cast += ["--task-option", f"pair_column={files['pair_column']}"] if paired else []
        cast += ["--task-option", f"label_words={WORDS[task]}"] if WORDS[task] else []
    else:
        cast = ["--task", "pair" if paired else "classify", "--text-column", files["text_column"],
                "--label-column", files["label_column"]]
        cast += ["--pair-column", files["pair_column"]] if paired else []
    started = time.time()
    print("$ sesame finetune", " ".join(common + cast), flush=True)
    subprocess.run([sys.executable, "-m", "sesame", "finetune", *common, *cast], check=True)
    evals = [row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if row.get("split") == "dev" and "accuracy" in row]
    steps = max(row["step"] for row in evals)
    return {"steps": steps, "last": evals[-1]["accuracy"], "kept": max(row["accuracy"] for row in evals),
            "minutes": round((time.time() - started) / 60, 1)}


def table(rows: list[dict]) -> str:
    lines = ["| run | task | as | steps | dev accuracy, last step | dev accuracy, kept | minutes |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['task']} | {r['way']} | {r['steps']} | {r['last']:.4f} | {r['kept']:.4f} "
              f"| {r['minutes']} |" for r in rows]
    return "\n".join(lines) + "\n"


def starts(runs: dict[str, str], *, twins: bool) -> dict[str, list[str]]:
    """Each row name's ``--from`` (and ``--tokenizer``) arguments: the runs, and with ``twins`` each run's
    from-scratch twin, ``NAME-scratch``: the run's family and size from scratch, reading the run's tokenizer."""
    rows = {name: [run] for name, run in runs.items()}
    for name, run in runs.items() if twins else ():
        config = read_config(run, "--run")
        rows[f"{name}-scratch"] = [f"scratch:{config.family}:{config.size}", "--tokenizer",
                                   str(Path(run) / "tokenizer.json")]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=RUN",
                        help="a pre-trained encoder-decoder run and its row name (repeat)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", nargs="+", choices=sorted(EPOCHS), default=sorted(EPOCHS))
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--steps", type=int, help="steps of every fine-tune (default: one SST-2 epoch, three RTE)")
    parser.add_argument("--scratch-twins", action="store_true", help="also fine-tune each run's from-scratch twin")
    parser.add_argument("--data", type=Path, default=Path(default_data()))
    args = parser.parse_args(argv)
    runs = starts(dict(item.split("=", 1) for item in args.run), twins=args.scratch_twins)
    rows_file = args.out / "rows.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done = {(r["run"], r["task"], r["way"]) for r in map(json.loads, rows_file.read_text().splitlines())} \
        if rows_file.exists() else set()
    for name, start in runs.items():
        for task in args.tasks:
            for way in ("text", "head"):
                if (name, task, way) in done:  # a rerun continues where an interrupted one stopped
                    continue
                out = args.out / f"{name}-{task}-{way}"
                if out.exists():
                    parser.error(f"{out} exists without a row: remove it to run it again")
                row = {"run": name, "task": task, "way": way, **finetune(out, start, task, way, args)}
                with open(rows_file, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    (args.out / "results.md").write_text(table(rows), encoding="utf-8")
    print(table(rows))


if __name__ == "__main__":
    main()
