"""``sesame vectors``: static word vectors: ``train`` (flags → :class:`sesame.apps.vectors.GloveSpec` →
:func:`sesame.apps.vectors.glove`) and ``neighbors`` (a word's nearest words in a vectors file)."""
from __future__ import annotations

import argparse
import json

from ..options import add_flags, given


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.vectors import GloveSpec

    top = sub.add_parser("vectors", help="static word vectors: train GloVe, or look up neighbours in a GloVe/word2vec "
                                         "text file (docs/wordvectors.md)")
    top.set_defaults(run=run)
    vec = top.add_subparsers(dest="action", required=True)
    v = vec.add_parser("train", help="GloVe (Pennington et al. 2014) on text files, folders or .jsonl")
    add_flags(v, GloveSpec, required=("corpus", "out"))
    v = vec.add_parser("neighbors", help="a word's nearest neighbours by cosine in a vectors file")
    v.add_argument("--vectors", required=True, help="a GloVe or word2vec text file")
    v.add_argument("--word", required=True)
    v.add_argument("--k", type=int, default=10)


def run(args: argparse.Namespace) -> None:
    from ..apps.vectors import GloveSpec, glove, nearest
    from ..data.vectors import load_vectors

    if args.action == "train":
        print(json.dumps(glove(GloveSpec(**given(args, GloveSpec), progress=not args.no_progress))))
    else:
        for word, cosine in nearest(load_vectors(args.vectors), args.word, args.k):
            print(f"{word}\t{cosine:.4f}")
