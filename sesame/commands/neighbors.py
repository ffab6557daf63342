"""``sesame neighbors``: flags → :class:`sesame.apps.neighbors.NeighborsSpec` →
:func:`sesame.apps.neighbors.neighbors`."""
from __future__ import annotations

import argparse
import json

from ..options import given
from . import add_runtime_flags, runtime_options, spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.neighbors import NeighborsSpec

    p = spec_command(sub, "neighbors", NeighborsSpec, required=("model", "word", "corpus"),
                     json_help="print one JSON object",
                     help="a word's nearest neighbours: per occurrence by contextual vector, and once by static "
                          "input embedding (docs/neighbors.md)")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.neighbors import NeighborsSpec, format_neighbors, neighbors

    result = neighbors(NeighborsSpec(**given(args, NeighborsSpec), runtime=runtime_options(args)))
    print(json.dumps(result, ensure_ascii=False) if args.json else format_neighbors(result))
