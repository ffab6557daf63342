"""``sesame cove``: flags → :class:`sesame.apps.cove.CoveSpec` → :func:`sesame.apps.cove.train_cove`: CoVe's
MT-LSTM trained on a parallel corpus."""
from __future__ import annotations

import argparse

from ..apps.cove import CoveSpec
from ..options import given
from . import add_runtime_flags, add_training_flags, print_metrics, runtime_options, spec_command, training_options


def add(sub: argparse._SubParsersAction) -> None:
    p = spec_command(sub, "cove", CoveSpec, required=("train_src", "train_tgt", "valid_src", "valid_tgt", "out"),
                     json_help="print one JSON object",
                     help="train CoVe's MT-LSTM (McCann et al. 2017) on a parallel corpus (docs/cove.md)")
    add_training_flags(p)
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.cove import train_cove

    spec = CoveSpec(**given(args, CoveSpec), training=training_options(args), runtime=runtime_options(args),
                    progress=not args.no_progress)
    print_metrics(train_cove(spec), args.json)
