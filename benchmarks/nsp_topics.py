"""Next-sentence prediction on documents of distinct topics, for each start of the token embeddings and several seeds.

The corpus of the NSP property test (tests/test_documents.py): eight topics of six made-up words; each document's
sentences are eight words drawn from its topic's six and a full stop, so a negative partner (a sentence of another
document) shares the topic one time in eight and the best accuracy is about 94%. For each ``--starts`` × ``--seeds``,
BERT-tiny (a 120-id vocabulary, 32-token windows) pre-trains ``--steps`` steps with MLM + NSP from that start of its
token embeddings (``--embedding-init``) and is scored on held-out documents every ``--eval-every`` steps. The table
gives the last NSP accuracy and the first evaluation at which it passed 0.8: NSP sits at chance for a while before
the pooler learns to compare the two segments' topics, and how long it sits there depends on the seed. Each run is
recorded in ``OUT/results.json`` as it finishes, so the command continues where an interrupted one stopped.

    python benchmarks/nsp_topics.py --out runs/nsp-topics    # 2 starts x 8 seeds x 300 steps: 10-20 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from recorded import open_record, stage  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sesame  # noqa: E402

TOPICS = [[f"{a}{b}" for b in ("ra", "lo", "mi", "ne", "ku", "so")]
          for a in ("ba", "de", "fi", "go", "hu", "ja", "ke", "po")]
PASSED = 0.8


def topic_documents(n_docs: int, rng: np.random.Generator) -> str:
    """``n_docs`` documents of 12 sentences, document d drawing its words from topic d mod 8, blank-line separated."""
    docs = []
    for d in range(n_docs):
        words = TOPICS[d % len(TOPICS)]
        docs.append("\n".join(" ".join(rng.choice(words, 8)) + " ." for _ in range(12)))
    return "\n\n".join(docs) + "\n"


def write_corpus(folder: Path) -> tuple[Path, Path]:
    """The test's training (160 documents) and held-out (32) files, drawn in that order from seed 0."""
    rng = np.random.default_rng(0)
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text(topic_documents(160, rng))
    valid.write_text(topic_documents(32, rng))
    return train, valid


def pretrain_one(folder: Path, train: Path, valid: Path, *, start: str, seed: int, steps: int, eval_every: int) -> dict:
    """One pre-training; its last NSP accuracy and masked-LM loss, and the first evaluated step past :data:`PASSED`."""
    run = folder / f"{start}-seed{seed}"
    last = sesame.pretrain([str(train)], str(run), family="bert", size="tiny", vocab_size=120, seq_len=32,
                           valid=[str(valid)], max_steps=steps, eval_every=eval_every, seed=seed,
                           embedding_init=start, progress=False)
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["split"] == "dev"]
    passed = next((e["step"] for e in evals if e["nsp_accuracy"] > PASSED), None)
    return {"nsp_accuracy": last["nsp_accuracy"], "mlm_loss": last["mlm_loss"], "passed_at": passed}


def table(results: dict, starts: list[str], seeds: list[int]) -> list[str]:
    """Markdown: one row per seed, one column per start: accuracy in % (the step it passed 0.8, or never)."""
    lines = ["| seed | " + " | ".join(f"`{s}`" for s in starts) + " |", "|---|" + "---|" * len(starts)]
    for seed in seeds:
        cells = []
        for start in starts:
            r = results.get(f"{start}-seed{seed}")
            passed = f"step {r['passed_at']}" if r and r["passed_at"] else "never"
            cells.append("not run" if r is None else f"{100 * r['nsp_accuracy']:.1f} ({passed})")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder of the runs and results.json (continued if it exists)")
    parser.add_argument("--starts", nargs="+", default=["random", "ppmi"], choices=["random", "ppmi"])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(8)))
    parser.add_argument("--steps", type=int, default=300, help="pre-training steps (the property test's: 300)")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a tiny model runs fastest on one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = Path(args.out)
    record, results = open_record(folder)
    train, valid = write_corpus(folder)
    for seed in args.seeds:
        for start in args.starts:
            stage(results, f"{start}-seed{seed}", record,
                  lambda: pretrain_one(folder, train, valid, start=start, seed=seed, steps=args.steps,
                                       eval_every=args.eval_every))
    print("\n".join(table(results, args.starts, args.seeds)))
    return results


if __name__ == "__main__":
    main()
