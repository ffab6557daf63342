"""``sesame neighbors``: flags → :class:`sesame.apps.neighbors.NeighborsSpec` →
:func:`sesame.apps.neighbors.neighbors`."""
from __future__ import annotations

import argparse
import json

from ..options import add_flags, given


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.neighbors import NeighborsSpec

    p = sub.add_parser("neighbors", help="a word's nearest neighbours: per occurrence by contextual vector, and "
                                         "once by static input embedding (docs/neighbors.md)")
    add_flags(p, NeighborsSpec, required=("model", "word", "corpus"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.neighbors import NeighborsSpec, format_neighbors, neighbors

    result = neighbors(NeighborsSpec(**given(args, NeighborsSpec)))
    print(json.dumps(result, ensure_ascii=False) if args.json else format_neighbors(result))
