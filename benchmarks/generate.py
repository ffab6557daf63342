"""Greedy generation speed: sesame's ``decode`` against transformers' ``generate``, with and without the KV cache.

Both sides hold the same weights: a randomly initialised transformers ``GPT2LMHeadModel`` at sesame's
gpt2 sizes (``--sizes``: layers x hidden from ``sesame.families.SIZES``, hidden/64 heads, feed-forward
4 x hidden, 1024 positions, GPT-2's default ``gelu_new``) is saved with a byte-level BPE tokenizer
(trained by ``sesame.tokenizer.train_tokenizer`` on the first ``--tokenizer-lines`` lines of
``--train``, or ``--tokenizer FILE``, a sesame bpe tokenizer.json) and converted by
``sesame.interop.from_hf``. The prompts are the first lines of ``--test`` with at least
``--prompt-tokens`` tokens, each read as the start of a document (sesame's separator, then its
tokens) and cut to exactly ``--prompt-tokens`` tokens, so a batch needs no padding. Both sides get the
same token ids and decode greedily; the tokenizer is not timed.

* sesame: ``sesame.generation.decode`` with ``GenerationConfig(max_new_tokens, cache=...)``.
* transformers: ``model.generate(do_sample=False, use_cache=...)`` without an end-of-text token, so it
  always generates ``--new-tokens`` tokens. (``min_new_tokens`` would also force the length, but by
  banning the end token, which changes the greedy tokens.)

sesame's ``decode`` has no switch to ignore its end-of-text token (the separator): a batch stops once
every row has produced it. The benchmark counts the steps it actually ran (tokens/s = batch x steps /
seconds) and says so when that is fewer than ``--new-tokens``.

Each of the four contenders (sesame and transformers, cache on and off) runs once as a warm-up, then
``--repeats`` rounds alternate between them (the order flips every round); the best time counts.
Throughput counts generated tokens of all rows. Parity: the greedy tokens of the first prompt (of
every prompt, in fact) must be identical on both sides, cache or not; a mismatch is printed loudly.

Each result records the share of the machine's CPUs that other processes used while it ran; compare
ratios from the same run only.

    python benchmarks/generate.py        # mini and small, batch 1 and 8: roughly 15-25 minutes on 2 cores
    python benchmarks/generate.py --sizes tiny --new-tokens 16 --batches 1 2 --repeats 1   # a quick check
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_step_timing import cpu_clock, others_share  # noqa: E402

from sesame.errors import SesameError  # noqa: E402
from sesame.families import SIZES  # noqa: E402
from sesame.decoding import GenerationConfig  # noqa: E402
from sesame.generation import decode  # noqa: E402
from sesame.interop import from_hf  # noqa: E402
from sesame.language_model import LanguageModel  # noqa: E402
from sesame.tokenizer import SPECIAL_TOKENS, TextTokenizer, train_tokenizer  # noqa: E402

POSITIONS = 1024
IMPLS = [("sesame", True), ("sesame", False), ("transformers", True), ("transformers", False)]


def get_tokenizer(args: argparse.Namespace) -> TextTokenizer:
    """``--tokenizer``, or a byte-level BPE trained on the first ``--tokenizer-lines`` lines of ``--train``."""
    if args.tokenizer:
        tok = TextTokenizer.load(args.tokenizer)
        if tok.kind != "bpe":
            raise SesameError(f"--tokenizer {args.tokenizer}: a {tok.kind} tokenizer; GPT-2 needs byte-level bpe "
                              "(`sesame tokenizer train --kind bpe`)")
        return tok
    with open(args.train, encoding="utf-8") as f:
        lines = [line for line in islice(f, args.tokenizer_lines) if line.strip()]
    return train_tokenizer(lines, "bpe", vocab_size=args.vocab_size)


def build_pair(size: str, tok: TextTokenizer, folder: Path, seed: int) -> tuple[LanguageModel, torch.nn.Module]:
    """A random ``GPT2LMHeadModel`` saved in ``folder/hf`` and its sesame conversion in ``folder/run``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, hidden = SIZES[size]
    specials = tok.specials
    config = GPT2Config(vocab_size=tok.backend.get_vocab_size(), n_embd=hidden, n_layer=layers, n_head=hidden // 64,
                        n_inner=4 * hidden, n_positions=POSITIONS, bos_token_id=specials.cls,
                        eos_token_id=specials.sep, pad_token_id=specials.pad)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder / "hf")
    tok.save(folder / "hf" / "tokenizer.json")
    names = SPECIAL_TOKENS["bpe"]  # sesame's own role names: the import renames and appends nothing
    roles = {"pad_token": names["pad"], "unk_token": names["unk"], "bos_token": names["cls"],
             "cls_token": names["cls"], "eos_token": names["sep"], "sep_token": names["sep"],
             "mask_token": names["mask"]}
    (folder / "hf" / "tokenizer_config.json").write_text(json.dumps(roles))
    from_hf(folder / "hf", folder / "run")
    lm = LanguageModel.load(folder / "run")
    if lm.backbone.embed.tokens.weight.shape[0] != config.vocab_size:
        raise AssertionError("the conversion changed the vocabulary size")
    model.generation_config.eos_token_id = None  # never stop early (see the module docstring)
    return lm, model


