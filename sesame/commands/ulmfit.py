"""``sesame ulmfit``: flags and run in :mod:`sesame.apps.ulmfit`."""
from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps import ulmfit

    ulmfit.add_parser(sub).set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps import ulmfit

    ulmfit.run(args)
