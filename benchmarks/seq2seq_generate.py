"""Greedy encoder-decoder generation speed: sesame's ``generate_seq2seq`` against transformers' ``generate``, both
with their caches, on the same random T5 and BART weights.

For each ``--styles`` and ``--sizes`` (layers x hidden from ``sesame.families.SIZES``, hidden/64 heads of 64,
feed-forward 4 x hidden, the same number of decoder as encoder layers, ``--vocab-size`` tokens, 1024 positions, no
dropout) sesame's ``EncoderDecoder`` of the style (T5 v1.0: ReLU, relative position buckets 32 up to 128; BART) and
transformers' ``T5ForConditionalGeneration`` or ``BartForConditionalGeneration`` of the configuration the interop
derives from sesame's are made, transformers' random weights copied into sesame's model
(``encoder_decoder_pair.build_pair``, as ``train_step.py``'s). Sources are random token ids (seeded),
``--source-tokens`` long; every row of a batch has that length, so nothing is padded.

* sesame: ``sesame.seq2seq.generate_seq2seq(model, sources, GenerationConfig(max_new_tokens), eos=None)``: the
  encoder once, the cross-attention keys and values projected once, the decoder's self-attention KV cache.
* transformers: ``model.generate(do_sample=False, num_beams=1, max_new_tokens=...)`` with its default cache, no
  end token (unset on the model's generation config, as the forced end token of BART's), so both sides always
  generate ``--new-tokens`` tokens per row.

Both run as a warm-up, then ``--repeats`` rounds alternate between them (the order flips every round); the best time
counts. Throughput counts the generated tokens of all rows (batch x new tokens) per second. Parity: the greedy tokens
of every row must be identical on both sides; a mismatch is printed loudly (a random model's logits are close
together, so a near-tie can flip a token).

Output: one JSON line per style, size, batch and source length, ``bench`` naming them (``seq2seq-generate-t5-mini-
b8-s64``) and ``ratio`` = sesame's tokens/s over transformers'. Each result records the share of the machine's CPUs
that other processes used while it ran; compare ratios from the same run only.

    python benchmarks/seq2seq_generate.py           # t5 and bart, mini, batches 1 and 8, sources 64 and 256
    python benchmarks/seq2seq_generate.py --sizes tiny --batches 1 2 --source-tokens 8 --new-tokens 4 --repeats 1
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from encoder_decoder_pair import SPECIALS, build_pair  # noqa: E402
from train_step_timing import cpu_clock, others_share  # noqa: E402

from sesame.decoding import GenerationConfig  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.families import SIZES  # noqa: E402
from sesame.models.encoder_decoder import EncoderDecoder  # noqa: E402
from sesame.seq2seq import generate_seq2seq  # noqa: E402

POSITIONS = 1024  # BART's learned positions


def generation_pair(style: str, size: str, vocab: int, seed: int) -> tuple[EncoderDecoder, torch.nn.Module]:
    """sesame's ``style`` model at ``size`` and transformers' with the same weights, both in eval mode;
    transformers' generation config without an end token, so it always makes ``--new-tokens``."""
    layers, hidden = SIZES[size]
    ours, hf = build_pair(style, vocab_size=vocab, hidden=hidden, layers=layers, heads=hidden // 64,
                          intermediate=4 * hidden, max_positions=POSITIONS, dropout=0.0, seed=seed)
    hf.generation_config.eos_token_id = hf.generation_config.forced_eos_token_id = None
    return ours.eval(), hf.eval()


def sesame_run(model: EncoderDecoder, sources: torch.Tensor, new_tokens: int) -> list[list[int]]:
    cfg = GenerationConfig(max_new_tokens=new_tokens)
    return [h.tokens for h in generate_seq2seq(model, sources.tolist(), cfg, eos=None, batch_size=len(sources))]


def transformers_run(model: torch.nn.Module, sources: torch.Tensor, new_tokens: int, style: str) -> list[list[int]]:
    out = model.generate(input_ids=sources, attention_mask=torch.ones_like(sources), max_new_tokens=new_tokens,
                         min_length=0, do_sample=False, num_beams=1, use_cache=True, pad_token_id=SPECIALS[style].pad,
                         decoder_start_token_id=model.config.decoder_start_token_id)
    return out[:, 1:].tolist()  # after the start token


