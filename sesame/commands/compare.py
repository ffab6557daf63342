"""``sesame compare``: flags → :class:`sesame.apps.compare.CompareSpec` → :func:`sesame.apps.compare.compare`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..options import given
from . import add_runtime_flags, runtime_options, spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.compare import CompareSpec

    p = spec_command(sub, "compare", CompareSpec, required=("approaches", "corpus", "tasks", "out", "minutes"),
                     json_help="print the rows as JSON",
                     help="pre-training approaches at equal compute, against baselines")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Run the comparison, then print the rows (``--json``) or where the tables went."""
    from ..apps.compare import CompareSpec, compare

    spec = CompareSpec(**given(args, CompareSpec), runtime=runtime_options(args),
                       progress=not getattr(args, "no_progress", False))
    rows = compare(spec)
    print(json.dumps(rows) if args.json else f"wrote {Path(spec.out) / 'results.md'} (and .csv, .json, .png)")
