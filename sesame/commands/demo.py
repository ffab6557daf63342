"""``sesame demo``: see pre-training transfer, on data generated on the spot (:mod:`sesame.apps.demo`)."""
from __future__ import annotations

import argparse

from ..options import given
from . import add_runtime_flags, runtime_options, spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.demo import DemoSpec

    p = spec_command(sub, "demo", DemoSpec, help="see pre-training transfer, on data generated on the spot")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.demo import DemoSpec, run_demo

    run_demo(DemoSpec(**given(args, DemoSpec), runtime=runtime_options(args), progress=not args.no_progress))
