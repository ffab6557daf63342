"""The ``sesame`` command: one subcommand per stage; each parses flags, calls the library, prints."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

from . import compare
from .errors import SesameError
from .families import FAMILIES, SIZES
from .tasks import TASKS
from .tokenizer import KINDS
from .train import Interrupted, TrainConfig
from .train.trainer import PRECISIONS, SCHEDULES

TRAIN_HELP = {
    "lr": "peak learning rate", "weight_decay": "AdamW weight decay (not on biases and norms)",
    "warmup": "fraction of the run spent warming up", "batch_size": "sequences per optimizer step (global)",
    "accumulate": "micro-batches per step", "clip": "max gradient norm (0 = off)",
    "max_steps": "step budget", "max_minutes": "wall-time budget for the whole command",
    "eval_every": "validate every N steps", "save_every": "checkpoint every N steps", "seed": "random seed",
    "schedule": "learning-rate schedule: linear (warmup, then down to 0; BERT) or stlr (slanted triangular, "
                "ULMFiT: --warmup is its cut_frac)",
    "stlr_ratio": "stlr: peak / lowest learning rate (32 in ULMFiT)",
    "cycles": "run the schedule N times over equal parts of the run (e.g. one per epoch of gradual unfreezing)",
    "precision": "fp32, or bf16: forward passes in bfloat16 autocast (fast on CPUs with AMX or AVX512-BF16); "
                 "weights and optimizer stay fp32",
}
TRAIN_CHOICES = {"schedule": SCHEDULES, "precision": PRECISIONS}


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training (defaults: sesame.train.TrainConfig)")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "str":
            g.add_argument(flag, choices=TRAIN_CHOICES[f.name], default=None, help=TRAIN_HELP[f.name])
            continue
        kind = int if f.type in ("int", "int | None") else float
        g.add_argument(flag, type=kind, default=None, help=TRAIN_HELP[f.name])
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")


def _train_options(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}


def _key_values(items: list[str], flag: str, example: str) -> dict:
    """Repeated ``flag KEY=VALUE`` options as a dict (VALUE read as JSON when it parses)."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SesameError(f"{flag} {item!r}: write KEY=VALUE, e.g. {example}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _objective_options(args: argparse.Namespace) -> dict:
    """--masking, --phrases and --objective-option KEY=VALUE."""
    options = _key_values(args.objective_option, "--objective-option", "disc_weight=50")
    if args.masking:
        options["masking"] = args.masking
    if args.phrases:
        path = Path(args.phrases)
        if not path.is_file():
            raise SesameError(f"--phrases {path}: no such file; give a text file with one phrase per line")
        options["phrases"] = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sesame", description="Transfer learning for NLP.")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    sub = parser.add_subparsers(dest="command", required=True)

    tok = sub.add_parser("tokenizer", help="train a subword tokenizer").add_subparsers(dest="action", required=True)
    t = tok.add_parser("train", help="train WordPiece, byte-level BPE or Unigram on text files")
    t.add_argument("--corpus", nargs="+", required=True, help="text files, folders or .jsonl files")
    t.add_argument("--kind", choices=KINDS, default="wordpiece")
    t.add_argument("--vocab-size", type=int, default=16000)
    t.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                   help="lower-case text (default: on for wordpiece, off otherwise)")
    t.add_argument("--text-field", default="text", help="the text field of .jsonl records")
    t.add_argument("--out", required=True, help="where to write tokenizer.json")

    vec = sub.add_parser("vectors", help="static word vectors: train GloVe, or look up neighbours in a GloVe/word2vec "
                                         "text file (docs/wordvectors.md)").add_subparsers(dest="action", required=True)
    v = vec.add_parser("train", help="GloVe (Pennington et al. 2014) on text files, folders or .jsonl")
    v.add_argument("--corpus", nargs="+", required=True)
    v.add_argument("--out", required=True, help="the vectors, in GloVe text format")
    v.add_argument("--dim", type=int, default=100)
    v.add_argument("--window", type=int, default=10, help="co-occurrence window (words each side; weight 1/d)")
    v.add_argument("--epochs", type=int, default=15)
    v.add_argument("--min-count", type=int, default=1)
    v.add_argument("--max-size", type=int, help="keep the most frequent words only")
    v.add_argument("--lower", action="store_true", help="lower-case the text")
    v.add_argument("--lr", type=float, default=0.05, help="AdaGrad's learning rate")
    v.add_argument("--x-max", type=float, default=100.0, help="f(x) = (x/x_max)^alpha, capped at 1")
    v.add_argument("--alpha", type=float, default=0.75)
    v.add_argument("--batch-size", type=int, default=4096, help="co-occurrence pairs per AdaGrad step")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--text-field", default="text")
    v = vec.add_parser("neighbors", help="a word's nearest neighbours by cosine in a vectors file")
    v.add_argument("--vectors", required=True, help="a GloVe or word2vec text file")
    v.add_argument("--word", required=True)
    v.add_argument("--k", type=int, default=10)

    p = sub.add_parser("prepare", help="tokenize a corpus into memory-mapped shards")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, or a run directory holding one")
    p.add_argument("--text-field", default="text")
    p.add_argument("--out", required=True, help="shard directory")

    p = sub.add_parser("pretrain", help="pre-train a language model")
    p.add_argument("--family", choices=FAMILIES, default="bert")
    p.add_argument("--size", choices=SIZES, default="mini")
    p.add_argument("--corpus", nargs="+", required=True, help="text files, folders, .jsonl, or one shard directory")
    p.add_argument("--valid", nargs="+", help="validation text (default: the corpus's last 1%%)")
    p.add_argument("--tokenizer", help="tokenizer.json to use (default: train one on the corpus)")
    p.add_argument("--vocab-size", type=int, default=16000, help="size of the tokenizer trained on the way")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--dropout", type=float, help="dropout rate (default: the family's, 0.1 for most)")
    p.add_argument("--attention-window", type=int, metavar="W",
                   help="GPT-3's locally banded attention: every second layer sees only the W nearest positions")
    p.add_argument("--text-field", default="text")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    o = p.add_argument_group("objective (defaults: the family's row in sesame.families)")
    o.add_argument("--objective", help="override the family's objective, e.g. mlm for BERT without NSP")
    o.add_argument("--masking", choices=["token", "whole_word", "phrase"],
                   help="masked-LM units: tokens, whole words, or phrases (--phrases, else n-grams of words)")
    o.add_argument("--phrases", help="text file, one phrase or entity per line, for --masking phrase")
    o.add_argument("--objective-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other objective option, e.g. generator_fraction=0.25 or disc_weight=50 (repeatable)")
    o.add_argument("--static-masks", type=int, default=0,
                   help="k fixed masks per sequence, as original BERT (default 0: fresh masks every time)")
    o.add_argument("--final-seq-len", type=int,
                   help="BERT's second phase: sequences this long for the last 10%% of the budget")
    _add_train_flags(p)

    p = sub.add_parser("finetune", help="fine-tune a run (or a scratch model) on a labeled task")
    p.add_argument("--from", dest="base", required=True,
                   help="run directory, transformers model directory, minilm (the installed all-MiniLM-L6-v2), "
                        "or scratch:FAMILY:SIZE")
    p.add_argument("--task", default="classify", choices=list(TASKS),
                   help="classify: text → label; pair: two texts → label; regress: text(s) → number; "
                        "tag: a label per word (CoNLL columns); span_qa: extractive QA (SQuAD JSON); "
                        "multiple_choice: context + candidates → the right one (JSONL)")
    p.add_argument("--train", required=True, help="CSV, TSV or JSONL; CoNLL columns for tag; SQuAD JSON for span_qa")
    p.add_argument("--dev", required=True)
    p.add_argument("--text-column", help="default: text (classify, regress), sentence1 (pair); numbers pick "
                                         "columns of a file without a header row")
    p.add_argument("--label-column", help="default: label")
    p.add_argument("--pair-column", help="the second text of a pair (default for --task pair: sentence2)")
    p.add_argument("--symmetric", action="store_true",
                   help="pairs without an order (similarity): score both orders and add them (GPT)")
    p.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other option of the task, e.g. doc_stride=128 (repeatable)")
    p.add_argument("--select", help="dev metric that picks the kept epoch (default: the task's: accuracy; "
                                    "pearson for regress; f1 for tag and span_qa; also macro_f1, mcc, spearman, "
                                    "exact)")
    p.add_argument("--tokenizer", help="for scratch models: tokenizer.json or a run (default: train one)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--discriminative", type=float, default=1.0, metavar="FACTOR",
                   help="ULMFiT's discriminative rates: each layer's lr is the next one up's / FACTOR (2.6 in the "
                        "paper; the head gets --lr); default 1: one rate for all")
    p.add_argument("--gradual-unfreezing", action="store_true",
                   help="ULMFiT: train only the head in epoch 1, then unfreeze one more layer group per epoch")
    p.add_argument("--adapters", type=int, metavar="M",
                   help="train only bottleneck adapters of width M (e.g. 64), LayerNorms and the head (Houlsby)")
    p.add_argument("--features", action="store_true",
                   help="freeze the backbone; train a scalar mix of its layers and the head (ELMo)")
    p.add_argument("--lm-weight", type=float, default=0.0, metavar="LAMBDA",
                   help="add GPT's auxiliary LM loss on the task's inputs, weighted LAMBDA (0.5 in GPT); "
                        "causal backbones")
    p.add_argument("--pooling", choices=["cls", "last", "mean"],
                   help="what the head reads: the first token through a tanh pooler, the last real token, or the "
                        "mean over real tokens (default: the family's: cls for encoders, last for decoders)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", action="store_true")
    _add_train_flags(p)

    p = sub.add_parser("evaluate", help="metrics of a run on labeled data or text")
    p.add_argument("--model", required=True, help="run directory, or a transformers directory: a sequence classifier, "
                                                  "or a model with its pre-training head (*ForMaskedLM, ...)")
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--text-column")
    p.add_argument("--label-column")
    p.add_argument("--seq-len", type=int, help="language models: window length (default: the run's)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("predict", help="predictions (a classifier: label and class probabilities), one JSON "
                                       "line per input")
    p.add_argument("--model", required=True, help="fine-tuned run, or a transformers sequence classifier directory")
    p.add_argument("--input", help="CSV/TSV/JSONL file (default: one text per line on stdin)")
    p.add_argument("--text-column")
    p.add_argument("--pair-column")
    p.add_argument("--output", help="also write the predictions in the task's own format (CoNLL columns for tag, "
                                    "SQuAD's {id: answer} JSON for span_qa, JSON lines otherwise)")

    p = sub.add_parser("convert", help="a Hugging Face checkpoint → a pretrained run, or a run → a Hugging Face "
                                       "checkpoint (docs/interop.md)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--from-hf", metavar="DIR", help="a transformers model directory (config.json, model.safetensors "
                                                    "or pytorch_model.bin, tokenizer files) to import")
    g.add_argument("--to-hf", metavar="RUN", help="a pretrained run, or a fine-tuned classify/pair/regress run, to "
                                                  "export for transformers")
    p.add_argument("--generator", metavar="DIR", help="with --from-hf of an ElectraForPreTraining discriminator: "
                                                      "its ElectraForMaskedLM generator; both become one electra run")
    p.add_argument("--out", required=True, help="the new run (--from-hf) or model directory (--to-hf; an electra "
                                                "run's generator goes to its generator/ subdirectory)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")

    p = sub.add_parser("neighbors", help="a word's nearest neighbours: per occurrence by contextual vector, and "
                                         "once by static input embedding (docs/neighbors.md)")
    p.add_argument("--model", required=True, help="a pretrained or fine-tuned run, a transformers model directory, "
                                                  "or minilm (the installed all-MiniLM-L6-v2)")
    p.add_argument("--word", required=True, help="the word to look up (whole word, any case)")
    p.add_argument("--corpus", required=True, help="a text file, one sentence per line")
    p.add_argument("--forms", default="", help="other forms to count as the word, comma-separated, e.g. plays,played")
    p.add_argument("--k", type=int, default=3, help="neighbours per list")
    p.add_argument("--layer", type=int, help="hidden layer of the contextual vectors: 0 = embeddings (default: last)")
    p.add_argument("--clusters", type=int, default=2, help="group the occurrences into N by k-means (0 = off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the k-means restarts")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("decontaminate", help="n-gram overlap between a pre-training corpus and evaluation sets, "
                                             "GPT-3 style (docs/decontamination.md)")
    p.add_argument("--corpus", nargs="+", required=True, help="text files, folders or .jsonl files")
    p.add_argument("--eval", action="append", required=True, help="an evaluation set (repeat the flag): "
                                                                  "see docs/decontamination.md")
    p.add_argument("--n", type=int, default=13, help="n-gram length in normalised words")
    p.add_argument("--out-corpus", metavar="DIR", help="write the corpus without the overlapping documents to this "
                                                       "new folder")
    p.add_argument("--text-field", default="text", help="the text field of .jsonl records")
    p.add_argument("--show", type=int, default=3, help="overlapping examples shown per set")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("generate", help="continue prompts with a causal language model: greedy, sampling, beam "
                                        "search (docs/decoders.md)")
    p.add_argument("--model", required=True, help="a pretrained gpt/gpt2 run, or a transformers directory with a "
                                                  "causal LM head (GPT2LMHeadModel)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", action="append", help="a prompt (repeat the flag for several)")
    g.add_argument("--prompts", metavar="FILE", help="a text file with one prompt per line ('-': stdin)")
    p.add_argument("--max-new-tokens", type=int, help="tokens to generate at most (default 50; 100 with --tldr)")
    p.add_argument("--sample", action="store_true", help="sample instead of taking the most likely token")
    p.add_argument("--temperature", type=float, default=1.0, help="--sample: divide the logits by T")
    p.add_argument("--top-k", type=int, help="--sample: only from the k most likely tokens (default off; 2 with "
                                             "--tldr)")
    p.add_argument("--top-p", type=float, default=1.0, help="--sample: only from the nucleus of probability p")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL's penalty θ on tokens already in "
                                                                         "the context (1 = off, 1.2 in CTRL)")
    p.add_argument("--beams", type=int, default=1, help="beam search with N beams (1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam search: rank by log p / length^α")
    p.add_argument("--stop", action="append", default=[], help="stop when the text contains this string (repeat "
                                                                "for several; '\\n' is a newline)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at each step (slower; "
                                                           "for comparison)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    p.add_argument("--tldr", action="store_true", help="GPT-2's summarisation prompt: append '\\nTL;DR:' to each "
                                                       "prompt, sample with top-k 2, keep three sentences")
    p.add_argument("--json", action="store_true", help="one JSON line per prompt (the default for several prompts)")

    p = sub.add_parser("prompt-eval", help="zero- and few-shot in-context classification accuracy of a causal "
                                           "language model, no training (docs/decoders.md)")
    p.add_argument("--model", required=True, help="a pretrained gpt/gpt2 run, or a transformers GPT-2 directory")
    p.add_argument("--data", required=True, help="the labeled file to classify (CSV, TSV or JSONL)")
    p.add_argument("--train", help="where demonstrations come from (needed for k > 0; never the evaluated example)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label")
    p.add_argument("--verbalizers", help="label=word pairs, e.g. negative=bad,neutral=okay,positive=good "
                                         "(default: the label names)")
    p.add_argument("--template", help="a demonstration, with {text} and {label} (default: "
                                      "'{text}\\nSentiment: {label}\\n\\n')")
    p.add_argument("--k", type=int, nargs="+", default=[0, 1, 4, 8], help="numbers of demonstrations")
    p.add_argument("--draws", type=int, default=5, help="demonstration draws per k > 0 (the spread is over these)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, help="evaluate only the first N rows")
    p.add_argument("--scoring", choices=["mean", "sum", "calibrated"], default="mean",
                   help="compare verbalisers by mean log-probability per token (GPT-3), total, or calibrated "
                        "against a content-free input (Zhao et al. 2021)")
    p.add_argument("--max-length", type=int, help="prompt length in tokens (default: the model's pre-training length)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("cove", help="train CoVe's MT-LSTM (McCann et al. 2017) on a parallel corpus (docs/cove.md)")
    p.add_argument("--train-src", required=True, help="source sentences, one per line (e.g. train.en)")
    p.add_argument("--train-tgt", required=True, help="their translations, line-aligned (e.g. train.de)")
    p.add_argument("--valid-src", required=True, help="dev source sentences")
    p.add_argument("--valid-tgt", required=True, help="dev translations, line-aligned")
    p.add_argument("--out", required=True, help="the run directory to create")
    p.add_argument("--size", default="small", help="tiny, mini, small or base (the paper's 300-d, 300 per direction)")
    p.add_argument("--vectors", help="GloVe/word2vec text file: initialises the source embedding, kept fixed")
    p.add_argument("--vocab-size", type=int, default=10000, help="words per language (lower-cased, seen twice or more)")
    p.add_argument("--max-length", type=int, default=64, help="tokens per sentence, <s> and </s> included")
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--bleu-sentences", type=int, help="dev BLEU at evaluations on the first N dev lines (default all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_train_flags(p)

    p = sub.add_parser("translate", help="translate with a trained MT-LSTM; BLEU against a reference (docs/cove.md)")
    p.add_argument("--model", required=True, help="a run of `sesame cove`")
    p.add_argument("--input", required=True, help="source sentences, one per line")
    p.add_argument("--reference", help="reference translations, line-aligned: print sacrebleu BLEU")
    p.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    p.add_argument("--output", help="write the translations here instead of printing them")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    from . import ulmfit  # sesame ulmfit: ULMFiT's three stages (docs/ulmfit.md)
    ulmfit.add_parser(sub)

    compare.add_parser(sub)

    p = sub.add_parser("demo", help="see pre-training transfer, on data generated on the spot")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--seed", type=int, default=0)
    return parser


def _print_metrics(metrics: dict, as_json: bool) -> None:
    from .metrics import format_classification

    if as_json:
        print(json.dumps(metrics))
    elif "per_class" in metrics:
        print(format_classification(metrics))
    else:
        print("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))


def run(args: argparse.Namespace) -> None:
    from . import api

    progress = not args.no_progress
    if args.command == "tokenizer":
        from .data.corpus import iter_texts, resolve_sources
        from .tokenizer import train_tokenizer

        files = resolve_sources(args.corpus)
        tok = train_tokenizer(iter_texts(files, args.text_field), args.kind, args.vocab_size, args.lowercase,
                              show_progress=progress)
        out = Path(args.out)
        out = out / "tokenizer.json" if out.is_dir() else out
        tok.save(out)
        print(f"wrote {out}: {tok.kind}, {tok.vocab_size} tokens")
    elif args.command == "vectors":
        from .wordvectors import glove, load_vectors

        if args.action == "train":
            print(json.dumps(glove(args.corpus, args.out, args.dim, args.window, args.epochs, args.min_count,
                                   args.max_size, args.lower, args.lr, args.x_max, args.alpha, args.batch_size,
                                   args.seed, args.text_field, progress)))
        else:
            for word, cosine in load_vectors(args.vectors).nearest(args.word, args.k):
                print(f"{word}\t{cosine:.4f}")
    elif args.command == "prepare":
        from .data.corpus import resolve_sources
        from .data.shards import prepare_corpus
        from .rundir import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
        shards = prepare_corpus(resolve_sources(args.corpus), tok, args.out, args.text_field, progress)
        print(f"{shards.path}: {shards.n_tokens:,} tokens in {shards.meta['n_docs']:,} documents")
    elif args.command == "pretrain":
        metrics = api.pretrain(args.corpus, args.out, args.family, args.size, args.tokenizer, args.vocab_size,
                               args.seq_len, args.valid, args.text_field, args.dropout, args.resume, progress,
                               objective=args.objective, objective_options=_objective_options(args),
                               static_masks=args.static_masks, final_seq_len=args.final_seq_len,
                               attention_window=args.attention_window,
                               **_train_options(args))
        _print_metrics(metrics, args.json)
    elif args.command == "finetune":
        metrics = api.finetune(args.base, args.train, args.dev, args.out, args.task, args.text_column,
                               args.label_column, args.tokenizer, args.max_length, args.epochs, args.dropout,
                               args.resume, progress, pooling=args.pooling, discriminative=args.discriminative,
                               gradual_unfreezing=args.gradual_unfreezing, select=args.select,
                               adapters=args.adapters, features=args.features, lm_weight=args.lm_weight,
                               task_options={"pair_column": args.pair_column, "symmetric": args.symmetric or None,
                                             **_key_values(args.task_option, "--task-option", "doc_stride=128")},
                               **_train_options(args))
        _print_metrics(metrics, args.json)
    elif args.command == "compare":
        compare.run(args)
    elif args.command == "ulmfit":
        from . import ulmfit

        ulmfit.run(args)
    elif args.command == "convert":
        from .interop import from_hf, to_hf

        if args.generator and not args.from_hf:
            raise SesameError("--generator: only with --from-hf (a run's generator is exported with it, to "
                              "OUT/generator); drop --generator")
        summary = from_hf(args.from_hf, args.out, args.generator) if args.from_hf else to_hf(args.to_hf, args.out)
        if args.json:
            print(json.dumps(summary))
        else:
            if args.from_hf:
                what = f"a {summary['task']} run" if summary["kind"] == "finetuned" else "a pretrained run"
                what += f" ({summary['objective']})" if summary["objective"] else ""
                print(f"wrote {args.out}: {what} from {summary['model_type']} ({summary['layers']} layers, hidden "
                      f"{summary['hidden']}, {summary['vocab_size']} tokens); left behind: "
                      f"{', '.join(summary['dropped_heads']) or 'nothing'}")
            else:
                also = f"; its generator in {summary['generator']}" if "generator" in summary else ""
                print(f"wrote {args.out}: {summary['architecture']} ({summary['vocab_size']} tokens){also}")
            for note in summary["notes"]:
                print(f"note: {note}")
    elif args.command == "neighbors":
        from .interop import resolve
        from .neighbors import format_neighbors, neighbors

        with resolve(args.model, "--model") as run:
            result = neighbors(run, args.word, args.corpus, args.forms.split(","), args.k, args.layer, args.clusters,
                               args.seed)
        print(json.dumps(result, ensure_ascii=False) if args.json else format_neighbors(result))
    elif args.command == "generate":
        _generate(args, progress)
    elif args.command == "prompt-eval":
        from .prompting import DEFAULT_TEMPLATE, format_report, parse_verbalizers, prompt_eval

        report = prompt_eval(args.model, args.data, args.train, args.text_column, args.label_column,
                             parse_verbalizers(args.verbalizers) if args.verbalizers else None,
                             args.template or DEFAULT_TEMPLATE, args.k, args.draws, args.seed, args.limit, args.scoring,
                             args.max_length, progress)
        print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
    elif args.command == "decontaminate":
        from .decontaminate import decontaminate, format_report

        report = decontaminate(args.corpus, args.eval, args.n, args.out_corpus, args.text_field, args.show, progress)
        print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
    elif args.command == "evaluate":
        _print_metrics(api.evaluate(args.model, args.data, args.text_column, args.label_column,
                                    seq_len=args.seq_len), args.json)
    elif args.command == "predict":
        predictor = api.load(args.model, text_column=args.text_column, pair_column=args.pair_column)
        if args.input:
            inputs = [{k: v for k, v in row.items() if k != "line"} for row in predictor.read(args.input)]
        else:
            inputs = [predictor.task.example(line.rstrip("\n")) for line in sys.stdin if line.strip()]
        predictions = []
        for start in range(0, len(inputs), 256):
            chunk = inputs[start: start + 256]
            predictions += predictor.predict(chunk)
            for example, result in zip(chunk, predictions[start:]):
                print(json.dumps({**example, **result}, ensure_ascii=False))
        if args.output:  # with the gold answers beside the predictions when the file has them (conlleval)
            examples = inputs
            if args.input:
                try:
                    examples = predictor.read(args.input, labeled=True)
                except SesameError:
                    pass  # an unlabeled file
            predictor.task.write(examples, predictions, args.output)
    elif args.command in ("cove", "translate"):
        _translation(args, progress)
    elif args.command == "demo":
        from .demo import run_demo

        run_demo(Path(args.out), seed=args.seed, progress=progress)


def _generate(args: argparse.Namespace, progress: bool) -> None:
    from .generate import TLDR, GenerationConfig, generate, load_language_model, tldr

    if args.prompts:
        source = sys.stdin if args.prompts == "-" else None
        if source is None and not Path(args.prompts).is_file():
            raise SesameError(f"--prompts {args.prompts}: no such file; give a text file with one prompt per line")
        lines = (source.read() if source else Path(args.prompts).read_text(encoding="utf-8")).splitlines()
        prompts = [line for line in lines if line.strip()]
        if not prompts:
            raise SesameError(f"--prompts {args.prompts}: no prompts (every line is empty)")
    else:
        prompts = args.prompt
    if args.batch_size < 1:
        raise SesameError(f"--batch-size {args.batch_size}: must be at least 1")
    cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens or (100 if args.tldr else 50), sample=args.sample or args.tldr,
        temperature=args.temperature, top_k=args.top_k if args.top_k is not None else (2 if args.tldr else 0),
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, beams=args.beams,
        length_penalty=args.length_penalty, stop=tuple(s.replace("\\n", "\n") for s in args.stop), seed=args.seed,
        cache=not args.no_cache)
    cfg.validate()
    lm = load_language_model(args.model)
    inputs = [p + TLDR for p in prompts] if args.tldr else prompts
    if len(prompts) == 1 and not args.json and not args.tldr:  # stream the continuation as it is generated
        print(prompts[0], end="", flush=True)
        generate(lm, inputs, cfg, on_text=lambda i, text: print(text, end="", flush=True))
        print()
        return
    from tqdm.auto import tqdm

    for start in tqdm(range(0, len(prompts), args.batch_size), desc="generate", unit="batch", disable=not progress,
                      file=sys.stderr):
        chunk = slice(start, start + args.batch_size)
        for prompt, result in zip(prompts[chunk], generate(lm, inputs[chunk], cfg, args.batch_size)):
            record = {**result, "prompt": prompt}
            if args.tldr:
                record["summary"] = tldr(result["text"])
            print(json.dumps(record, ensure_ascii=False), flush=True)



def _translation(args: argparse.Namespace, progress: bool) -> None:
    from .translate import train_cove, translate_file

    if args.command == "cove":
        _print_metrics(train_cove(args.train_src, args.train_tgt, args.valid_src, args.valid_tgt, args.out, args.size,
                                  args.vectors, args.vocab_size, args.max_length, args.dropout, args.bleu_sentences,
                                  args.resume, progress, **_train_options(args)), args.json)
        return
    result = translate_file(args.model, args.input, args.reference, args.beam, args.output, progress)
    if not args.output:
        for line in result["translations"]:
            print(line)
    summary = {k: v for k, v in result.items() if k != "translations"}
    print(json.dumps(summary) if args.json else "  ".join(f"{k} {v}" for k, v in summary.items()),
          file=sys.stderr if not args.output else sys.stdout)
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Under torchrun (WORLD_SIZE > 1) training commands run on every process as one process group;
    # every other command runs on rank 0 alone, so it does not write the same files N times.
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    distributed = launched and args.command in ("pretrain", "finetune")
    if launched and int(os.environ.get("RANK", "0")) > 0:
        if not distributed:
            return 0
        sys.stdout = open(os.devnull, "w")  # results are printed once, by rank 0
    if distributed:
        import torch
        import torch.distributed as dist

        # the trainer keeps tensors on the CPU, so CPU collectives go through gloo even when CUDA is present
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    try:
        run(args)
    except SesameError as err:
        print(f"sesame: error: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"sesame: {err}", file=sys.stderr)
        return 130
    finally:
        if distributed:
            dist.destroy_process_group()
    return 0
