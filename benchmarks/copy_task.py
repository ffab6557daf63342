"""Can an encoder-decoder learn to copy? sesame's and transformers' model, from the same weights, trained side by side
on the simplest task that needs the source: the target is the source (``<s>`` random tokens ``</s>``).

A decoder that reads its encoder drives the loss towards 0; one that does not stays near the entropy of the
tokens, ln(``--tokens``). Both sides get the same batches, AdamW at ``--lr`` and no schedule, so their curves should
agree (they start from the same function, :func:`encoder_decoder_pair.build_pair`); where both stall, the stall is
the optimisation's, not sesame's wiring. The loss is each side's mean cross-entropy per target token.
``--embedding-std`` redraws the shared token table, which is also the tied output layer, on both sides alike: BART
starts it N(0, 0.02), T5 N(0, 1). ``--weight-init xavier`` draws sesame's model with that ``weight_init`` (every
linear weight of its stacks from Glorot & Bengio's uniform distribution instead of N(0, 0.02)) and gives
transformers' model the same weights.

    python benchmarks/copy_task.py --style bart --steps 1000
    python benchmarks/copy_task.py --style bart --tokens 20 --length 8 --steps 1000 --embedding-std 1
    python benchmarks/copy_task.py --style bart --tokens 20 --length 8 --steps 1000 --weight-init xavier
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from encoder_decoder_pair import SPECIALS, build_pair  # noqa: E402

from sesame.interop.encoder_decoder import export_weights  # noqa: E402
from sesame.models.encoder_decoder import WEIGHT_INITS, EncoderDecoder  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--style", choices=("t5", "bart"), default="bart")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tokens", type=int, default=190, help="distinct random tokens (default 190)")
    parser.add_argument("--length", type=int, default=24, help="random tokens per row (default 24)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--every", type=int, default=200, help="print the losses every this many steps")
    parser.add_argument("--embedding-std", type=float,
                        help="redraw the shared token table (also the tied output layer) N(0, this) on both sides "
                             "(default: the style's initialisation, BART's 0.02)")
    parser.add_argument("--weight-init", choices=WEIGHT_INITS, default="normal",
                        help="sesame's weight_init for both sides (default normal: N(0, 0.02), as both styles')")
    args = parser.parse_args(argv)

    specials = SPECIALS[args.style]
    ours, theirs = build_pair(args.style, vocab_size=4000, hidden=128, layers=2, heads=2, intermediate=512,
                              max_positions=128, dropout=0.0, seed=0)
    if args.weight_init != "normal":
        torch.manual_seed(0)
        try:
            config = replace(ours.config, weight_init=args.weight_init)
        except ValueError as err:  # e.g. xavier for T5's rescaled start
            parser.error(f"--weight-init {args.weight_init}: {err}")
        ours.load_state_dict(EncoderDecoder(config).state_dict())
        theirs.load_state_dict(export_weights(args.style, ours.state_dict(), ours), strict=False)
    if args.embedding_std is not None:
        draw = torch.Generator().manual_seed(1)
        table = torch.randn(ours.embed.tokens.weight.shape, generator=draw) * args.embedding_std
        with torch.no_grad():
            for weight in (ours.embed.tokens.weight, theirs.get_input_embeddings().weight):
                weight.copy_(table)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=args.lr) for m in (ours, theirs)]
    print(json.dumps({"style": args.style, "chance": round(math.log(args.tokens), 4), **vars(args)}))
    for step in range(args.steps + 1):
        g = torch.Generator().manual_seed(step)
        body = torch.randint(10, 10 + args.tokens, (args.batch_size, args.length), generator=g)
        rows = torch.cat([torch.full((args.batch_size, 1), specials.cls), body,
                          torch.full((args.batch_size, 1), specials.sep)], 1)
        memory = ours.encode(rows, None)
        logits = ours.readout(ours.decode(ours.decoder_inputs(rows), memory)) @ ours.output_weight.T
        losses = [F.cross_entropy(logits.flatten(0, 1), rows.flatten()),
                  theirs(input_ids=rows, attention_mask=torch.ones_like(rows), labels=rows).loss]
        for optimizer, loss in zip(optimizers, losses):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step % args.every == 0:
            print(json.dumps({"step": step, "sesame": round(losses[0].item(), 4),
                              "transformers": round(losses[1].item(), 4)}), flush=True)


if __name__ == "__main__":
    main()
