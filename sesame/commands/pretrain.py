"""``sesame pretrain``: flags → :class:`sesame.specs.PretrainSpec` → :func:`sesame.pipelines.pretrain`."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..data.labeled import decode
from ..errors import SesameError
from ..objectives.distillation import Distillation
from ..options import add_flags, given
from ..specs import PretrainSpec
from . import add_runtime_flags, add_training_flags, key_values, print_metrics, runtime_options, training_options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pre-train a language model")
    add_flags(p, PretrainSpec, required=("corpus", "out"))
    add_flags(p.add_argument_group("DistilBERT's options (with --teacher)"), Distillation)
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    o = p.add_argument_group("objective options (defaults: the family's row in sesame.families)")
    o.add_argument("--masking", choices=["token", "whole_word", "phrase"],
                   help="masked-LM units: tokens, whole words, or phrases (--phrases, else n-grams of words)")
    o.add_argument("--phrases", help="text file, one phrase or entity per line, for --masking phrase")
    o.add_argument("--objective-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other objective option, e.g. generator_fraction=0.25 or disc_weight=50 (repeatable)")
    m = p.add_argument_group("model options (defaults: the family's row and --size)")
    m.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the new model's configuration, e.g. norm=pre (pre-LN), bias=false, "
                        "activation=gelu_tanh, layers=2 (repeatable; the fields of sesame.models' config of the "
                        "family's architecture, docs/pretraining.md)")
    add_training_flags(p)
    add_runtime_flags(p)
    p.set_defaults(run=run)


def objective_options(args: argparse.Namespace) -> dict:
    """--masking, --phrases and --objective-option KEY=VALUE."""
    options = key_values(args.objective_option, "--objective-option", "disc_weight=50")
    if args.masking:
        options["masking"] = args.masking
    if args.phrases:
        path = Path(args.phrases)
        if not path.is_file():
            raise SesameError(f"--phrases {path}: no such file; give a text file with one phrase per line")
        lines = decode(path.read_bytes(), str(path)).splitlines()
        options["phrases"] = [line.strip() for line in lines if line.strip()]
    return options


def model_options(args: argparse.Namespace) -> dict:
    """--model-option KEY=VALUE, each value read as JSON where it parses (:meth:`PretrainSpec.validate` holds them to
    the family's model configuration, whose family a resumed run only knows once read)."""
    return key_values(args.model_option, "--model-option", "norm=pre")


def run(args: argparse.Namespace) -> None:
    from ..pipelines import pretrain

    typed, taught = given(args, PretrainSpec), given(args, Distillation)
    spec = PretrainSpec(**typed, distillation=Distillation(**taught) if taught else None,
                        objective_options=objective_options(args),
                        model_options=model_options(args), training=training_options(args),
                        runtime=runtime_options(args), explicit=frozenset({*typed, *taught}),
                        progress=not args.no_progress)
    print_metrics(pretrain(spec), args.json)
