"""``sesame decontaminate``: n-gram overlap with evaluation sets."""
from __future__ import annotations

import argparse
import json



def add(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..apps.decontaminate import decontaminate, format_report

    report = decontaminate(args.corpus, args.eval, args.n, args.out_corpus, args.text_field, args.show, progress)
    print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
