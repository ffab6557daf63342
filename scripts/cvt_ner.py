"""Cross-view training on CoNLL-2003 NER: a share of the training sentences labeled, the rest as unlabeled text.

Clark et al. 2018 ("Semi-Supervised Sequence Modeling with Cross-View Training") train a BiLSTM tagger
on labeled sentences and, on alternate steps, teach auxiliary modules that see restricted views of
unlabeled sentences to match the full model. Here ``--labeled`` of the CoNLL-2003 training sentences
(drawn with ``--seed``) keep their tags; the others lose them and become the unlabeled text. Two runs
on the same ``scratch:bilstm:SIZE`` backbone, word tokenizer (trained once on all training sentences,
no dev text), labeled data and number of labeled epochs:

* ``supervised``: the same tagger (CVT's primary module, ``--task-option head=mlp``) on the labeled
  sentences alone;
* ``cvt``: the same with ``--task-option cvt_unlabeled=...`` (twice the trainer steps: every other
  one is an unlabeled batch).

Each run is its own directory under ``--out``; an interrupted run continues with ``--resume``, a
finished one is read from ``OUT/results.json``. Writes ``OUT/results.json`` and ``OUT/results.md``
(dev entity F1 and token accuracy of the kept epoch, minutes).

    nice -n 19 env PYTHONPATH=. python scripts/cvt_ner.py --out runs/cvt_ner --labeled 0.1 --size mini --epochs 20
"""
from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

from recorded import open_record, stage

import sesame
from sesame.tasks import make_task
from sesame.tokenizer import train_tokenizer

RUNS = ["supervised", "cvt"]


def split(train: str, share: float, seed: int, vocab_size: int, out: Path) -> tuple[int, int]:
    """Write ``out/labeled.txt`` (CoNLL ``word tag`` columns) and ``out/unlabeled.txt`` (one sentence per
    line, tags dropped) from the training file; returns their sentence counts."""
    rows = make_task("tag").read(train)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n = max(1, round(share * len(rows)))
    labeled, unlabeled = [rows[i] for i in order[:n]], [rows[i] for i in order[n:]]
    (out / "labeled.txt").write_text("".join("".join(f"{w} {t}\n" for w, t in zip(r["words"], r["tags"])) + "\n"
                                             for r in labeled), encoding="utf-8")
    (out / "unlabeled.txt").write_text("".join(r["text"] + "\n" for r in unlabeled), encoding="utf-8")
    if not (out / "tokenizer.json").exists():  # trained once: both runs share one vocabulary
        train_tokenizer([r["text"] for r in rows], "word", vocab_size).save(out / "tokenizer.json")
    return len(labeled), len(unlabeled)


def run(base: str, name: str, out: Path, dev: str, args: argparse.Namespace, options: dict) -> dict:
    """Fine-tune one run, resuming its directory if an earlier call stopped part-way."""
    folder = out / name
    resume = (folder / "checkpoint" / "trainer_state.json").exists()
    if folder.exists() and not resume:
        shutil.rmtree(folder)  # stopped before its first checkpoint: start over
    return sesame.finetune(base, str(out / "labeled.txt"), dev, str(folder), task="tag", task_options=options,
                           tokenizer=str(out / "tokenizer.json"), epochs=args.epochs, batch_size=args.batch_size,
                           lr=args.lr, dropout=args.dropout, max_length=128, resume=resume, progress=args.progress,
                           seed=args.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/conll2003")
    parser.add_argument("--out", default="runs/cvt_ner")
    parser.add_argument("--labeled", type=float, default=0.1, help="share of the training sentences kept labeled")
    parser.add_argument("--seed", type=int, default=0, help="picks the labeled sentences; also the training seed")
    parser.add_argument("--size", default="mini", help="scratch:bilstm:SIZE (tiny, mini, small, medium, base)")
    parser.add_argument("--epochs", type=int, default=20, help="labeled epochs, the same for both runs")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per labeled and per unlabeled batch")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--vocab-size", type=int, default=20000, help="the word tokenizer's (words seen twice or more)")
    parser.add_argument("--runs", nargs="+", default=RUNS, choices=RUNS, help="which of the two runs to do now")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args()
    if not 0 < args.labeled < 1:
        parser.error(f"--labeled {args.labeled}: give a share between 0 and 1, e.g. 0.1")
    out, data = Path(args.out), Path(args.data)
    record, results = open_record(out)
    n_labeled, n_unlabeled = split(str(data / "train.txt"), args.labeled, args.seed, args.vocab_size, out)
    base, dev = f"scratch:bilstm:{args.size}", str(data / "valid.txt")
    settings = {k: v for k, v in vars(args).items() if k not in ("progress", "runs")}
    if {k: v for k, v in results.get("settings", settings).items() if k in settings} != settings:
        raise SystemExit(f"{record} holds results for other settings ({results['settings']}); use another --out")
    results["settings"] = {**settings, "labeled_sentences": n_labeled, "unlabeled_sentences": n_unlabeled}
    options = {"supervised": {"head": "mlp"}, "cvt": {"cvt_unlabeled": str(out / "unlabeled.txt")}}
    for name in args.runs:
        stage(results, name, record, lambda: run(base, name, out, dev, args, options[name]))
    write(results, out, base)


def write(results: dict, out: Path, base: str) -> None:
    s = results["settings"]
    lines = [f"# Cross-view training on CoNLL-2003 NER ({base})", "",
             f"{s['labeled_sentences']} labeled training sentences ({100 * s['labeled']:g}%, seed {s['seed']}); "
             f"the other {s['unlabeled_sentences']} as unlabeled text for CVT. {s['epochs']} labeled epochs, batch "
             f"{s['batch_size']}, lr {s['lr']:g}, dropout {s['dropout']:g}; the epoch with the best dev F1 kept. "
             "Dev = CoNLL-2003 valid.txt, conlleval entity F1.", "",
             "| run | dev entity F1 | dev token accuracy | minutes |", "|---|---|---|---|"]
    for name in RUNS:
        r = results.get(name)
        lines.append(f"| {name} | {100 * r['f1']:.2f} | {100 * r['accuracy']:.2f} | {r['minutes']:.1f} |" if r
                     else f"| {name} | ? | ? | ? |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
