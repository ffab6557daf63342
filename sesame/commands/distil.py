"""``sesame distil``: flags → :class:`sesame.specs.DistilSpec` → :func:`sesame.pipelines.distil`: every flag of
``sesame finetune``, with ``--student`` for ``--from``, and the teacher's."""
from __future__ import annotations

import argparse

from ..specs import DistilSpec
from . import add_finetuning_flags, finetuning_spec, print_metrics


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distil", help="train a student (a run or a scratch model) on a fine-tuned teacher's outputs "
                                      "on unlabeled text (Hinton et al. 2015)")
    add_finetuning_flags(p, DistilSpec, required=("base", "teacher", "unlabeled", "dev", "out"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..pipelines import distil

    print_metrics(distil(finetuning_spec(args, DistilSpec)), args.json)
