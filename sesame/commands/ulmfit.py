"""``sesame ulmfit``: flags → :class:`sesame.apps.ulmfit.UlmfitSpec` → :func:`sesame.apps.ulmfit.ulmfit`."""
from __future__ import annotations

import argparse
import json

from ..options import given
from . import add_runtime_flags, runtime_options, spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.ulmfit import UlmfitSpec

    p = spec_command(sub, "ulmfit", UlmfitSpec, required=("train", "dev", "out"), json_help="print the rows as JSON",
                     help="ULMFiT's three stages, resumable: general LM, target LM, classifier (docs/ulmfit.md)")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Run the pipeline, then print the table (or its rows as JSON)."""
    from ..apps.ulmfit import UlmfitSpec, markdown, ulmfit

    result = ulmfit(UlmfitSpec(**given(args, UlmfitSpec), runtime=runtime_options(args),
                               progress=not getattr(args, "no_progress", False)))
    print(json.dumps(result["rows"]) if args.json else markdown(result["rows"]).rstrip())
