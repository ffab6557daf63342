"""Whether a masked LM learns a rule from context, by how its selected tokens are corrupted: a toy where each
token follows from its neighbours (windows counting up through 8 ordinary tokens, as tests/test_electra.py's), so
the unigram's loss is ln 8 = 2.08 and one that reads its neighbours goes to 0. A 2-layer Transformer of width 32
(1 head, as ELECTRA's generator of that width has), AdamW at 3e-3, batches of 16 windows of 30 tokens; each row
prints the masked-LM loss (averaged over 20 steps) at a few steps:

    python benchmarks/masking_toy.py --marks 300 600 1000 1500 3000

Rows: BERT's masked LM (80% [MASK], 10% random, 10% unchanged); the same with every selected token [MASK] (§2 of
ELECTRA); with 85% [MASK] and 15% unchanged (ELECTRA's released code); and ELECTRA's generator (same width, λ = 50
with its discriminator) with ``unchanged`` 0 and 0.15. The reading: docs/results/time_to_quality.md's ELECTRA
section.
"""
from __future__ import annotations

import argparse

import torch

from sesame.models import Transformer, TransformerConfig
from sesame.objectives.electra import Electra
from sesame.objectives.masking import mask_rows
from sesame.objectives.mlm import MaskedLM
from sesame.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
CONFIG = TransformerConfig(vocab_size=60, hidden=32, layers=2, heads=1, intermediate=64, max_positions=64,
                           dropout=0.0)
MLM_SHARES = {"mlm 80/10/10": (0.8, 0.1), "mlm all [MASK]": (1.0, 0.0), "mlm 85% [MASK], 15% unchanged": (0.85, 0.0)}


def windows(step: int, n: int = 16, length: int = 30) -> torch.Tensor:
    starts = torch.randint(0, 8, (n, 1), generator=torch.Generator().manual_seed(step))
    return (starts + torch.arange(length)) % 8 + 5


class SharesMLM(MaskedLM):
    """BERT's masked LM with its [MASK] and random shares of the selected tokens set (the rest stay)."""

    def __init__(self, mask_frac: float, random_frac: float):
        super().__init__(Transformer(CONFIG), SPECIALS)
        self.mask_frac, self.random_frac = mask_frac, random_frac

    def corrupt_rows(self, ids: torch.Tensor, generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_rows(ids, self.special_ids, self.specials.mask, self.pool, generators, rate=self.rate,
                         mask_frac=self.mask_frac, random_frac=self.random_frac)


def losses(model: torch.nn.Module, steps: int) -> list[float]:
    """The masked-LM loss of each step (ELECTRA: its generator's, trained with λ·L_Disc beside it)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    found = []
    for step in range(steps):
        batch = model.make_batch(windows(step), [torch.Generator().manual_seed(16 * step + i) for i in range(16)])
        out = model(batch)
        mlm = (out["mlm"] if isinstance(out, dict) else out) / batch["masked"]
        total = mlm + 50.0 * out["disc"] / batch["ids"].numel() if isinstance(out, dict) and "disc" in out else mlm
        total.backward()
        opt.step()
        opt.zero_grad()
        found.append(mlm.item())
    return found


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--marks", type=int, nargs="+", default=[300, 600, 1000, 1500],
                        help="the steps whose loss (the mean of the 20 before, or fewer) is printed; runs to the last")
    args = parser.parse_args(argv)
    print("| corruption | " + " | ".join(f"step {m}" for m in args.marks) + " |")
    print("|---" * (len(args.marks) + 1) + "|")
    rows = {name: (lambda shares=shares: SharesMLM(*shares)) for name, shares in MLM_SHARES.items()}
    rows |= {f"electra generator, unchanged={u}": (lambda u=u: Electra(Transformer(CONFIG), SPECIALS,
                                                                        generator_fraction=1.0, unchanged=u))
             for u in (0.0, 0.15)}
    table = {}
    for name, build in rows.items():
        torch.manual_seed(0)
        found = losses(build(), max(args.marks))
        table[name] = [sum(found[max(0, m - 20):m]) / len(found[max(0, m - 20):m]) for m in args.marks]
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in table[name]) + " |", flush=True)
    return table


if __name__ == "__main__":
    main()
