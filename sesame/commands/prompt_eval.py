"""``sesame prompt-eval``: zero- and few-shot classification."""
from __future__ import annotations

import argparse
import json



def add(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..apps.prompting import DEFAULT_TEMPLATE, format_report, parse_verbalizers, prompt_eval

    report = prompt_eval(args.model, args.data, args.train, args.text_column, args.label_column,
                         parse_verbalizers(args.verbalizers) if args.verbalizers else None,
                         args.template or DEFAULT_TEMPLATE, args.k, args.draws, args.seed, args.limit, args.scoring,
                         args.max_length, progress)
    print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
