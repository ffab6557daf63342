"""``sesame finetune``: flags → :class:`sesame.specs.FinetuneSpec` → :func:`sesame.pipelines.finetune`."""
from __future__ import annotations

import argparse

from ..specs import FinetuneSpec
from . import add_finetuning_flags, finetuning_spec, print_metrics


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune a run (or a scratch model) on a labeled task")
    add_finetuning_flags(p, FinetuneSpec, required=("base", "out"))  # and --train with --dev, or --mixture
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..pipelines import finetune

    print_metrics(finetune(finetuning_spec(args, FinetuneSpec)), args.json)
