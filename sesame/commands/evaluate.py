"""``sesame evaluate``: a run's metrics on labeled data (fine-tuned) or text (pretrained)."""
from __future__ import annotations

import argparse

from . import add_runtime_flags, print_metrics, runtime_options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="metrics of a run on labeled data or text")
    p.add_argument("--model", required=True, help="run directory, or a transformers directory: a sequence classifier, "
                                                  "or a model with its pre-training head (*ForMaskedLM, ...)")
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--text-column")
    p.add_argument("--label-column")
    p.add_argument("--seq-len", type=int, help="language models: window length (default: the run's)")
    p.add_argument("--mem-len", type=int, help="XLNet language models: states of earlier segments each layer keeps "
                                               "while reading the text (default: the run's mem_len; 0: no memory)")
    p.add_argument("--json", action="store_true")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..pipelines import evaluate

    print_metrics(evaluate(args.model, args.data, text_column=args.text_column, label_column=args.label_column,
                           seq_len=args.seq_len, mem_len=args.mem_len,
                           runtime=runtime_options(args)), args.json)
