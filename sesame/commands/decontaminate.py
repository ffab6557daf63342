"""``sesame decontaminate``: flags → :class:`sesame.apps.decontaminate.DecontaminateSpec` →
:func:`sesame.apps.decontaminate.decontaminate`."""
from __future__ import annotations

import argparse
import json

from ..options import given
from . import spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.decontaminate import DecontaminateSpec

    p = spec_command(sub, "decontaminate", DecontaminateSpec, required=("corpus",),
                     help="n-gram overlap between a pre-training corpus and evaluation sets, GPT-3 style "
                          "(docs/decontamination.md)")
    p.add_argument("--eval", action="append", required=True, help="an evaluation set (repeat the flag): "
                                                                  "see docs/decontamination.md")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.decontaminate import DecontaminateSpec, decontaminate, format_report

    spec = DecontaminateSpec(**given(args, DecontaminateSpec), evals=args.eval, progress=not args.no_progress)
    report = decontaminate(spec)
    print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
