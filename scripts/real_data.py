"""Real-data results for the foundation: pre-train BERT-mini and GPT-mini, fine-tune on airline.

Runs every stage with the public API, skips a stage whose result is already recorded (so an
interrupted run continues where it stopped), and writes the numbers and the commands into
docs/results/foundation.md between the ``foundation`` markers. Budgets are wall time on this machine.

Fine-tuning protocol, the same for the pre-trained model and its from-scratch twin: each picks its
learning rate from ``--lrs`` by dev accuracy at seed 0, then runs ``--seeds`` seeds at that rate;
the table reports the mean and standard deviation over those seeds. (The lr is selected on dev and
the seeds are reported on dev, so both twins get the same, mildly optimistic, treatment.)

    python scripts/real_data.py --data ../shared/data --runs runs/real --minutes 20
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
from pathlib import Path

import torch
from scipy.stats import ttest_ind
from recorded import mean_sd, open_record, replace_block, stage

import sesame
from sesame.data.corpus import iter_texts, resolve_sources
from sesame.runtime import PRECISIONS, Runtime
from sesame.tokenizer import train_tokenizer

FAMILIES = {"bert": "wordpiece", "gpt": "bpe"}
OBJECTIVE = {"bert": "mlm", "gpt": "clm"}  # the foundation's BERT: masked LM alone (NSP came with the encoder family)


def resumable(run: Path) -> bool:
    """Whether an interrupted run left a checkpoint to continue from (a run that left none starts over)."""
    if (run / "checkpoint").is_dir():
        return True
    shutil.rmtree(run, ignore_errors=True)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--runs", default="runs/real")
    parser.add_argument("--minutes", type=float, default=20.0, help="pre-training budget per model")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 2e-4, 5e-4],
                        help="fine-tuning learning rates; each twin keeps the best on dev")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds at the selected learning rate")
    parser.add_argument("--pretrain-lr", type=float, default=5e-4)
    parser.add_argument("--warmup", type=float, default=0.1, help="pre-training warmup, a fraction of the run")
    parser.add_argument("--pretrain-dropout", type=float, default=0.1,
                        help="dropout while pre-training (fine-tuning always uses 0.1)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="pre-training's (fine-tuning: fp32)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the pre-trained model")
    parser.add_argument("--results", default="docs/results/foundation.md")
    args = parser.parse_args()
    data, runs = Path(args.data), Path(args.runs)
    record, results = open_record(runs)
    corpus = [str(data / "wikitext2/train.txt"), str(data / "pretrain/gutenberg")]
    airline = dict(train=str(data / "airline/train.csv"), dev=str(data / "airline/dev.csv"), text_column="text",
                   label_column="airline_sentiment", max_length=64, epochs=args.epochs, batch_size=32)
    for family in args.families:
        kind = FAMILIES[family]
        tok_path = runs / f"{kind}.json"

        def make_tokenizer():
            tok = train_tokenizer(iter_texts(resolve_sources(corpus)), kind, 16000)
            tok.save(tok_path)
            return {"vocab_size": tok.vocab_size}

        stage(results, f"{kind}-tokenizer", record, make_tokenizer)
        pre = runs / f"{family}-mini"
        stage(results, f"{family}-pretrain", record, lambda: sesame.pretrain(
            corpus, str(pre), family=family, size="mini", tokenizer=str(tok_path), seq_len=128, batch_size=32,
            objective=OBJECTIVE[family], lr=args.pretrain_lr, warmup=args.warmup, dropout=args.pretrain_dropout, max_minutes=args.minutes,
            max_steps=100_000, eval_every=500, save_every=500, valid=[str(data / "wikitext2/valid.txt")],
            runtime=Runtime(precision=args.precision, compile=args.compile), progress=False))
        stage(results, f"{family}-test", record, lambda: sesame.evaluate(str(pre), str(data / "wikitext2/test.txt")))
        for twin, base, extra in (("pretrained", str(pre), {}), ("scratch", f"scratch:{family}:mini",
                                                                  {"tokenizer": str(pre)})):
            def tune(lr: float, seed: int) -> dict:
                name = f"{family}-airline-{twin}-lr{lr:g}-seed{seed}"
                return stage(results, name, record, lambda: sesame.finetune(
                    base, out=str(runs / name), progress=False, lr=lr, seed=seed, resume=resumable(runs / name),
                    **airline, **extra))

            best = max(args.lrs, key=lambda lr: tune(lr, 0)["accuracy"])
            results[f"{family}-airline-{twin}"] = {"lr": best, "accuracy": [tune(best, seed)["accuracy"]
                                                                            for seed in range(args.seeds)]}
            record.write_text(json.dumps(results, indent=1) + "\n")
    write_markdown(results, args, Path(args.results))


def write_markdown(results: dict, args: argparse.Namespace, path: Path) -> None:
    cpu = platform.processor() or platform.machine()
    lrs = " ".join(f"{lr:g}" for lr in args.lrs)
    lines = ["## Foundation: pre-training and airline fine-tuning (issue: Foundation)", "",
             f"Machine: {os.cpu_count()} CPU cores, {cpu}; PyTorch {torch.__version__}. Reproduce with:", "",
             "```bash", f"python scripts/real_data.py --data {args.data} --runs {args.runs} --minutes {args.minutes:g} "
             f"--epochs {args.epochs} --lrs {lrs} --seeds {args.seeds} --pretrain-lr {args.pretrain_lr:g} "
             f"--warmup {args.warmup:g} --pretrain-dropout {args.pretrain_dropout:g}"
             + (f" --precision {args.precision}" if args.precision != "fp32" else "")
             + (" --compile" if args.compile else ""), "```", "",
             "Pre-training corpus: WikiText-2 train + the 40 Gutenberg books (34.5 MB); validation: WikiText-2 valid.",
             f"Each model pre-trains for {args.minutes:g} minutes of wall time (the budget covers the whole command),"
             " `mini` size (4 layers × 256), sequences of 128 tokens, batch 32,"
             f" peak lr {args.pretrain_lr:g} after a warmup over {100 * args.warmup:g}% of the run,"
             f" dropout {args.pretrain_dropout:g}; BERT with the"
             " masked LM alone (`objective=\"mlm\"`). Fine-tuning: airline train → dev, text → airline_sentiment"
             f" (3 classes), {args.epochs} epochs, batch 32, max length 64, the best epoch on dev kept. Each twin"
             f" (pre-trained, and from scratch with the same architecture and tokenizer) picks its learning rate"
             f" from {{{lrs}}} by dev accuracy at seed 0, then runs {args.seeds} seeds at that rate: mean ± sd.", "",
             "| family | pre-train steps | valid perplexity | WikiText-2 test perplexity | test bits/byte |"
             " airline dev acc, pre-trained (lr) | airline dev acc, scratch (lr) | gain |",
             "|---|---|---|---|---|---|---|---|"]
    for family in args.families:
        pre, test = results.get(f"{family}-pretrain", {}), results.get(f"{family}-test", {})
        a, b = results.get(f"{family}-airline-pretrained"), results.get(f"{family}-airline-scratch")
        steps = json.loads((Path(args.runs) / f"{family}-mini/checkpoint/trainer_state.json").read_text())["step"] \
            if (Path(args.runs) / f"{family}-mini/checkpoint").exists() else "?"
        cells = []
        for twin in (a, b):
            mean, sd = mean_sd(twin["accuracy"]) if twin else (float("nan"), float("nan"))
            cells.append(f"{100 * mean:.1f} ± {100 * sd:.1f} ({twin['lr']:g})" if twin else "?")
        gain = f"{100 * (mean_sd(a['accuracy'])[0] - mean_sd(b['accuracy'])[0]):+.1f} points" if a and b else "?"
        bpb = f"{test['bits_per_byte']:.3f}" if "bits_per_byte" in test else "n/a (masked LM)"
        lines.append(f"| {family} | {steps} | {pre.get('perplexity', float('nan')):.1f} | "
                     f"{test.get('perplexity', float('nan')):.1f} | {bpb} | {cells[0]} | {cells[1]} | {gain} |")
    lines.append("")
    for family in args.families:
        a, b = results.get(f"{family}-airline-pretrained"), results.get(f"{family}-airline-scratch")
        if a and b:
            (ma, sa), (mb, sb) = mean_sd(a["accuracy"]), mean_sd(b["accuracy"])
            gap, spread = 100 * (ma - mb), 100 * ((sa ** 2 + sb ** 2) / 2) ** 0.5
            verdict = (f"pre-training wins by {gap:.1f} points, more than the seeds' spread ({spread:.1f})"
                       if gap > spread else f"no clear win: the gap ({gap:+.1f} points) is within the seeds' "
                       f"spread (pooled sd {spread:.1f})")
            welch = ttest_ind(a["accuracy"], b["accuracy"], equal_var=False)
            lines.append(f"- {family}: {verdict}; Welch's t = {welch.statistic:.2f}, two-sided p = {welch.pvalue:.3f} "
                         f"({len(a['accuracy'])} and {len(b['accuracy'])} seeds).")
    lines += ["", "Accuracies in %. BERT's perplexities are masked-LM perplexities (exp of the loss at the 15%"
              " selected positions); GPT's are next-token perplexities. They are not comparable with each other,"
              " nor across tokenizers.",
              "", "Raw numbers, every fine-tuning run included: `" + str(Path(args.runs) / "results.json") +
              "` after a run."]
    replace_block(path, "foundation", lines)


if __name__ == "__main__":
    main()
