"""The ``sesame`` command: the table of subcommands (:data:`sesame.commands.COMMANDS`, one module each);
a :class:`SesameError`, a value outside a flag's choices among them (:class:`Parser`), becomes one line on stderr and
exit status 2; a closed stdout (``| head``) ends it quietly with status 141, as SIGPIPE ends a Unix tool."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import SesameError
from .outputs import held
from .train import Interrupted

TRAINING = ("pretrain", "finetune")  # the commands every process runs under torchrun
GLOBAL_FLAG = "--no-progress"


class Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), but a value outside a flag's choices is a :class:`SesameError`, one
    line naming the flag and the choices, where argparse prints the whole usage before the line that matters."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is not None and value not in action.choices:
            flag = "/".join(action.option_strings) or action.dest  # a positional: the command
            raise SesameError(f"{flag} {value}: choose one of {', '.join(map(str, action.choices))}")


def _parser() -> argparse.ArgumentParser:
    from .commands import COMMANDS

    parser = Parser(prog="sesame", description="Transfer learning for NLP.")
    parser.add_argument(GLOBAL_FLAG, action="store_true",
                        help="hide progress bars (hidden anyway with --json and when stderr is not a terminal)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).add(sub)
    return parser


def quiet(args: argparse.Namespace) -> bool:
    """Whether progress bars stay hidden: with ``--no-progress`` or ``--json``, and whenever stderr, where they are
    drawn, is not a terminal (a log file, a pipe, CI). Every command reads the answer as ``args.no_progress``."""
    return args.no_progress or getattr(args, "json", False) or not sys.stderr.isatty()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments; the global ``--no-progress`` may also follow the command
    (``sesame pretrain ... --no-progress``), where argparse alone would refuse it."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if GLOBAL_FLAG in extra:
        args.no_progress, extra = True, [a for a in extra if a != GLOBAL_FLAG]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def refused(err: SesameError) -> int:
    print(f"sesame: error: {err}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except SesameError as err:
        return refused(err)
    args.no_progress = quiet(args)
    # Under torchrun (WORLD_SIZE > 1) training commands run on every process as one process group;
    # every other command runs on rank 0 alone, so it does not write the same files N times.
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    distributed = launched and args.command in TRAINING
    if launched and int(os.environ.get("RANK", "0")) > 0:
        if not distributed:
            return 0
        sys.stdout = open(os.devnull, "w")  # results are printed once, by rank 0
    if distributed:
        import torch
        import torch.distributed as dist

        # the trainer keeps tensors on the CPU, so CPU collectives go through gloo even when CUDA is present
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    try:
        with held():  # the outputs it claims, released as it ends (or by the system, should it die)
            args.run(args)
    except SesameError as err:
        return refused(err)
    except Interrupted as err:
        print(f"sesame: {err}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`sesame predict ... | head`): stop as a Unix tool does on SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush of stdout finds no pipe
        return 141
    finally:
        if distributed:
            dist.destroy_process_group()
    return 0
