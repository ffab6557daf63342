"""``sesame demo``: see pre-training transfer, on data generated on the spot (:mod:`sesame.apps.demo`)."""
from __future__ import annotations

import argparse

from ..options import given
from . import spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.demo import DemoSpec

    p = spec_command(sub, "demo", DemoSpec, help="see pre-training transfer, on data generated on the spot")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.demo import DemoSpec, run_demo

    run_demo(DemoSpec(**given(args, DemoSpec), progress=not args.no_progress))
