"""The ``sesame`` subcommands, one thin module each: ``add(subparsers)`` declares the flags (from the
stage's spec where there is one) and sets ``run(args)``, which builds the spec, calls a pipeline or an
application, and prints. :data:`COMMANDS` lists them in the order ``sesame --help`` shows.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..errors import SesameError
from ..options import add_flags, given, parse_value
from ..runtime import Runtime
from ..specs import FinetuneSpec
from ..tasks import TASKS
from ..train import TrainConfig
from ..train.recipes import Recipe

COMMANDS = ("tokenizer", "vectors", "prepare", "pretrain", "finetune", "distil", "evaluate", "predict", "export",
            "convert", "neighbors", "decontaminate", "generate", "prompt_eval", "cove", "translate", "ulmfit",
            "compare", "report", "demo", "serve")


def spec_command(sub: argparse._SubParsersAction, name: str, spec: type, *, help: str,
                 required: tuple[str, ...] = (), json_help: str | None = None) -> argparse.ArgumentParser:
    """The subcommand ``name`` whose flags are ``spec``'s fields (:func:`sesame.options.add_flags`), with a
    ``--json`` switch when ``json_help`` says what it prints."""
    p = sub.add_parser(name, help=help)
    add_flags(p, spec, required=required)
    if json_help:
        p.add_argument("--json", action="store_true", help=json_help)
    return p


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """TrainConfig's fields as flags (``--lr``, ``--max-steps``, ...) and ``--resume``."""
    add_flags(p.add_argument_group("training (defaults: sesame.train.TrainConfig over the family's)"), TrainConfig)


def training_options(args: argparse.Namespace) -> dict:
    """The TrainConfig fields given on the command line."""
    return given(args, TrainConfig)


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    """Runtime's fields as flags: ``--device``, ``--precision``, ``--tf32``, ``--compile`` (sesame.runtime)."""
    add_flags(p.add_argument_group("runtime: where and how the model runs (sesame.runtime)"), Runtime)


def runtime_options(args: argparse.Namespace) -> Runtime:
    """The runtime the command line asks for (its flags not given keep their defaults)."""
    return Runtime(**given(args, Runtime))


def add_finetuning_flags(p: argparse.ArgumentParser, spec: type[FinetuneSpec], *, required: tuple[str, ...]) -> None:
    """The flags of ``sesame finetune`` (and of the commands that fine-tune too, ``distil``): ``spec``'s fields, the
    task's options, the recipe's, ``--json``, training and runtime."""
    add_flags(p, spec, required=required)
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


def finetuning_spec(args: argparse.Namespace, spec: type[FinetuneSpec]) -> FinetuneSpec:
    """The ``spec`` (FinetuneSpec or a subclass) of the flags :func:`add_finetuning_flags` declared."""
    task_options = {"text_column": args.text_column, "label_column": args.label_column,
                    "pair_column": args.pair_column, "symmetric": args.symmetric or None,
                    **key_values(args.task_option, "--task-option", "doc_stride=128", TASKS.get(args.task))}
    typed, recipe = given(args, spec), given(args, Recipe)
    return spec(**typed, task_options=task_options, recipe=Recipe(**recipe), training=training_options(args),
                runtime=runtime_options(args), explicit=frozenset({*typed, *recipe}), progress=not args.no_progress)


def key_values(items: list[str], flag: str, example: str, cls: type | None = None) -> dict:
    """Repeated ``flag KEY=VALUE`` options as a dict: VALUE read as a field of ``cls`` where KEY is one
    (:func:`sesame.options.parse_value`: a string field's value stays as written, ``text_column=0`` too), else as JSON
    when it parses."""
    known = {f.name for f in fields(cls)} if cls is not None else set()
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SesameError(f"{flag} {item!r}: write KEY=VALUE, e.g. {example}")
        if key in known:
            options[key] = parse_value(cls, key, value, flag)
            continue
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def print_metrics(metrics: dict, as_json: bool) -> None:
    from ..metrics import format_classification

    if as_json:
        print(json.dumps(metrics))
    elif "per_class" in metrics:
        print(format_classification(metrics))
    else:
        print("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
