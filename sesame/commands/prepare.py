"""``sesame prepare``: token shards."""
from __future__ import annotations

import argparse
from collections import Counter



def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="tokenize a corpus into memory-mapped shards, cut into documents (WikiText "
                       "titles, chapter headings, blank lines, JSON Lines records)")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, or a run directory holding one")
    p.add_argument("--text-field", default="text", help="the text field of JSON Lines records, the text column of "
                   "Parquet files")
    p.add_argument("--out", required=True, help="shard directory")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..data.corpus import resolve_sources
    from ..data.shards import prepare_corpus
    from ..run import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    shards = prepare_corpus(resolve_sources(args.corpus), tok, args.out, args.text_field, progress)
    rules = Counter(shards.meta["boundaries"])
    cut = ", ".join(f"{n} file{'s' * (n > 1)} by {rule}" for rule, n in rules.items())
    print(f"{shards.path}: {shards.n_tokens:,} tokens in {shards.meta['n_docs']:,} documents ({cut})")
