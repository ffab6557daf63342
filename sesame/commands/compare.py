"""``sesame compare``: flags and run in :mod:`sesame.apps.compare`."""
from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps import compare

    compare.add_parser(sub).set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps import compare

    compare.run(args)
