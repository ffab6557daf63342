"""``sesame ulmfit``: flags → :class:`sesame.apps.ulmfit.UlmfitSpec` → :func:`sesame.apps.ulmfit.ulmfit`."""
from __future__ import annotations

import argparse
import json

from ..options import add_flags, given


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.ulmfit import UlmfitSpec

    p = sub.add_parser("ulmfit", help="ULMFiT's three stages, resumable: general LM, target LM, classifier "
                                      "(docs/ulmfit.md)")
    add_flags(p, UlmfitSpec, required=("train", "dev", "out"))
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Run the pipeline, then print the table (or its rows as JSON)."""
    from ..apps.ulmfit import UlmfitSpec, markdown, ulmfit

    result = ulmfit(UlmfitSpec(**given(args, UlmfitSpec), progress=not getattr(args, "no_progress", False)))
    print(json.dumps(result["rows"]) if args.json else markdown(result["rows"]).rstrip())
