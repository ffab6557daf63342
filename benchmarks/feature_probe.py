"""Frozen-feature probe: how well a pre-trained backbone's hidden states separate a task's classes, without fine-tuning.

For each run (a pretrained run directory; ``scratch:RUN`` for the same shape and tokenizer with random weights,
seeded; or ``counts:RUN`` for those random weights with the token embeddings a new run of RUN's corpus starts from,
its shards' PPMI-SVD, as ``--embedding-init ppmi`` sets them: what the counts give before any pre-training), every
text of ``--train`` and ``--dev`` is read as the tokenizer's single-text template gives it (cut to ``--max-length``
tokens) and pooled four ways: the first position of the last layer ([CLS] for BERT-style encoders), the mean of the
last layer over the real tokens, the mean of the embeddings' output (the token table, with positions, before any
layer), and the means of every layer (the embeddings' output first) side by side, as ELMo's scalar mix would read
them (Peters et al. 2018, Eq. 1, without the learned weights).
Each pooling is standardised on the training rows and fitted by logistic regression, with the inverse
regularisation of :data:`C_GRID` that scores best on dev (so, like ``sesame compare``'s TF-IDF baseline, whose grid
is picked the same way, the dev score is slightly optimistic). Dense features of a few hundred dimensions fitted on
a thousand rows want stronger regularisation than TF-IDF's sparse ones, hence a grid of its own.

This is a diagnostic, not a user's number: the linear probe of Alain & Bengio (2016), which asks whether
pre-training put what a task needs into the features. It has no fine-tuning seeds, so it separates two
pre-trainings with less noise than fine-tuning's scores do (a twin from scratch fine-tuned at 1,000 labels
spread over 15 points across three seeds in docs/results/time_to_quality.md).

    python benchmarks/feature_probe.py --train runs/ttq/airline-train-1000.csv --dev ../shared/data/airline/dev.csv \\
        --text-column text --label-column airline_sentiment --runs scratch:RUN RUN

prints a Markdown table (dev accuracy in %) and, with ``--json FILE``, writes the figures.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sesame.errors import SesameError  # noqa: E402
from sesame.models import EncoderDecoder  # noqa: E402
from sesame.pipelines.stages import LabeledFiles  # noqa: E402
from sesame.pipelines.starts import counted_table  # noqa: E402
from sesame.run import build_backbone, load_backbone, load_tokenizer  # noqa: E402
from sesame.sources import resolve_source  # noqa: E402
from sesame.tasks.base import pad  # noqa: E402
from sesame.tasks.classify import collate  # noqa: E402
from sesame.tokenizer import TextTokenizer  # noqa: E402
from sesame.train.checkpoint import write_json  # noqa: E402

POOLINGS = ("first", "mean", "mean of the embeddings", "mean of every layer")
C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)  # logistic regression's inverse regularisation, picked on dev
BATCH = 64


def backbone_of(name: str, seed: int) -> tuple[torch.nn.Module, TextTokenizer]:
    """The backbone ``name`` names and its tokenizer: a run's with its weights, its shape with random ones seeded by
    ``seed`` (``scratch:RUN``), or those with the counted token table (``counts:RUN``: sesame.sources)."""
    source = resolve_source(name, "--runs")
    if not source.scratch:
        return load_backbone(name, "--runs"), load_tokenizer(name, "--runs")
    if source.config is None:
        raise SesameError(f"--runs {name}: a probe twins a run; write scratch:RUN or counts:RUN with its directory")
    torch.manual_seed(seed)
    backbone, tokenizer = build_backbone(source.config).eval(), load_tokenizer(source.path, "--runs")
    if source.counted:
        counted_table(backbone, source.config, tokenizer, progress=False)
    return backbone, tokenizer


@torch.no_grad()
def pooled(backbone: torch.nn.Module, tokenizer: TextTokenizer, texts: list[str], max_length: int) -> dict[str, np.ndarray]:
    """Each of :data:`POOLINGS` of every text's hidden states, one row per text."""
    out: dict[str, list[torch.Tensor]] = {p: [] for p in POOLINGS}
    for first in range(0, len(texts), BATCH):
        encodings = tokenizer.encodings(texts[first: first + BATCH])
        batch = collate([e.ids[:max_length] for e in encodings], tokenizer.specials.pad)
        ids, real, types = batch["ids"], batch["padding"], pad([e.type_ids[:max_length] for e in encodings], 0)
        layers = (backbone.encoder_layers(ids, real) if isinstance(backbone, EncoderDecoder) else
                  backbone(ids, types=types, padding=real, all_layers=True))
        weights = real[..., None].float() / real.sum(1)[:, None, None]
        means = [(h.float() * weights).sum(1) for h in layers]
        out["first"].append(layers[-1][:, 0].float())
        out["mean"].append(means[-1])
        out["mean of the embeddings"].append(means[0])
        out["mean of every layer"].append(torch.cat(means, -1))
    return {p: torch.cat(rows).numpy() for p, rows in out.items()}


def probe(train: tuple[dict, list], dev: tuple[dict, list]) -> dict[str, float]:
    """Dev accuracy of logistic regression on each pooling (standardised on train; C from :data:`C_GRID`, best on
    dev, the smallest on ties)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    (x_train, y_train), (x_dev, y_dev) = train, dev
    scores = {}
    for pooling in POOLINGS:
        scale = StandardScaler().fit(x_train[pooling])
        a, b = scale.transform(x_train[pooling]), scale.transform(x_dev[pooling])
        scores[pooling] = max(LogisticRegression(C=c, max_iter=3000).fit(a, y_train).score(b, y_dev) for c in C_GRID)
    return scores


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label")
    p.add_argument("--runs", nargs="+", required=True, help="pretrained runs; scratch:RUN for its random twin; "
                                                            "counts:RUN for that twin with the counted token table")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="a scratch twin's random weights")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.max_length < 1:
        p.error(f"--max-length {args.max_length}: give a positive number of tokens")
    task = LabeledFiles("probe", args.train, args.dev, args.text_column, args.label_column)
    try:
        rows = {split: task.read(path) for split, path in (("train", args.train), ("dev", args.dev))}
        results = {}
        for name in args.runs:
            backbone, tokenizer = backbone_of(name, args.seed)
            train, dev = ((pooled(backbone, tokenizer, [r["text"] for r in rows[s]], args.max_length),
                           [r["label"] for r in rows[s]]) for s in ("train", "dev"))
            results[name] = probe(train, dev)
            print(f"{name}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in results[name].items()), file=sys.stderr)
    except SesameError as err:
        print(f"feature_probe: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print("| run | " + " | ".join(POOLINGS) + " |\n|---|" + "---|" * len(POOLINGS))
    for name, scores in results.items():
        print(f"| {name} | " + " | ".join(f"{100 * scores[p]:.1f}" for p in POOLINGS) + " |")
    if args.json:
        write_json(Path(args.json), results)
    return results


if __name__ == "__main__":
    main()
