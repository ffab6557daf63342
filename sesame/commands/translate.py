"""``sesame translate``: translate with a trained MT-LSTM; BLEU against a reference."""
from __future__ import annotations

import argparse
import json
import sys

from . import add_runtime_flags, runtime_options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate with a trained MT-LSTM; BLEU against a reference (docs/cove.md)")
    p.add_argument("--model", required=True, help="a run of `sesame cove`")
    p.add_argument("--input", required=True, help="source sentences, one per line")
    p.add_argument("--reference", help="reference translations, line-aligned: print sacrebleu BLEU")
    p.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    p.add_argument("--output", help="write the translations here instead of printing them")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..apps.cove import translate_file

    result = translate_file(args.model, args.input, reference=args.reference, beam=args.beam, output=args.output,
                            progress=progress, runtime=runtime_options(args))
    if not args.output:
        for line in result["translations"]:
            print(line)
    summary = {k: v for k, v in result.items() if k != "translations"}
    print(json.dumps(summary) if args.json else "  ".join(f"{k} {v}" for k, v in summary.items()),
          file=sys.stderr if not args.output else sys.stdout)
