"""``sesame vectors``: static word vectors."""
from __future__ import annotations

import argparse
import json



def add(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser("vectors", help="static word vectors: train GloVe, or look up neighbours in a GloVe/word2vec "
                                         "text file (docs/wordvectors.md)")
    top.set_defaults(run=run)
    vec = top.add_subparsers(dest="action", required=True)
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


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..wordvectors import glove, load_vectors

    if args.action == "train":
        print(json.dumps(glove(args.corpus, args.out, args.dim, args.window, args.epochs, args.min_count,
                               args.max_size, args.lower, args.lr, args.x_max, args.alpha, args.batch_size,
                               args.seed, args.text_field, progress)))
    else:
        for word, cosine in load_vectors(args.vectors).nearest(args.word, args.k):
            print(f"{word}\t{cosine:.4f}")
