"""``sesame neighbors``: a word's nearest neighbours."""
from __future__ import annotations

import argparse
import json



def add(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..interop import resolve
    from ..apps.neighbors import format_neighbors, neighbors

    with resolve(args.model, "--model") as run:
        result = neighbors(run, args.word, args.corpus, args.forms.split(","), args.k, args.layer, args.clusters,
                           args.seed)
    print(json.dumps(result, ensure_ascii=False) if args.json else format_neighbors(result))
