"""Real-data results for the decoder family: GPT-2 mini pre-trained 20 minutes on the shared corpus.

Sequences of 512 tokens (GPT-2's longer context, room for eight demonstrations in a prompt).
Stages, each recorded as it finishes so an interrupted run continues where it stopped: the
tokenizer and the pre-training; WikiText-2 test perplexity, bits per byte and per character;
generated samples (greedy with a repetition penalty, nucleus sampling, a TL;DR: prompt); airline
fine-tuning with and without GPT's auxiliary LM loss (λ = 0.5), several seeds each; and prompt-eval
accuracy on airline dev against the number of demonstrations k. Writes docs/results/decoders.md between the
``decoder`` markers.

    python scripts/gpt2_real.py --data ../shared/data --runs runs/gpt2
"""
from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import torch
from recorded import mean_sd, open_record, replace_block, stage

import sesame
from sesame.data.corpus import iter_texts, resolve_sources
from sesame.apps.generate import TLDR, tldr
from sesame.decoding import GenerationConfig
from sesame.tokenizer import train_tokenizer

PROMPTS = ["The history of the city", "In 1998 , the band", "She was born in"]
SAMPLERS = {"greedy, repetition penalty 1.2": GenerationConfig(max_new_tokens=40, repetition_penalty=1.2),
            "nucleus sampling, top-p 0.9": GenerationConfig(max_new_tokens=40, sample=True, top_p=0.9, seed=0)}


