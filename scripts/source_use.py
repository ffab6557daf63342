"""Does a pre-trained encoder-decoder read its source? Its objective's loss on validation text, with each row's own
corrupted input, with another row's, and with the clean text, for a ``t5`` or ``bart`` run.

A decoder that reads the encoder scores its targets better from the row's own input than from another row's
(T5's spans are in no other row; BART's clean text is mostly in its own noised input). Equal losses mean the
decoder has learned only the targets' own statistics, whatever the encoder says. Also printed: how much the
encoder's states vary across the positions of one input (their standard deviation over positions, averaged over
the hidden units), after the embeddings and after each layer, for the run and for a fresh model of the same config;
a collapsed encoder says the same thing at every position, and the layer where the spread goes shows where.

    python scripts/source_use.py runs/compare-20min/pretrain/bart-mini --valid ../shared/data/wikitext2/valid.txt
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from sesame.objectives import build_objective
from sesame.objectives.base import Objective
from sesame.run import build_backbone, load_backbone, load_tokenizer, read_config
from sesame.tokenizer import TextTokenizer

Batch = dict[str, torch.Tensor]


def valid_batch(objective: Objective, tokenizer: TextTokenizer, *, path: str, rows: int, chars: int,
                seq_len: int) -> Batch:
    """The objective's batch of the first ``rows`` windows of the first ``chars`` characters of ``path``, row ``i``
    corrupted by a generator seeded ``i``; ValueError when the text is too short."""
    with open(path, encoding="utf-8") as fh:
        ids = torch.tensor(tokenizer.encode([fh.read(chars)], special=False)[0])
    length = objective.window_length(seq_len)
    if len(ids) < rows * length:
        raise ValueError(f"{len(ids)} tokens in the first {chars:,} characters, fewer than {rows} windows of {length}")
    windows = ids[: rows * length].view(rows, length)
    return objective.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(rows)])


def source_losses(loss_sum: Callable[[Batch], torch.Tensor], batch: Batch, *, pad: int, clean: bool
                  ) -> dict[str, float]:
    """The loss per target token of ``batch``'s targets (``loss_sum``: a model's summed loss of a batch) read from
    each row's own corrupted input, from another row's, and where ``clean`` (BART, whose targets are the clean text
    framed as its inputs are) from the clean text."""
    sources = {"own corrupted input": batch["ids"], "another row's input": batch["ids"].roll(1, 0)}
    if clean:
        sources["the clean text"] = batch["targets"]
    count = int((batch["targets"] != pad).sum())
    with torch.no_grad():
        return {name: float(loss_sum({"ids": source, "padding": source != pad, "targets": batch["targets"]})) / count
                for name, source in sources.items()}


def spreads(states: Sequence[torch.Tensor]) -> str:
    """Each of ``states`` (positions × hidden, one row's) as its standard deviation over the positions, averaged
    over the hidden units."""
    return ", ".join(f"{float(h.std(0).mean()):.4f}" for h in states)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a pre-trained t5 or bart run")
    parser.add_argument("--valid", required=True, help="validation text")
    parser.add_argument("--rows", type=int, default=16, help="windows scored (default 16)")
    parser.add_argument("--chars", type=int, default=200_000, help="characters of --valid read (default 200,000)")
    args = parser.parse_args(argv)

    config = read_config(args.run, "run")
    tokenizer = load_tokenizer(args.run, "run")
    model = load_backbone(args.run, "run").eval()
    objective = build_objective(config.pretrained.objective, model, tokenizer, config.pretrained.objective_options)
    try:
        batch = valid_batch(objective, tokenizer, path=args.valid, rows=args.rows, chars=args.chars,
                            seq_len=config.pretrained.seq_len)
    except ValueError as err:
        parser.error(f"--valid: {err}; give more --chars or fewer --rows")
    losses = source_losses(objective, batch, pad=tokenizer.specials.pad,
                           clean=config.pretrained.objective == "denoising")
    for name, loss in losses.items():
        print(f"loss per target token, {name}: {loss:.4f}")
    fresh = build_backbone(config).eval()
    with torch.no_grad():
        for name, backbone in (("this run", model), ("a fresh model", fresh)):
            ids = batch["ids"][:1]
            layers = backbone.encoder_layers(ids)
            print(f"encoder states' spread over positions, {name}: {float(layers[-1][0].std(0).mean()):.4f} "
                  f"(embeddings, then each layer: {spreads([h[0] for h in layers])})")


if __name__ == "__main__":
    main()
