"""``sesame export``: a fine-tuned run → an ONNX model, its tokenizer and export.json, for a runtime without sesame
(docs/export.md)."""
from __future__ import annotations

import argparse
import json


def add(sub: argparse._SubParsersAction) -> None:
    from ..interop.onnx_export import FORMATS, QUANTIZATIONS

    p = sub.add_parser("export", help="a fine-tuned classify/pair/regress run → an ONNX model with its "
                                      "tokenizer.json, served without sesame (docs/export.md)")
    p.add_argument("--model", required=True, help="fine-tuned run, or a transformers sequence classifier directory")
    p.add_argument("--format", choices=FORMATS, default="onnx", help="the runtime format (default: onnx)")
    p.add_argument("--quantize", choices=QUANTIZATIONS, help="int8: onnxruntime's dynamic quantisation (int8 "
                                                             "weights, activations quantised at run time)")
    p.add_argument("--out", required=True, help="a new or empty folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..interop.onnx_export import to_onnx

    summary = to_onnx(args.model, args.out, quantize=args.quantize)
    if args.json:
        print(json.dumps(summary))
    else:
        what = "int8 (dynamic)" if args.quantize else "fp32"
        print(f"wrote {args.out}: model.onnx ({what}; inputs {', '.join(summary['inputs'])} → {summary['output']}), "
              f"tokenizer.json, export.json; fp32 graph vs the run: max abs difference "
              f"{summary['max_abs_difference_fp32']:.2g}")
