"""``sesame finetune``: flags → :class:`sesame.specs.FinetuneSpec` → :func:`sesame.pipelines.finetune`."""
from __future__ import annotations

import argparse

from ..options import add_flags, given
from ..specs import FinetuneSpec
from ..train.recipes import Recipe
from . import add_runtime_flags, add_training_flags, key_values, print_metrics, runtime_options, training_options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune a run (or a scratch model) on a labeled task")
    add_flags(p, FinetuneSpec, required=("base", "out"))  # and --train with --dev, or --mixture (FinetuneSpec.validate)
    t = p.add_argument_group("the task's options")
    t.add_argument("--text-column", help="default: text (classify, regress), sentence1 (pair); numbers pick "
                                         "columns of a file without a header row")
    t.add_argument("--label-column", help="default: label")
    t.add_argument("--pair-column", help="the second text of a pair (default for --task pair: sentence2)")
    t.add_argument("--symmetric", action="store_true",
                   help="pairs without an order (similarity): score both orders and add them (GPT)")
    t.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other option of the task, e.g. doc_stride=128 (repeatable)")
    add_flags(p.add_argument_group("recipe: which parameters move and how fast"), Recipe)
    p.add_argument("--json", action="store_true")
    add_training_flags(p)
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..pipelines import finetune
    from ..tasks import TASKS

    task_options = {"text_column": args.text_column, "label_column": args.label_column,
                    "pair_column": args.pair_column, "symmetric": args.symmetric or None,
                    **key_values(args.task_option, "--task-option", "doc_stride=128", TASKS.get(args.task))}
    typed, recipe = given(args, FinetuneSpec), given(args, Recipe)
    spec = FinetuneSpec(**typed, task_options=task_options, recipe=Recipe(**recipe), training=training_options(args),
                        runtime=runtime_options(args), explicit=frozenset({*typed, *recipe}),
                        progress=not args.no_progress)
    print_metrics(finetune(spec), args.json)