def read_prompts(lm: LanguageModel, path: Path, length: int, count: int) -> torch.Tensor:
    """The first ``count`` lines of ``path`` with at least ``length`` tokens (the separator included), cut there."""
    prompts: list[list[int]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ids = lm.encode([line.strip()])[0]
                if len(ids) >= length:
                    prompts.append(ids[:length])
                    if len(prompts) == count:
                        return torch.tensor(prompts)
    raise SesameError(f"--test {path}: only {len(prompts)} lines have {length} tokens, {count} needed; "
                      "lower --prompt-tokens or the largest of --batches")


def sesame_run(lm: LanguageModel, prompts: torch.Tensor, new_tokens: int, cache: bool) -> list[list[int]]:
    """Greedy tokens per row from sesame's ``decode``, the end token included where a row stopped there."""
    cfg = GenerationConfig(max_new_tokens=new_tokens, cache=cache)
    out = decode(lm, prompts.tolist(), cfg)
    return [c.ids + ([lm.end] if c.finish == "end" else []) for c in out]


def transformers_run(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int, cache: bool,
                     pad: int) -> list[list[int]]:
    """Greedy tokens per row from transformers' ``generate``: always ``new_tokens`` of them."""
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                         do_sample=False, num_beams=1, use_cache=cache, pad_token_id=pad)
    return out[:, prompts.shape[1]:].tolist()


def bench(size: str, batch: int, lm: LanguageModel, model: torch.nn.Module, prompts: torch.Tensor,
          args: argparse.Namespace) -> list[dict]:
    """Warm-up, then ``--repeats`` alternating rounds of the four contenders; a result dict per contender."""
    def contender(impl: str, cache: bool) -> Callable[[], list[list[int]]]:
        if impl == "sesame":
            return lambda: sesame_run(lm, prompts, args.new_tokens, cache)
        return lambda: transformers_run(model, prompts, args.new_tokens, cache, lm.tokenizer.specials.pad)

    runs = {(impl, cache): contender(impl, cache) for impl, cache in IMPLS}
    best = {key: float("inf") for key in runs}
    tokens: dict[tuple[str, bool], list[list[int]]] = {}
    start = cpu_clock()
    with torch.inference_mode():
        for key, fn in runs.items():
            tokens[key] = fn()  # warm-up; its tokens are the ones compared
        for r in range(args.repeats):
            for key in IMPLS if r % 2 == 0 else IMPLS[::-1]:
                t0 = time.perf_counter()
                runs[key]()
                best[key] = min(best[key], time.perf_counter() - t0)
    others = others_share(start)
    check_parity(size, batch, tokens, model, prompts)
    results = []
    for (impl, cache), seconds in best.items():
        steps = max(map(len, tokens[impl, cache]))
        result = {"bench": "generate", "size": size, "batch": batch, "impl": impl, "cache": cache,
                  "prompt_tokens": prompts.shape[1], "new_tokens": steps, "seconds": round(seconds, 4),
                  "tokens_per_s": round(batch * steps / seconds, 1), "threads": torch.get_num_threads(),
                  "other_processes_cpu_share": None if others is None else round(others, 3)}
        if steps < args.new_tokens:
            print(f"  note: {impl} stopped after {steps} of {args.new_tokens} tokens (every row reached "
                  "end-of-text)")
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def check_parity(size: str, batch: int, tokens: dict[tuple[str, bool], list[list[int]]], model: torch.nn.Module,
                 prompts: torch.Tensor) -> None:
    """Every contender's greedy tokens must equal transformers' with the cache (cut where sesame stopped).
    A mismatch is printed with transformers' logit gap between the two tokens there: a random model's
    logits are close together, so a gap near float rounding (~1e-5) is a near-tie, not a wrong result."""
    reference = tokens["transformers", True]
    for (impl, cache), rows in tokens.items():
        for i, (got, want) in enumerate(zip(rows, reference)):
            at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
            if at is not None:
                with torch.inference_mode():
                    logits = model(torch.tensor([prompts[i].tolist() + want[:at]])).logits[0, -1]
                print(f"  PARITY MISMATCH ({size}, batch {batch}, prompt {i + 1}): {impl} cache={cache} differs from "
                      f"transformers cache=True at new token {at}: {got[at:at + 5]} vs {want[at:at + 5]} "
                      f"(transformers' logit gap {float(logits[want[at]] - logits[got[at]]):.2e})", flush=True)
                break
    same = all(rows[0] == reference[0][: len(rows[0])] for rows in tokens.values())
    print(f"  parity ({size}, batch {batch}, first prompt, {len(tokens['sesame', True][0])} tokens): "
          f"{'identical greedy tokens on all four' if same else 'MISMATCH (see above)'}", flush=True)


