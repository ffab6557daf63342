"""Distillation against fine-tuning on the same labels: issue 21's SST-2 few-label and airline tables.

The training file's first ``--labeled`` examples keep their labels; the rest, with only the text column kept, are
the unlabeled transfer set (``--labeled`` left out: every example is labeled and the transfer set is the training
text itself). A teacher (``--teacher``, MiniLM by default) is fine-tuned on the labeled examples. Each student
(``--student NAME=RUN``, and with ``--scratch-twins`` the run's family and size from random weights reading the run's
tokenizer) is then trained two ways from the same start, at the same learning rate and length:

- ``finetune``: ``sesame finetune`` on the labeled examples alone (Turc et al. 2019's baseline);
- ``distil``: ``sesame distil`` on the transfer set, T²·KL at T = 2 (Hinton et al. 2015), no gold labels; every
  distil cell after the first reuses its teacher outputs (``--teacher-outputs``), so the teacher scores the set once.

Both keep their best epoch on ``--dev`` (which they are scored on: an upper bound on a held-out score). Reported for
the teacher and every student: dev accuracy of the kept weights (``sesame.evaluate``), parameters, and batch-1
latency: the median wall time of ``sesame.load(run).predict([text])`` over the first ``--latency-texts`` dev texts
(after 10 untimed ones), every model timed in one process after all the training, with ``--threads`` threads.
Rows are appended to ``OUT/rows.jsonl`` as cells finish (a rerun continues); ``OUT/results.md`` tables them.

    python scripts/distil_table.py --task sst2 --labeled 2000 --student tiny=runs/bert-tiny \\
        --student mini=runs/compare-20min/pretrain/bert-mini --scratch-twins --out runs/distil-sst2
    python scripts/distil_table.py --task airline --student mini=runs/compare-20min/pretrain/bert-mini \\
        --out runs/distil-airline
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import sesame
from sesame.apps.compare.tasks import SHORTCUTS, default_data
from sesame.pipelines import Predictor

sys.path.insert(0, str(Path(__file__).parent))
from text_vs_head import starts  # noqa: E402


def dialect(path: Path) -> dict:
    """How sesame reads ``path`` (sesame.data.labeled): quoted CSV, or TSV without quoting."""
    if path.suffix == ".csv":
        return {"delimiter": ","}
    return {"delimiter": "\t", "quoting": csv.QUOTE_NONE, "quotechar": None}


def split(train: Path, text_column: str, labeled: int | None, folder: Path) -> tuple[Path, Path]:
    """The labeled file (the first ``labeled`` examples) and the transfer set (the rest, text column only)."""
    if labeled is None:
        return train, train
    with open(train, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, **dialect(train)))
    header, body = rows[0], rows[1:]
    if not 0 < labeled < len(body):
        sys.exit(f"--labeled {labeled}: {train} has {len(body)} examples; give a number between 1 and {len(body) - 1}")
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / f"labeled{train.suffix}", folder / f"unlabeled{train.suffix}"
    column = header.index(text_column)
    for path, part in zip(paths, ([header, *body[:labeled]], [[text_column], *[[r[column]] for r in body[labeled:]]])):
        with open(path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n", **dialect(train)).writerows(part)
    return paths


def run(command: list[str]) -> float:
    """Run ``sesame COMMAND`` and return its minutes."""
    print("$ sesame", " ".join(command), flush=True)
    started = time.time()
    subprocess.run([sys.executable, "-m", "sesame", *command], check=True)
    return round((time.time() - started) / 60, 1)


def scoring_once(command: list[str], rows: list[dict]) -> list[str]:
    """A cell's command; a distil cell's with ``--teacher-outputs`` the first finished distil cell's run, when there
    is one (every distil cell has the same teacher and transfer set)."""
    earlier = next((row["model"] for row in rows if row["way"] == "distil"), None)
    return [*command, "--teacher-outputs", earlier] if command[0] == "distil" and earlier else command


def latency_ms(predictor: Predictor, texts: list[str]) -> float:
    """The median milliseconds of one text's prediction, after 10 untimed ones."""
    for text in texts[:10]:
        predictor.predict([text])
    seconds = []
    for text in texts:
        start = time.perf_counter()
        predictor.predict([text])
        seconds.append(time.perf_counter() - start)
    return round(1000 * statistics.median(seconds), 2)


