"""``sesame convert``: Hugging Face checkpoints in and out."""
from __future__ import annotations

import argparse
import json

from ..errors import SesameError


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="a Hugging Face checkpoint → a pretrained run, or a run → a Hugging Face "
                                       "checkpoint (docs/interop.md)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--from-hf", metavar="DIR", help="a transformers model directory (config.json, model.safetensors "
                                                    "or pytorch_model.bin, tokenizer files) to import")
    g.add_argument("--to-hf", metavar="RUN", help="a pretrained run, or a fine-tuned classify/pair/regress run, to "
                                                  "export for transformers")
    p.add_argument("--generator", metavar="DIR", help="with --from-hf of an ElectraForPreTraining discriminator: "
                                                      "its ElectraForMaskedLM generator; both become one electra run")
    p.add_argument("--out", required=True, help="the new run (--from-hf) or model directory (--to-hf; an electra "
                                                "run's generator goes to its generator/ subdirectory)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..interop import from_hf, to_hf

    if args.generator and not args.from_hf:
        raise SesameError("--generator: only with --from-hf (a run's generator is exported with it, to "
                          "OUT/generator); drop --generator")
    summary = from_hf(args.from_hf, args.out, args.generator) if args.from_hf else to_hf(args.to_hf, args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        if args.from_hf:
            what = f"a {summary['task']} run" if summary["kind"] == "finetuned" else "a pretrained run"
            what += f" ({summary['objective']})" if summary["objective"] else ""
            print(f"wrote {args.out}: {what} from {summary['model_type']} ({summary['layers']} layers, hidden "
                  f"{summary['hidden']}, {summary['vocab_size']} tokens); left behind: "
                  f"{', '.join(summary['dropped_heads']) or 'nothing'}")
        else:
            also = f"; its generator in {summary['generator']}" if "generator" in summary else ""
            print(f"wrote {args.out}: {summary['architecture']} ({summary['vocab_size']} tokens){also}")
        for note in summary["notes"]:
            print(f"note: {note}")