def summary(results: list[dict]) -> None:
    """sesame/transformers throughput ratios and each side's cache speed-up, per size and batch."""
    rate = {(r["size"], r["batch"], r["impl"], r["cache"]): r["tokens_per_s"] for r in results}
    print("\n| size | batch | sesame cache | sesame no cache | transformers cache | transformers no cache "
          "| sesame/transformers cache | no cache | cache speed-up sesame | transformers |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size, batch in dict.fromkeys((r["size"], r["batch"]) for r in results):
        s, s0, t, t0 = (rate[size, batch, impl, cache] for impl, cache in IMPLS)
        print(f"| {size} | {batch} | {s:.0f} | {s0:.0f} | {t:.0f} | {t0:.0f} | {s / t:.2f}x | {s0 / t0:.2f}x "
              f"| {s / s0:.2f}x | {t / t0:.2f}x |")
    print("(tokens/s of generated tokens, all rows; best of the repeats)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["mini", "small"], help=f"of {', '.join(SIZES)}")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=64, help="prompt length, the leading separator included")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up; the best counts")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads, both sides")
    parser.add_argument("--train", type=Path, default=Path("../shared/data/wikitext2/train.txt"))
    parser.add_argument("--test", type=Path, default=Path("../shared/data/wikitext2/test.txt"))
    parser.add_argument("--tokenizer", type=Path, help="a sesame bpe tokenizer.json (default: train one)")
    parser.add_argument("--tokenizer-lines", type=int, default=20000)
    parser.add_argument("--vocab-size", type=int, default=16000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        run(args)
    except SesameError as err:
        parser.exit(2, f"error: {err}\n")


def run(args: argparse.Namespace) -> list[dict]:
    """Validate the flags, build each size's pair of models and benchmark every batch size."""
    bad = [s for s in args.sizes if s not in SIZES]
    if bad:
        raise SesameError(f"--sizes {' '.join(bad)}: unknown; choose from {', '.join(SIZES)}")
    for flag, value in (("--batches", min(args.batches)), ("--prompt-tokens", args.prompt_tokens - 1),
                        ("--new-tokens", args.new_tokens), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value < 1:
            raise SesameError(f"{flag}: must be at least {2 if flag == '--prompt-tokens' else 1}")
    if args.prompt_tokens + args.new_tokens > POSITIONS:
        raise SesameError(f"--prompt-tokens + --new-tokens = {args.prompt_tokens + args.new_tokens}: the models "
                          f"have {POSITIONS} positions")
    for flag, path in (("--train", args.train if not args.tokenizer else None), ("--test", args.test)):
        if path is not None and not path.is_file():
            raise SesameError(f"{flag} {path}: no such file")
    try:
        import transformers
    except ImportError:
        raise SesameError("this benchmark needs transformers: pip install -e '.[hf]'") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    tok = get_tokenizer(args)
    print(f"tokenizer: byte-level BPE, {tok.backend.get_vocab_size()} tokens; {args.threads} torch thread(s)",
          flush=True)
    results: list[dict] = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            lm, model = build_pair(size, tok, Path(tmp), args.seed)
        prompts = read_prompts(lm, args.test, args.prompt_tokens, max(args.batches))
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"{size}: {SIZES[size][0]} layers x {SIZES[size][1]} hidden, {params:.1f}M parameters", flush=True)
        for batch in args.batches:
            results += bench(size, batch, lm, model, prompts[:batch], args)
    summary(results)
    return results


if __name__ == "__main__":
    main()
