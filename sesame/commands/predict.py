"""``sesame predict``: one JSON line per input (a classifier: label and class probabilities)."""
from __future__ import annotations

import argparse
import json

from ..data.labeled import stdin_lines
from ..errors import SesameError
from . import add_runtime_flags, runtime_options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predictions (a classifier: label and class probabilities), one JSON "
                                       "line per input")
    p.add_argument("--model", required=True, help="fine-tuned run, a transformers sequence classifier directory, or "
                                                  "a folder `sesame export` wrote (run by onnxruntime)")
    p.add_argument("--input", help="CSV/TSV/JSONL file (default: one text per line on stdin)")
    p.add_argument("--text-column")
    p.add_argument("--pair-column")
    p.add_argument("--output", help="also write the predictions in the task's own format (CoNLL columns for tag, "
                                    "SQuAD's {id: answer} JSON for span_qa, JSON lines otherwise); a new file")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..outputs import new_file
    from ..pipelines import load

    if args.output:
        new_file(args.output, "--output", {"--input": args.input, "--model": args.model})
    predictor = load(args.model, text_column=args.text_column, pair_column=args.pair_column,
                     runtime=runtime_options(args))
    if args.input:
        inputs = [{k: v for k, v in row.items() if k != "line"} for row in predictor.read(args.input)]
    else:
        inputs = [predictor.task.example(line) for line in stdin_lines() if line.strip()]
    predictions = []
    for start in range(0, len(inputs), 256):
        chunk = inputs[start: start + 256]
        predictions += predictor.predict(chunk)
        for example, result in zip(chunk, predictions[start:]):
            print(json.dumps({**example, **result}, ensure_ascii=False))
    if args.output:  # with the gold answers beside the predictions when the file has them (conlleval)
        examples = inputs
        if args.input:
            try:
                examples = predictor.read(args.input, labeled=True)
            except SesameError:
                pass  # an unlabeled file
        predictor.task.write(examples, predictions, args.output)
