"""``sesame serve``: flags → :class:`sesame.apps.serve.ServeSpec` → :func:`sesame.apps.serve.serve`."""
from __future__ import annotations

import argparse

from ..options import given
from . import add_runtime_flags, runtime_options, spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.serve import ServeSpec

    p = spec_command(sub, "serve", ServeSpec, required=("model",),
                     help="serve a fine-tuned run or its ONNX export (POST /v1/predict) or a language model "
                          "(POST /v1/generate) over HTTP, with a demo page at / (docs/serving.md)")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.serve import ServeSpec, serve

    serve(ServeSpec(**given(args, ServeSpec)), runtime=runtime_options(args))
