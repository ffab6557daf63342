"""``sesame cove``: train CoVe's MT-LSTM on a parallel corpus."""
from __future__ import annotations

import argparse

from . import add_training_flags, print_metrics, training_options


def add(sub: argparse._SubParsersAction) -> None:
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
    add_training_flags(p)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.cove import train_cove

    print_metrics(train_cove(args.train_src, args.train_tgt, args.valid_src, args.valid_tgt, args.out, args.size,
                             args.vectors, args.vocab_size, args.max_length, args.dropout, args.bleu_sentences,
                             args.resume, not args.no_progress, **training_options(args)), args.json)
