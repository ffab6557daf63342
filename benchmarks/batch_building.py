"""CPU time to build one training batch, per pre-training objective: what `sesame pretrain`'s loop calls each step
(`window_batches`: reading the windows, NSP's partners, the generators, `make_batch`), timed with
`time.process_time` after one warm-up batch, on a prepared shard directory (`sesame prepare`).

    python benchmarks/batch_building.py --corpus SHARDS --batch-size 128 --steps 10

The encoder objectives (mlm, mlm_nsp, mlm_sop, electra, distilbert's weighted masking) run around one small
Transformer; the span families (spanbert, bart, xlnet, t5) build their objective as `sesame pretrain --family F
--size tiny` does, from the family's row (its backbone, its objective's options), on the shards' own tokenizer
(whatever its kind: a batch's cost is in its ids and word starts). bart_noise is bart with its optional noising on
as well (:data:`BART_NOISE`). t5 needs a tokenizer with sentinels (`sesame tokenizer train --sentinels 100`).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from sesame.data.shards import Shards
from sesame.data.windows import training_windows, window_batches
from sesame.families import backbone_config, get_family
from sesame.models import Transformer, TransformerConfig, build_model
from sesame.objectives import OBJECTIVES, Objective
from sesame.objectives.masking import smoothed_weights
from sesame.run import load_tokenizer
from sesame.tokenizer import TextTokenizer
from sesame.train import TrainConfig

ENCODER_OBJECTIVES = ("mlm", "mlm_nsp", "mlm_sop", "electra", "distilbert")  # distilbert: mlm with its weighted masking
SPAN_FAMILIES = ("spanbert", "bart", "xlnet", "t5")  # built from their family rows, at --size tiny
# bart's row with token masking, token deletion and document rotation on too (Lewis et al. 2020, §2.2: rates of ours)
BART_NOISE = {"token_mask_ratio": 0.1, "delete_ratio": 0.1, "rotate_ratio": 0.5}
OBJECTIVE_NAMES = ENCODER_OBJECTIVES + SPAN_FAMILIES + ("bart_noise",)


def objective(name: str, shards: Shards, tok: TextTokenizer, seq_len: int) -> tuple[Objective, dict]:
    """The objective ``name`` of :data:`OBJECTIVE_NAMES` on the shards' tokenizer, and its options."""
    if name in SPAN_FAMILIES or name == "bart_noise":
        family = get_family(name.removesuffix("_noise"))
        options = {**family.objective_options, **(BART_NOISE if name == "bart_noise" else {})}
        backbone = build_model(backbone_config(family.name, "tiny", tok.vocab_size, tok.specials.pad,
                                               specials=tok.specials))
        return OBJECTIVES[family.objective].build(backbone, tok, **options), options
    backbone = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=128, layers=2, heads=2,
                                             intermediate=512, max_positions=seq_len))
    obj = OBJECTIVES["mlm" if name == "distilbert" else name].build(backbone, tok)
    if name == "distilbert":
        counts = sum(np.bincount(tokens, minlength=tok.vocab_size) for tokens in shards.arrays)
        obj.token_weights = smoothed_weights(torch.from_numpy(counts), 0.7, obj.special_ids)
    return obj, {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a shard directory with its tokenizer")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--objectives", nargs="+", default=OBJECTIVE_NAMES, choices=OBJECTIVE_NAMES)
    args = parser.parse_args(argv)
    shards, tok = Shards(args.corpus), load_tokenizer(args.corpus, "--corpus")
    if "t5" in args.objectives and not len(tok.sentinels()):
        parser.error(f"--objectives t5: the tokenizer of {args.corpus} has no sentinels; prepare the shards with one "
                     "that has (sesame tokenizer train --sentinels 100), or leave t5 out")
    for name in args.objectives:
        obj, options = objective(name, shards, tok, args.seq_len)
        length = obj.window_length(args.seq_len, **options)
        windows, _, _ = training_windows(shards, None, length=length, seq_len=args.seq_len)
        batches = window_batches(obj, shards, [(length, windows)], TrainConfig(batch_size=args.batch_size, seed=0))
        batches(0, 0.0)
        start = time.process_time()
        for step in range(1, args.steps + 1):
            batches(step, 0.0)
        per_batch = 1000 * (time.process_time() - start) / args.steps
        print(f"{name:10s} {per_batch:7.1f} ms CPU per batch of {args.batch_size}", flush=True)


if __name__ == "__main__":
    main()