def bench(style: str, size: str, batch: int, sources: torch.Tensor, pair: tuple[EncoderDecoder, torch.nn.Module],
          args: argparse.Namespace) -> dict:
    """Warm-up, then ``--repeats`` alternating rounds of both sides; the result's JSON line."""
    ours, hf = pair
    runs = {"sesame": lambda: sesame_run(ours, sources, args.new_tokens),
            "transformers": lambda: transformers_run(hf, sources, args.new_tokens, style)}
    best = dict.fromkeys(runs, float("inf"))
    start = cpu_clock()
    with torch.inference_mode():
        tokens = {name: run() for name, run in runs.items()}  # warm-up; its tokens are the ones compared
        for r in range(args.repeats):
            for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                t0 = time.perf_counter()
                runs[name]()
                best[name] = min(best[name], time.perf_counter() - t0)
    others = others_share(start)
    name = f"seq2seq-generate-{style}-{size}-b{batch}-s{sources.shape[1]}"
    for row, (got, want) in enumerate(zip(tokens["sesame"], tokens["transformers"])):
        if got != want:
            at = next(j for j, (a, b) in enumerate(zip(got + [None], want)) if a != b)
            print(f"  PARITY MISMATCH ({name}, row {row + 1}) at new token {at}: sesame {got[at:at + 5]}, "
                  f"transformers {want[at:at + 5]}", flush=True)
    rate = {impl: batch * args.new_tokens / seconds for impl, seconds in best.items()}
    result = {"bench": name, "ratio": round(rate["sesame"] / rate["transformers"], 3), "style": style, "size": size,
              "batch": batch, "source_tokens": sources.shape[1], "new_tokens": args.new_tokens,
              "sesame_tokens_per_s": float(f"{rate['sesame']:.4g}"),  # 4 digits: a tiny run makes a few a second
              "transformers_tokens_per_s": float(f"{rate['transformers']:.4g}"),
              "parity": tokens["sesame"] == tokens["transformers"], "threads": torch.get_num_threads(),
              "other_processes_cpu_share": None if others is None else round(others, 3)}
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--styles", nargs="+", default=list(SPECIALS), help=f"of {', '.join(SPECIALS)}")
    parser.add_argument("--sizes", nargs="+", default=["mini"], help=f"of {', '.join(SIZES)}")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--source-tokens", nargs="+", type=int, default=[64, 256], help="source lengths")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up; the best counts")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads, both sides")
    parser.add_argument("--vocab-size", type=int, default=32128, help="T5's vocabulary size by default")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        run(args)
    except SesameError as err:
        parser.exit(2, f"error: {err}\n")


def run(args: argparse.Namespace) -> list[dict]:
    """Validate the flags, build each style's and size's pair of models and benchmark every batch and length."""
    for flag, values, known in (("--styles", args.styles, SPECIALS), ("--sizes", args.sizes, SIZES)):
        bad = [v for v in values if v not in known]
        if bad:
            raise SesameError(f"{flag} {' '.join(bad)}: unknown; choose from {', '.join(known)}")
    for flag, value in (("--batches", min(args.batches)), ("--source-tokens", min(args.source_tokens)),
                        ("--new-tokens", args.new_tokens), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value < 1:
            raise SesameError(f"{flag}: must be at least 1")
    if max(args.source_tokens + [args.new_tokens]) > POSITIONS:
        raise SesameError(f"--source-tokens and --new-tokens: at most {POSITIONS} (BART's positions)")
    if args.vocab_size < 4:
        raise SesameError(f"--vocab-size {args.vocab_size}: must be at least 4 (above the special tokens)")
    try:
        import transformers
    except ImportError:
        raise SesameError("this benchmark needs transformers: pip install -e '.[hf]'") from None
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    results = []
    for style in args.styles:
        for size in args.sizes:
            pair = generation_pair(style, size, args.vocab_size, args.seed)
            params = sum(p.numel() for p in pair[1].parameters()) / 1e6
            print(f"{style} {size}: {SIZES[size][0]} + {SIZES[size][0]} layers x {SIZES[size][1]} hidden, "
                  f"{params:.1f}M parameters; {args.threads} torch thread(s)", flush=True)
            for length in args.source_tokens:
                sources = torch.randint(3, args.vocab_size, (max(args.batches), length),
                                        generator=torch.Generator().manual_seed(args.seed))
                for batch in args.batches:
                    results.append(bench(style, size, batch, sources[:batch], pair, args))
    return results


if __name__ == "__main__":
    main()
