"""``sesame demo``: see pre-training transfer, on data generated on the spot (:mod:`sesame.apps.demo`)."""
from __future__ import annotations

import argparse

from ..options import add_flags, given


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.demo import DemoSpec

    p = sub.add_parser("demo", help="see pre-training transfer, on data generated on the spot")
    add_flags(p, DemoSpec)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.demo import DemoSpec, run_demo

    run_demo(DemoSpec(**given(args, DemoSpec), progress=not args.no_progress))
