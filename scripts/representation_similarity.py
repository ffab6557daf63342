"""Detect representation collapse: how alike are a pretrained run's token vectors, layer by layer?

Encodes the first lines of a text file with a ``pretrained`` run and prints, for the embeddings and
every layer, the mean pairwise cosine similarity of the token vectors (real tokens only, across all
lines). Near 0 means diverse representations; near 1 means every token looks the same (collapse).

    python scripts/representation_similarity.py --model runs/real/bert-mini --text ../shared/data/wikitext2/test.txt
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from sesame.run import load_backbone, load_tokenizer
from sesame.tasks.classify import collate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--lines", type=int, default=32)
    args = parser.parse_args()
    run = Path(args.model)
    backbone = load_backbone(run)
    tok = load_tokenizer(run, "--model")
    lines = [l for l in Path(args.text).read_text().splitlines() if len(l.split()) > 5][: args.lines]
    batch = collate(tok.encode(lines, max_length=64), tok.specials.pad)
    with torch.no_grad():
        layers = backbone(batch["ids"], padding=batch["padding"], all_layers=True)
    for depth, hidden in enumerate(layers):
        vectors = F.normalize(hidden[batch["padding"]], dim=-1)
        cos = vectors @ vectors.t()
        n = len(vectors)
        mean = (cos.sum() - n) / (n * (n - 1))
        print(f"{'embeddings' if depth == 0 else f'layer {depth}':<12} mean pairwise cosine {mean:.5f}")


if __name__ == "__main__":
    main()