def table(rows: list[dict]) -> str:
    lines = ["| model | start | trained by | on | dev accuracy | parameters | batch-1 latency (ms) | vs teacher "
             "| minutes |", "|---|---|---|---|---|---|---|---|---|"]
    teacher = next(r for r in rows if r["way"] == "teacher")
    for r in rows:
        lines.append(f"| {r['name']} | {r['start']} | {r['way']} | {r['on']} | {r['accuracy']:.4f} "
                     f"| {r['parameters'] / 1e6:.1f}M | {r['latency_ms']} "
                     f"| {r['latency_ms'] / teacher['latency_ms']:.2f}× | {r['minutes']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("sst2", "airline"), required=True)
    parser.add_argument("--labeled", type=int, help="labeled training examples (default: all)")
    parser.add_argument("--teacher", default="minilm", help="the teacher's start (default minilm)")
    parser.add_argument("--teacher-epochs", type=int, default=3)
    parser.add_argument("--student", action="append", required=True, metavar="NAME=RUN",
                        help="a pre-trained student run and its row name (repeat)")
    parser.add_argument("--scratch-twins", action="store_true", help="also each student's from-scratch twin")
    parser.add_argument("--finetune-epochs", type=int, default=10, help="epochs over the labeled examples")
    parser.add_argument("--distil-epochs", type=int, default=2, help="epochs over the transfer set")
    parser.add_argument("--lr", type=float, default=2e-4, help="the students' learning rate, both ways")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--latency-texts", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--data", type=Path, default=Path(default_data()))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    files = SHORTCUTS[args.task]
    train, dev = args.data / files["train"], args.data / files["dev"]
    columns = ["--text-column", files["text_column"], "--label-column", files["label_column"]]
    labeled, unlabeled = split(train, files["text_column"], args.labeled, args.out / "data")
    on_labels = f"{args.labeled or 'all'} labels"
    on_transfer = f"{'the rest' if args.labeled else 'the training text'}, unlabeled"
    common = ["--dev", str(dev), *columns, "--max-length", str(args.max_length)]

    rows_file = args.out / "rows.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    done = {(r["name"], r["way"]) for r in rows}
    teacher = args.out / "teacher"
    cells = [("teacher", args.teacher, "teacher", on_labels, teacher,
              ["finetune", "--from", args.teacher, "--train", str(labeled), *common,
               "--epochs", str(args.teacher_epochs), "--out", str(teacher)])]
    for name, start in starts(dict(item.split("=", 1) for item in args.student), twins=args.scratch_twins).items():
        student = ["--lr", str(args.lr)]
        cells += [(name, start[0], "finetune", on_labels, args.out / f"{name}-finetune",
                   ["finetune", "--from", *start, "--train", str(labeled), *common, *student,
                    "--epochs", str(args.finetune_epochs), "--out", str(args.out / f"{name}-finetune")]),
                  (name, start[0], "distil", on_transfer, args.out / f"{name}-distil",
                   ["distil", "--teacher", str(teacher), "--student", *start, "--unlabeled", str(unlabeled),
                    *common, *student, "--epochs", str(args.distil_epochs), "--out", str(args.out / f"{name}-distil")])]
    for name, start, way, on, out, command in cells:
        if (name, way) in done:
            continue
        if out.exists():
            parser.error(f"{out} exists without a row: remove it to run it again")
        row = {"name": name, "start": start, "way": way, "on": on, "minutes": run(scoring_once(command, rows)),
               "model": str(out)}
        row["accuracy"] = sesame.evaluate(str(out), str(dev))["accuracy"]
        rows.append(row)
        with open(rows_file, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    torch.set_num_threads(args.threads)
    with open(dev, newline="", encoding="utf-8") as f:
        texts = [r[files["text_column"]] for r in csv.DictReader(f, **dialect(dev))][: args.latency_texts]
    for row in rows:
        predictor = sesame.load(row["model"])
        row["parameters"] = sum(p.numel() for p in predictor.model.parameters())
        row["latency_ms"] = latency_ms(predictor, texts)
    (args.out / "results.md").write_text(table(rows), encoding="utf-8")
    print(table(rows))


if __name__ == "__main__":
    main()
