"""``sesame prompt-eval``: flags → :class:`sesame.apps.prompting.PromptSpec` →
:func:`sesame.apps.prompting.prompt_eval`: zero- and few-shot classification."""
from __future__ import annotations

import argparse
import json

from ..apps.prompting import PromptSpec
from ..options import given
from . import add_runtime_flags, runtime_options, spec_command


def add(sub: argparse._SubParsersAction) -> None:
    p = spec_command(sub, "prompt-eval", PromptSpec, required=("model", "data"),
                     help="zero- and few-shot in-context classification accuracy of a causal language model, no "
                          "training (docs/decoders.md)")
    p.add_argument("--verbalizers", help="label=word pairs, e.g. negative=bad,neutral=okay,positive=good "
                                         "(default: the label names)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.prompting import format_report, parse_verbalizers, prompt_eval

    verbalizers = parse_verbalizers(args.verbalizers) if args.verbalizers else None
    report = prompt_eval(PromptSpec(**given(args, PromptSpec), verbalizers=verbalizers, runtime=runtime_options(args),
                                    progress=not args.no_progress))
    print(json.dumps(report, ensure_ascii=False) if args.json else format_report(report))
