"""``sesame demo``: see pre-training transfer, on data generated on the spot."""
from __future__ import annotations

import argparse
from pathlib import Path


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="see pre-training transfer, on data generated on the spot")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.demo import run_demo

    run_demo(Path(args.out), seed=args.seed, progress=not args.no_progress)
