"""``sesame generate``: continue prompts with a causal language model, or write an encoder-decoder's output for
source texts."""
from __future__ import annotations

import argparse
import json
import sys

from ..data.labeled import a_file, decode, stdin_lines
from ..errors import SesameError
from . import add_runtime_flags, runtime_options


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue prompts with a causal language model, or write an encoder-decoder's "
                                        "output for sources: greedy, sampling, beam search (docs/decoders.md, "
                                        "docs/text2text.md)")
    p.add_argument("--model", required=True, help="a pretrained gpt/gpt2 run, a t5/bart run (pre-trained or "
                                                  "fine-tuned), or a transformers directory with a causal LM head "
                                                  "(GPT2LMHeadModel) or of T5/BART for conditional generation")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", action="append", help="a prompt, or an encoder-decoder's source (repeat the flag for "
                                                     "several)")
    g.add_argument("--prompts", metavar="FILE", help="a text file with one prompt or source per line ('-': stdin)")
    p.add_argument("--max-new-tokens", type=int, help="tokens to generate at most (default 50; 100 with --tldr)")
    p.add_argument("--sample", action="store_true", help="sample instead of taking the most likely token")
    p.add_argument("--temperature", type=float, default=1.0, help="--sample: divide the logits by T")
    p.add_argument("--top-k", type=int, help="--sample: only from the k most likely tokens (default off; 2 with "
                                             "--tldr)")
    p.add_argument("--top-p", type=float, default=1.0, help="--sample: only from the nucleus of probability p")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL's penalty θ on tokens already in "
                                                                         "the context (1 = off, 1.2 in CTRL)")
    p.add_argument("--beams", type=int, default=1, help="beam search with N beams (1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam search: rank by log p / length^α")
    p.add_argument("--stop", action="append", default=[], help="stop when the text contains this string (repeat "
                                                                "for several; '\\n' is a newline)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence at each step (slower; "
                                                           "for comparison)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    p.add_argument("--tldr", action="store_true", help="GPT-2's summarisation prompt: append '\\nTL;DR:' to each "
                                                       "prompt, sample with top-k 2, keep three sentences")
    p.add_argument("--json", action="store_true", help="one JSON line per prompt (the default for several prompts)")
    add_runtime_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..apps.generate import TLDR, tldr
    from ..decoding import GenerationConfig
    from ..generation import Transducer, generate, load_generator

    if args.prompts:
        lines = stdin_lines() if args.prompts == "-" else \
            decode(a_file(args.prompts, "a text file with one prompt per line", "--prompts").read_bytes(),
                   args.prompts).splitlines()
        prompts = [line for line in lines if line.strip()]
        if not prompts:
            raise SesameError(f"--prompts {args.prompts}: no prompts (every line is empty)")
    else:
        prompts = args.prompt
        for prompt in prompts:
            if not prompt.strip():
                raise SesameError(f"--prompt {prompt!r}: an empty prompt gives the model nothing to continue; give "
                                  "some text")
    if args.batch_size < 1:
        raise SesameError(f"--batch-size {args.batch_size}: must be at least 1")
    cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens or (100 if args.tldr else 50), sample=args.sample or args.tldr,
        temperature=args.temperature, top_k=args.top_k if args.top_k is not None else (2 if args.tldr else 0),
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, beams=args.beams,
        length_penalty=args.length_penalty, stop=tuple(s.replace("\\n", "\n") for s in args.stop), seed=args.seed,
        cache=not args.no_cache)
    cfg.validate()
    lm = load_generator(args.model, runtime=runtime_options(args))
    continues = not isinstance(lm, Transducer)  # an encoder-decoder's output is its own text, not a continuation
    if args.tldr and not continues:
        raise SesameError("--tldr: GPT-2's summarisation prompt is for causal language models; an encoder-decoder "
                          "reads its source as it was trained (fine-tune it on summaries, then generate)")
    inputs = [p + TLDR for p in prompts] if args.tldr else prompts
    if len(prompts) == 1 and not args.json and not args.tldr:  # stream the continuation as it is generated
        if continues:
            print(prompts[0], end="", flush=True)
        generate(lm, inputs, cfg, on_text=lambda i, text: print(text, end="", flush=True))
        print()
        return
    from tqdm.auto import tqdm

    for start in tqdm(range(0, len(prompts), args.batch_size), desc="generate", unit="batch", disable=not progress,
                      file=sys.stderr):
        chunk = slice(start, start + args.batch_size)
        for prompt, result in zip(prompts[chunk], generate(lm, inputs[chunk], cfg, batch_size=args.batch_size,
                                                           first=start)):
            record = {**result, "prompt": prompt}
            if args.tldr:
                record["summary"] = tldr(result["text"])
            print(json.dumps(record, ensure_ascii=False), flush=True)