def first_paragraph(path: Path, words: int = 120) -> str:
    """The first WikiText-2 test paragraph with at least ``words`` words (an article for TL;DR:)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if len(line.split()) >= words and not line.strip().startswith("="):
            return line.strip()
    raise ValueError(f"{path}: no paragraph of {words} words")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--runs", default="runs/gpt2")
    parser.add_argument("--minutes", type=float, default=20.0, help="pre-training budget (wall time)")
    parser.add_argument("--steps", type=int, default=None,
                        help="pre-training budget in steps instead of minutes: a rerun whose model does not depend on "
                             "the machine's load (the 2026-11-22 run's 20 minutes were 1,307 steps)")
    parser.add_argument("--lr", type=float, default=2e-4, help="fine-tuning learning rate (the foundation's gpt pick)")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per setting")
    parser.add_argument("--draws", type=int, default=5, help="prompt-eval demonstration draws per k")
    parser.add_argument("--results", default="docs/results/decoders.md")
    args = parser.parse_args()
    data, runs = Path(args.data), Path(args.runs)
    record, results = open_record(runs)
    corpus = [str(data / "wikitext2/train.txt"), str(data / "pretrain/gutenberg")]
    tok_path = runs / "bpe.json"
    airline = {"train": str(data / "airline/train.csv"), "dev": str(data / "airline/dev.csv"), "text_column": "text",
               "label_column": "airline_sentiment"}

    def make_tokenizer() -> dict:
        tok = train_tokenizer(iter_texts(resolve_sources(corpus)), "bpe", 16000)
        tok.save(tok_path)
        return {"vocab_size": tok.vocab_size}

    stage(results, "tokenizer", record, make_tokenizer)
    pre = str(runs / "gpt2-mini")
    stage(results, "pretrain", record, lambda: sesame.pretrain(
        corpus, pre, family="gpt2", size="mini", tokenizer=str(tok_path), seq_len=512, batch_size=8,
        lr=1e-3, warmup=0.1, dropout=0.0, max_minutes=None if args.steps else args.minutes,
        max_steps=args.steps or 100_000, eval_every=500,
        save_every=500, valid=[str(data / "wikitext2/valid.txt")], progress=False))
    stage(results, "test", record, lambda: sesame.evaluate(pre, str(data / "wikitext2/test.txt")))
    stage(results, "samples", record, lambda: {
        name: [r["text"] for r in sesame.generate(pre, PROMPTS, cfg)] for name, cfg in SAMPLERS.items()})
    article = first_paragraph(data / "wikitext2/test.txt")
    stage(results, "tldr", record, lambda: {"article": article, "summary": tldr(sesame.generate(
        pre, [article + TLDR], GenerationConfig(max_new_tokens=100, sample=True, top_k=2))[0]["text"])})
    for weight in (0.0, 0.5):
        for seed in range(args.seeds):
            name = f"airline-lm{weight:g}-seed{seed}"
            stage(results, name, record, lambda: sesame.finetune(
                pre, out=str(runs / name), lm_weight=weight, lr=args.lr, seed=seed, epochs=3, batch_size=32,
                max_length=64, progress=False, **airline))
    for scoring in ("mean", "calibrated"):
        stage(results, f"prompt-eval-{scoring}", record, lambda: sesame.prompt_eval(
            pre, airline["dev"], train=airline["train"], text_column="text", label_column="airline_sentiment",
            ks=(0, 1, 4, 8), draws=args.draws, scoring=scoring, progress=False))
    write_markdown(results, args, Path(args.results))


def write_markdown(results: dict, args: argparse.Namespace, path: Path) -> None:
    test, pre = results["test"], results["pretrain"]
    budget_flag = f"--steps {args.steps}" if args.steps else f"--minutes {args.minutes:g}"
    budget = f"{args.steps:,} steps" if args.steps else f"{args.minutes:g} minutes of wall time"
    lines = ["## Decoder: GPT-2 mini, generation and prompting (issue: Decoder family and generation)", "",
             f"Machine: {os.cpu_count()} CPU cores, {platform.machine()}; PyTorch {torch.__version__}. Reproduce with:",
             "", "```bash", f"python scripts/gpt2_real.py --data {args.data} --runs {args.runs} {budget_flag}"
             f" --lr {args.lr:g} --seeds {args.seeds} --draws {args.draws}", "```", "",
             f"GPT-2 `mini` (4 layers × 256, pre-LayerNorm) pre-trained for {budget} on "
             "WikiText-2 train + the 40 Gutenberg books with a 16,000-token byte-level BPE, sequences of 512 tokens, "
             f"batch 8, peak lr 0.001 after 10% warmup, dropout 0: {pre['tokens']:,} validation tokens scored at the end.",
             "", "| WikiText-2 | perplexity | bits per byte | bits per character |", "|---|---|---|---|",
             f"| valid (end of pre-training) | {pre['perplexity']:.1f} | {pre.get('bits_per_byte', float('nan')):.3f} | "
             f"{pre.get('bits_per_char', float('nan')):.3f} |",
             f"| test (`sesame evaluate`) | {test['perplexity']:.1f} | {test['bits_per_byte']:.3f} | "
             f"{test['bits_per_char']:.3f} |", "",
             "Samples (`sesame generate`, 40 new tokens; the prompts in WikiText's tokenised style):", ""]
    for name in SAMPLERS:
        for prompt, text in zip(PROMPTS, results["samples"][name]):
            lines.append(f"- {name}: **{prompt}**{text.replace(chr(10), ' ')}")
    lines += ["", f"TL;DR: (top-k 2 sampling, 100 new tokens, the first three sentences kept) after the first long "
              f"WikiText-2 test paragraph, which begins \"{results['tldr']['article'][:80]}...\": "
              f"\"{results['tldr']['summary']}\"", "",
              f"Airline fine-tuning (train → dev, 3 epochs, batch 32, lr {args.lr:g}, max length 64, last-token "
              f"pooling, best epoch kept), {args.seeds} seeds each:", "",
              "| auxiliary LM loss | dev accuracy (mean ± sd) | per seed |", "|---|---|---|"]
    for weight in (0.0, 0.5):
        accs = [results[f"airline-lm{weight:g}-seed{s}"]["accuracy"] for s in range(args.seeds)]
        mean, sd = mean_sd(accs)
        label = "none" if weight == 0 else f"λ = {weight:g} (`--lm-weight {weight:g}`)"
        lines.append(f"| {label} | {100 * mean:.1f} ± {100 * sd:.1f} | {', '.join(f'{100 * a:.1f}' for a in accs)} |")
    for scoring in ("mean", "calibrated"):
        report = results[f"prompt-eval-{scoring}"]
        lines += ["", f"`sesame prompt-eval --scoring {scoring}` on airline dev ({report['n']} tweets; demonstrations "
                  f"from train; {args.draws} draws per k > 0; majority class {report['majority']['label']}: "
                  f"{100 * report['majority']['accuracy']:.1f}%):", "",
                  "| k | accuracy (mean ± sd over draws) | min-max | predicted share negative / neutral / positive |",
                  "|---|---|---|---|"]
        for r in report["results"]:
            shares = " / ".join(f"{r['predicted'].get(label, 0):.2f}" for label in ("negative", "neutral", "positive"))
            lines.append(f"| {r['k']} | {100 * r['mean']:.1f} ± {100 * r['sd']:.1f} | {100 * r['min']:.1f}-"
                         f"{100 * r['max']:.1f} | {shares} |")
    replace_block(path, "decoder", lines)


if __name__ == "__main__":
    main()
