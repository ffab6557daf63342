"""Pre-train BART from another start: its token table (also the tied output layer) drawn N(0, ``--embedding-std``)
instead of BART's N(0, 0.02), and/or its stacks' linear weights drawn from Glorot & Bengio's uniform distribution
(``--weight-init xavier``, as ``torch.nn.Transformer`` draws them) instead of N(0, 0.02), and/or its layers
pre-LayerNorm (``--norm pre``: ``x + f(LN(x))`` and a final LayerNorm on each stack, as mBART (Liu et al. 2020)
arranges BART's layers, and as Xiong et al. (2020) show trains without the long warmup post-LN needs; the residual
output projections then start N(0, 0.02/√(2·layers)), as in every sesame pre-norm stack): ablations, for the
collapse of short BART pre-training (docs/results/encoder-decoders.md).

Every other argument goes to ``sesame pretrain --family bart``; the run's config.json records the ``embedding_std``,
``weight_init`` and ``norm`` it was built with, so it loads, resumes and fine-tunes as any bart run (a pre-norm one
does not convert to transformers' BART, which is post-norm). Read it with ``scripts/source_use.py``.

    python scripts/bart_init.py --embedding-std 1 --size mini --corpus ../shared/data/wikitext2/train.txt \\
        --valid ../shared/data/wikitext2/valid.txt --max-steps 200 --out runs/bart-std1
    python scripts/bart_init.py --weight-init xavier --size mini --corpus ../shared/data/wikitext2/train.txt \\
        --valid ../shared/data/wikitext2/valid.txt --max-steps 200 --out runs/bart-xavier
    python scripts/bart_init.py --norm pre --size mini --corpus ../shared/data/wikitext2/train.txt \\
        --valid ../shared/data/wikitext2/valid.txt --max-steps 200 --out runs/bart-pre
"""
from __future__ import annotations

import argparse
import sys

from sesame.cli import main as sesame_main
from sesame.families import get_family
from sesame.models.encoder_decoder import WEIGHT_INITS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embedding-std", type=float, help="the token table's initial std (BART: 0.02)")
    parser.add_argument("--weight-init", choices=WEIGHT_INITS, help="the stacks' linear weights (BART: normal)")
    parser.add_argument("--norm", choices=("post", "pre"), help="where the layers' LayerNorms sit (BART: post)")
    args, rest = parser.parse_known_args(argv)
    if args.embedding_std is None and args.weight_init is None and args.norm is None:
        parser.error("give --embedding-std, --weight-init, --norm or several")
    if args.embedding_std is not None and args.embedding_std <= 0:
        parser.error(f"--embedding-std {args.embedding_std}: must be positive")
    # the family row's model options are the ones every bart backbone is built from (sesame.families)
    options = get_family("bart").model_options
    for name in ("embedding_std", "weight_init", "norm"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return sesame_main(["pretrain", "--family", "bart", *rest])


if __name__ == "__main__":
    sys.exit(main())
