"""Multi30k English→German at equal fine-tuning time: ``t5`` and ``bart`` fine-tuned from pre-trained runs, their
from-scratch twins, and CoVe's MT-LSTM (McCann et al. 2017), scored by BLEU on held-out ``val`` sentences.

Every approach gets the same wall-time budget (``--max-minutes`` of its one command, tokenizer training of a
scratch twin included). The first ``--dev-lines`` (200) lines of ``val`` pick each run's kept weights (dev BLEU
after every epoch; every ``--eval-every`` steps for the MT-LSTM); BLEU is reported on the other lines, which
no run has seen. Two BLEUs: case-insensitive with 13a tokenisation (the MT-LSTM writes lower-cased words, so
this is the one that compares all rows) and T5's cased ``intl`` BLEU (``sesame.metrics.bleu``). Each row is
appended to ``OUT/rows.jsonl`` when its run ends, so approaches can run in separate calls (``--only``) and
``OUT/results.md`` always tables every row so far, with a few example translations.

    python scripts/multi30k_bleu.py --t5 runs/compare-20min/pretrain/t5-mini \\
        --bart runs/compare-20min/pretrain/bart-mini --minutes 1.5 --out runs/multi30k
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from sesame.metrics import bleu

PREFIX = "prefix=translate English to German:"
APPROACHES = ("t5", "t5-scratch", "bart", "bart-scratch", "mt-lstm")
EXAMPLES = 3  # held-out sentences shown with every row's translation


def split_val(data: Path, out: Path, dev_lines: int) -> dict[str, Path]:
    """``val.{en,de}`` cut into ``dev`` (its first ``dev_lines``) and ``held`` (the rest), in ``out/data``."""
    folder = out / "data"
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = (data / "multi30k" / f"val.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / f"dev.{lang}").write_text("".join(lines[:dev_lines]), encoding="utf-8")
        (folder / f"held.{lang}").write_text("".join(lines[dev_lines:]), encoding="utf-8")
    return {"dev": folder / "dev", "held": folder / "held"}


def sesame(*args: str, quiet: bool = False) -> None:
    """Run one ``sesame`` command in a child process (the package this script is run with); ``quiet``: without its
    standard output (predictions, which the command also writes to a file)."""
    print("$ sesame", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "sesame", *args], check=True, stdout=subprocess.DEVNULL if quiet else None)


def text2text(name: str, start: str, args: argparse.Namespace, files: dict[str, Path]) -> list[str]:
    """Fine-tune ``start`` (a run, or ``scratch:FAMILY:SIZE``) on the training pairs; its held-out outputs."""
    run = args.out / name
    sesame("finetune", "--from", start, "--task", "text2text", "--train", str(args.data / "multi30k" / "train.en"),
           "--dev", f"{files['dev']}.en", "--task-option", "languages=en-de", "--task-option", PREFIX,
           "--task-option", f"max_target_length={args.max_length}", "--max-length", str(args.max_length),
           "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--max-minutes", str(args.minutes),
           "--select", "bleu", "--out", str(run), *args.runtime)
    predictions = run / "held.predicted.jsonl"
    sesame("predict", "--model", str(run), "--input", f"{files['held']}.en", "--output", str(predictions),
           *args.runtime, quiet=True)
    return [json.loads(line)["output"] for line in predictions.read_text(encoding="utf-8").splitlines()]


def mt_lstm(name: str, args: argparse.Namespace, files: dict[str, Path]) -> list[str]:
    """CoVe's MT-LSTM (``tiny``, as docs/cove.md's row) trained on the same pairs; its held-out translations."""
    run = args.out / name
    sesame("cove", "--train-src", str(args.data / "multi30k" / "train.en"),
           "--train-tgt", str(args.data / "multi30k" / "train.de"), "--valid-src", f"{files['dev']}.en",
           "--valid-tgt", f"{files['dev']}.de", "--out", str(run), "--size", "tiny", "--vocab-size", "5000",
           "--batch-size", "32", "--lr", "3e-3", "--max-minutes", str(args.minutes), "--eval-every", "500",
           "--save-every", "500", "--bleu-sentences", str(args.dev_lines), *args.runtime)
    hypotheses = run / "held.hyp.de"
    sesame("translate", "--model", str(run), "--input", f"{files['held']}.en", "--output", str(hypotheses),
           *args.runtime, quiet=True)
    return hypotheses.read_text(encoding="utf-8").splitlines()


def steps_of(run: Path) -> int:
    """The last training step a run's metrics.jsonl records."""
    steps = [json.loads(line).get("step", 0) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return max(steps, default=0)


def run_approach(name: str, args: argparse.Namespace, files: dict[str, Path]) -> dict:
    starts = {"t5": args.t5, "bart": args.bart, "t5-scratch": f"scratch:t5:{args.size}",
              "bart-scratch": f"scratch:bart:{args.size}"}
    outputs = mt_lstm(name, args, files) if name == "mt-lstm" else text2text(name, str(starts[name]), args, files)
    references = Path(f"{files['held']}.de").read_text(encoding="utf-8").splitlines()
    if len(outputs) != len(references):
        raise SystemExit(f"{name}: {len(outputs)} outputs for {len(references)} held-out references")
    return {"approach": name, "start": str(starts.get(name, "scratch (MT-LSTM tiny)")), "minutes": args.minutes,
            "steps": steps_of(args.out / name), "held_out": len(references),
            "bleu_13a_uncased": round(bleu(outputs, references), 2),
            "bleu_intl_cased": round(bleu(outputs, references, lowercase=False, tokenize="intl"), 2),
            "examples": outputs[:EXAMPLES]}


def table(out: Path, files: dict[str, Path]) -> str:
    """Markdown of every row in ``out/rows.jsonl``, then the first held-out sentences and each row's output."""
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    lines = ["| approach | start | fine-tuning | steps | BLEU (13a, uncased) | BLEU (intl, cased) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['approach']} | {r['start']} | {r['minutes']} min | {r['steps']:,} | {r['bleu_13a_uncased']:.2f} "
              f"| {r['bleu_intl_cased']:.2f} |" for r in rows]
    sources = Path(f"{files['held']}.en").read_text(encoding="utf-8").splitlines()
    references = Path(f"{files['held']}.de").read_text(encoding="utf-8").splitlines()
    for i in range(EXAMPLES):
        lines += ["", f"- {sources[i]} → reference: {references[i]}"]
        lines += [f"  - {r['approach']}: {r['examples'][i]}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--t5", type=Path, help="pre-trained t5 run (for the t5 row)")
    parser.add_argument("--bart", type=Path, help="pre-trained bart run (for the bart row)")
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs and results")
    parser.add_argument("--only", nargs="+", choices=APPROACHES, default=list(APPROACHES), help="approaches run")
    parser.add_argument("--minutes", type=float, default=14.0, help="fine-tuning minutes of every approach")
    parser.add_argument("--size", default="mini", help="size of the scratch twins (that of the runs)")
    parser.add_argument("--lr", type=float, default=5e-4, help="peak learning rate of the t5/bart runs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=64, help="source and target tokens")
    parser.add_argument("--dev-lines", type=int, default=200, help="first val lines that select the kept weights")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("SESAME_DATA", "../shared/data")))
    parser.add_argument("--device", help="passed to every command (default: sesame's auto)")
    parser.add_argument("--tf32", action="store_true", help="passed to every command (NVIDIA Ampere or later)")
    args = parser.parse_args(argv)
    for name in ("t5", "bart"):
        if name in args.only and getattr(args, name) is None:
            parser.error(f"--only {name} needs --{name} RUN (a pre-trained run), or leave {name} out of --only")
    args.runtime = (["--device", args.device] if args.device else []) + (["--tf32"] if args.tf32 else [])
    files = split_val(args.data, args.out, args.dev_lines)
    for name in args.only:
        if (args.out / name).exists():
            parser.error(f"{args.out / name} exists: give another --out or leave {name} out of --only")
        row = run_approach(name, args, files)
        with open(args.out / "rows.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        (args.out / "results.md").write_text(table(args.out, files), encoding="utf-8")
        print(json.dumps(row), flush=True)
    print((args.out / "results.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
