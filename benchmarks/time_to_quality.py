"""Time to quality: dev accuracy after N minutes of pre-training with the defaults, next to the scratch twin, TF-IDF
+ logistic regression and MiniLM (issue 36).

For each budget (``--budgets``, minutes of ``sesame pretrain --max-minutes``: 15 and 60 by default, on the CPU; 2, 5
and 10 where a GPU is lent) and each task (airline, SST-2), one run is pre-trained as a user would type it, with no
flag but the budget: ``sesame pretrain --corpus WIKITEXT2_TRAIN GUTENBERG TASK_TRAIN --text-field COLUMN
--max-minutes N``: WikiText-2 train, the Gutenberg books and the task's own training texts (the text column of its
training file; its labels are never read: domain- and task-adaptive pre-training, Gururangan et al. 2020, ULMFiT's
second stage). Then, with 1,000 labels (a seeded random sample of the training file, the same for every row) and
with all of them, each of ``--seeds`` fine-tuning seeds fine-tunes with the defaults:

* ``pretrained``: ``sesame finetune --from RUN --seed S``;
* ``scratch``: the twin, ``--from scratch:RUN`` (the same family, shape, tokenizer and fine-tuning, new weights);
* ``counts``: the counted twin, ``--from counts:RUN``: the scratch twin with the token table a new run of the same
  shards starts from (their PPMI-SVD), so the row says what the training steps added over the counts;
* ``tfidf``: TF-IDF word and character n-grams + logistic regression (``sesame compare``'s baseline; C picked on dev);
* ``minilm``: all-MiniLM-L6-v2 fine-tuned with the defaults, or skipped with the reason when its weights are absent.

Every score is accuracy on the task's dev split. Each stage is recorded in ``OUT/results.json`` as it finishes, so
the command continues where an interrupted one stopped (a pre-training run cut short resumes from its checkpoint).
It writes a Markdown table (mean ± sd over seeds) into ``--markdown`` between its markers and a plot of accuracy
against pre-training minutes beside it.

An ablation (issue 36's short-budget recipe) changes one default with ``--pretrain-option KEY=VALUE`` or
``--finetune-option KEY=VALUE`` (keywords of ``sesame.pretrain``/``finetune``, e.g. ``objective=mlm``) or pre-trains
on the task's texts alone with ``--task-text-only`` (TAPT, Gururangan et al. 2020), in its own
``--out`` (a folder refuses runs made with other changes); its table and plot go to the same page, in a block of
their own named by the changes, so the defaults' and each ablation's rows sit side by side with their commands. A
``--finetune-option`` ablation can fine-tune the very weights another folder pre-trained (``--pretrained-from
FOLDER``, pre-trained there with the same pre-training changes), so that only fine-tuning differs.

    python benchmarks/time_to_quality.py --out runs/ttq            # 15 and 60 minutes: days on 2 cores
    python benchmarks/time_to_quality.py --out runs/ttq-mlm --budgets 15 --pretrain-option objective=mlm
    python benchmarks/time_to_quality.py --out runs/ttq-mlm-mean --budgets 15 --pretrain-option objective=mlm \
        --finetune-option pooling=mean --pretrained-from runs/ttq-mlm
    python benchmarks/time_to_quality.py --out runs/ttq-gpu --budgets 2 5 10 --device cuda
    python benchmarks/time_to_quality.py --out /tmp/ttq --smoke    # the plumbing, not the numbers: minutes

``--smoke`` checks the plumbing only: tiny corpora and task files cut from the real ones, a tiny model, budgets of
seconds and a few fine-tuning steps; its table goes to OUT/time_to_quality.md unless ``--markdown`` says otherwise.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from recorded import mean_sd, open_record, replace_block, stage  # noqa: E402

import sesame  # noqa: E402
from sesame.apps.compare.baselines import tfidf_baseline  # noqa: E402
from sesame.errors import SesameError  # noqa: E402
from sesame.interop import minilm_dir  # noqa: E402
from sesame.pipelines.stages import LabeledFiles  # noqa: E402

APPROACHES = ("pretrained", "scratch", "counts", "tfidf", "minilm")
TWINS = ("pretrained", "scratch", "counts")  # fine-tuned from RUN, scratch:RUN, counts:RUN
SAMPLE_SEED = 0  # the 1,000 labeled rows: one seeded sample of the training file, the same for every approach and seed
ALL = "all"
BLOCK = "time-to-quality"


@dataclass(frozen=True)
class Task:
    name: str
    train: Path
    dev: Path
    text_column: str
    label_column: str

    @property
    def files(self) -> LabeledFiles:
        return LabeledFiles(self.name, str(self.train), str(self.dev), self.text_column, self.label_column)


def tasks(data: Path) -> dict[str, Task]:
    return {"airline": Task("airline", data / "airline/train.csv", data / "airline/dev.csv", "text",
                            "airline_sentiment"),
            "sst2": Task("sst2", data / "glue/SST-2/train.tsv", data / "glue/SST-2/dev.tsv", "sentence", "label")}


def general_corpus(data: Path) -> list[Path]:
    return [data / "wikitext2/train.txt", data / "pretrain/gutenberg"]


def table_format(path: Path) -> dict:
    """The csv module's reading of a CSV (RFC 4180) or a TSV (no quoting) file."""
    return {"delimiter": ","} if path.suffix.lower() == ".csv" else {"delimiter": "\t", "quoting": csv.QUOTE_NONE}


def sample_rows(source: Path, n: int | None, seed: int, dest: Path) -> Path:
    """``dest``: the header and ``n`` data rows of ``source`` drawn at random by ``seed`` (all of them for None),
    in the file's order and format."""
    if not dest.exists():
        fmt = table_format(source)
        with source.open(newline="", encoding="utf-8") as f:
            header, *rows = list(csv.reader(f, **fmt))
        keep = sorted(random.Random(seed).sample(range(len(rows)), n)) if n is not None and n < len(rows) else \
            range(len(rows))
        tmp = dest.with_suffix(dest.suffix + ".tmp")
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n", **fmt)
            writer.writerows([header, *(rows[i] for i in keep)])
        tmp.replace(dest)
    return dest


def minilm_missing() -> str | None:
    """Why MiniLM cannot run here (its weights are not installed), or None."""
    try:
        minilm_dir()
    except SesameError as err:
        return str(err)
    return None


@dataclass(frozen=True)
class Settings:
    """What the benchmark runs: its budgets, labels, seeds, and the flags beyond the defaults (``--smoke``'s)."""
    budgets: tuple[float, ...]
    labels: tuple[int | None, ...]  # None: all
    seeds: int
    pretrain: dict
    finetune: dict
    device: str | None = None


def smoke_inputs(data: Path, out: Path, chosen: dict[str, Task]) -> tuple[list[Path], dict[str, Task]]:
    """Tiny files cut from the real ones: a corpus of a few hundred lines and task files of a few dozen rows."""
    folder = out / "smoke-data"
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "general.txt"
    if not corpus.exists():
        lines = (data / "wikitext2/train.txt").read_text(encoding="utf-8").splitlines()[:400]
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    small = {name: replace(task, train=sample_rows(task.train, 48, 1, folder / f"{name}-train{task.train.suffix}"),
                           dev=sample_rows(task.dev, 24, 2, folder / f"{name}-dev{task.dev.suffix}"))
             for name, task in chosen.items()}
    return [corpus], small


def keyword(pair: str) -> tuple[str, object]:
    """``KEY=VALUE`` as a keyword argument of ``sesame.pretrain``/``finetune``: the value read as JSON where it parses
    (``0.3``, ``true``) and kept as text otherwise (``mlm``, ``auto``)."""
    key, sep, value = pair.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"{pair!r} is not KEY=VALUE with KEY a keyword argument, e.g. objective=mlm")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


SMOKE = {"budgets": (0.05,), "labels": (32, None), "seeds": 2,
         "pretrain": {"size": "tiny", "vocab_size": 300, "seq_len": 32, "batch_size": 8},
         "finetune": {"max_steps": 2, "batch_size": 8, "max_length": 32}}


def check_data(data: Path, chosen: dict[str, Task], *, general: bool) -> None:
    """Exit 2 naming the first input file or folder missing under ``data`` (before anything is written)."""
    needed = [path for task in chosen.values() for path in (task.train, task.dev)]
    for path in [*needed, *(general_corpus(data) if general else [])]:
        if not path.exists():
            print(f"time_to_quality: {path} not found: point --data (or SESAME_DATA) at the shared data folder "
                  "(its README lists the files)", file=sys.stderr)
            raise SystemExit(2)


def run_benchmark(args: argparse.Namespace) -> dict:
    data, out = Path(args.data), Path(args.out)
    chosen = {name: task for name, task in tasks(data).items() if name in args.tasks}
    check_data(data, chosen, general=args.smoke or not args.task_text_only)
    record, results = open_record(out)
    ablation = stage(results, "ablation", record, lambda: {"changes": changes(args)})["changes"]
    if ablation != changes(args):
        print(f"time_to_quality: {out} holds runs made with {ablation or 'the defaults'}, not with "
              f"{changes(args) or 'the defaults'}: give this ablation its own --out", file=sys.stderr)
        raise SystemExit(2)
    pretrain, finetune = dict(args.pretrain_option), dict(args.finetune_option)
    if args.smoke:
        settings = Settings(SMOKE["budgets"], SMOKE["labels"], args.seeds or SMOKE["seeds"],
                            {**SMOKE["pretrain"], **pretrain}, {**SMOKE["finetune"], **finetune}, args.device)
        general, chosen = smoke_inputs(data, out, chosen)
    else:
        general = general_corpus(data)
        labels = tuple(None if n == ALL else int(n) for n in args.labels)
        settings = Settings(tuple(args.budgets), labels, args.seeds or 3, pretrain, finetune, args.device)
    corpus = [] if args.task_text_only else general  # the TAPT ablation: the task's texts alone
    runtime = {"device": settings.device} if settings.device else {}
    missing = minilm_missing() if "minilm" in args.approaches else None
    for task in chosen.values():
        for n in settings.labels:
            label = ALL if n is None else str(n)
            train = sample_rows(task.train, n, SAMPLE_SEED, out / f"{task.name}-train-{label}{task.train.suffix}")
            files = replace(task.files, train=str(train))
            if "tfidf" in args.approaches:
                stage(results, f"{task.name}/{label}/tfidf", record, lambda: {"accuracy": tfidf_baseline(
                    files, SAMPLE_SEED)["dev"]["accuracy"]})
            for seed in range(settings.seeds):
                if "minilm" in args.approaches:
                    stage(results, f"{task.name}/{label}/minilm/seed{seed}", record, lambda: {"skipped": missing} if
                          missing else finetuned("minilm", task, train, out / "minilm" / f"{task.name}-{label}-s{seed}",
                                                 seed, settings, runtime))
        for budget in settings.budgets:
            key, run = f"{task.name}/pretrain/{budget:g}", out / f"pretrained-{task.name}-{budget:g}min"
            if args.pretrained_from:  # a fine-tuning ablation: another folder's pre-trained runs, read only
                run = Path(args.pretrained_from) / run.name
                stage(results, key, record, lambda: borrowed(Path(args.pretrained_from), key, args))
            else:
                stage(results, key, record, lambda: pretrained(corpus, task, run, budget, settings, runtime))
            for n in settings.labels:
                label = ALL if n is None else str(n)
                train = out / f"{task.name}-train-{label}{task.train.suffix}"
                for seed in range(settings.seeds):
                    for twin in TWINS:
                        base = str(run) if twin == "pretrained" else f"{twin}:{run}"
                        if twin in args.approaches:
                            stage(results, f"{task.name}/{label}/{budget:g}/{twin}/seed{seed}", record,
                                  lambda: finetuned(base, task, train, out / twin / f"{task.name}-{budget:g}-{label}"
                                                    f"-s{seed}", seed, settings, runtime))
    write(results, args, settings, chosen)
    return results


def pretrained(corpus: list[Path], task: Task, run: Path, budget: float, settings: Settings, runtime: dict) -> dict:
    """The default pre-training of ``budget`` minutes on the general corpus and the task's training texts, resumed
    when an earlier command was cut short."""
    resume = (run / "config.json").exists()
    if not resume:
        shutil.rmtree(run, ignore_errors=True)  # a setup cut short
    metrics = sesame.pretrain([*map(str, corpus), str(task.train)], str(run), text_field=task.text_column,
                              max_minutes=budget, resume=resume, progress=False, **settings.pretrain, **runtime)
    config = json.loads((run / "config.json").read_text())
    return {"size": config["size"], "loss": metrics.get("loss"), "steps": json.loads(
        (run / "checkpoint/trainer_state.json").read_text())["step"]}


def borrowed(folder: Path, key: str, args: argparse.Namespace) -> dict:
    """What ``folder``'s record says of its pre-training ``key``, when that folder pre-trained with the same changes
    as this ablation; else exit 2 naming what differs."""
    _, theirs = open_record(folder) if (folder / "results.json").is_file() else (None, {})
    made_with = [c for c in theirs.get("ablation", {}).get("changes", []) if not c.startswith("finetune.")]
    wanted = [c for c in changes(args) if not c.startswith("finetune.")]
    if key not in theirs or made_with != wanted:
        why = (f"holds no finished {key}" if key not in theirs else
               f"pre-trained with {made_with or 'the defaults'}, not {wanted or 'the defaults'}")
        print(f"time_to_quality: --pretrained-from {folder}: {why}; run the pre-training there first, or drop "
              "--pretrained-from", file=sys.stderr)
        raise SystemExit(2)
    return {k: v for k, v in theirs[key].items() if k != "minutes"}


def finetuned(base: str, task: Task, train: Path, run: Path, seed: int, settings: Settings, runtime: dict) -> dict:
    """Dev accuracy of ``base`` fine-tuned with the defaults (and ``seed``) on ``train``; a run cut short starts
    again; only its result is kept."""
    shutil.rmtree(run, ignore_errors=True)
    metrics = sesame.finetune(base, str(train), str(task.dev), str(run), text_column=task.text_column,
                              label_column=task.label_column, seed=seed, progress=False, **settings.finetune,
                              **runtime)
    shutil.rmtree(run, ignore_errors=True)
    return {"accuracy": metrics["accuracy"]}


def cell(results: dict, key: Callable[[int], str], seeds: int) -> tuple[float, float, int] | str | None:
    """Mean and sd in % over the seeds recorded under ``key(seed)``, and how many; a skip's reason; None: not run."""
    found = [results[key(s)] for s in range(seeds) if key(s) in results]
    if not found:
        return None
    if "skipped" in found[0]:
        return found[0]["skipped"]
    mean, sd = mean_sd([100 * r["accuracy"] for r in found])
    return mean, sd, len(found)


def shown(value: tuple[float, float, int] | str | None) -> str:
    if value is None:
        return "not run"
    if isinstance(value, str):
        return "skipped"
    mean, sd, n = value
    return f"{mean:.1f} ± {sd:.1f}" + (f" ({n})" if n > 1 else "")


def changes(args: argparse.Namespace) -> list[str]:
    """What an ablation changes from the defaults (``corpus=task``, ``pretrain.KEY=VALUE``, ``finetune.KEY=VALUE``);
    [] for none."""
    def written(value: object) -> str:  # a JSON value (an object, a number) as compact JSON
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    return (["corpus=task"] * args.task_text_only +
            [f"pretrain.{key}={written(value)}" for key, value in args.pretrain_option] +
            [f"finetune.{key}={written(value)}" for key, value in args.finetune_option])


def figure_name(ablation: list[str]) -> str:
    """The plot's file name: ``time_to_quality`` and the ablation's changes, each run of other characters than
    letters, digits, dots and dashes one dash (a JSON option's braces and quotes too)."""
    return re.sub(r"[^\w.-]+", "-", "_".join(["time_to_quality", *ablation])).strip("-") + ".png"


def write(results: dict, args: argparse.Namespace, settings: Settings, chosen: dict[str, Task]) -> None:
    """The Markdown table and the plot, from what ``results`` holds."""
    markdown = Path(args.markdown) if args.markdown else (Path(args.out) / "time_to_quality.md" if args.smoke else
                                                            Path("docs/results/time_to_quality.md"))
    ablation = changes(args)  # an ablation's table and plot sit beside the defaults' on the same page
    figure = markdown.with_name(figure_name(ablation))
    seeds = settings.seeds
    lines = ["```bash", "python benchmarks/time_to_quality.py " + shlex.join(args.argv), "```",
             "", "Dev accuracy in %, mean ± sd over fine-tuning seeds (their number in brackets); budgets are "
             "minutes of `sesame pretrain --max-minutes` on the machine that ran it.", "",
             "| task | labels | pre-training minutes | pre-trained | scratch twin | gain | counted twin | TF-IDF + LR | "
             "MiniLM |", "|---|---|---|---|---|---|---|---|---|"]
    reasons = set()
    for task in chosen:
        for n in settings.labels:
            label = ALL if n is None else str(n)
            tfidf = results.get(f"{task}/{label}/tfidf")
            minilm = cell(results, lambda s: f"{task}/{label}/minilm/seed{s}", seeds)
            if isinstance(minilm, str):
                reasons.add(minilm)
            for budget in settings.budgets:
                twins = {twin: cell(results, lambda s: f"{task}/{label}/{budget:g}/{twin}/seed{s}", seeds)
                         for twin in TWINS}
                gain = (f"{twins['pretrained'][0] - twins['scratch'][0]:+.1f}"
                        if all(isinstance(twins[t], tuple) for t in ("pretrained", "scratch")) else "")
                baseline = "not run" if tfidf is None else f"{100 * tfidf['accuracy']:.1f}"
                lines.append(f"| {task} | {label} | {budget:g} | {shown(twins['pretrained'])} | "
                             f"{shown(twins['scratch'])} | {gain} | {shown(twins['counts'])} | {baseline} | "
                             f"{shown(minilm)} |")
    lines += [f"\nMiniLM skipped: {reason}" for reason in sorted(reasons)]
    lines += ["", f"![time to quality]({figure.name})"]
    plot(results, settings, chosen, figure)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    replace_block(markdown, " ".join([BLOCK, *ablation]), lines)


def plot(results: dict, settings: Settings, chosen: dict[str, Task], figure: Path) -> None:
    """Accuracy against pre-training minutes: a panel per task and number of labels, the twins as lines, TF-IDF and
    MiniLM as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(task, ALL if n is None else str(n)) for task in chosen for n in settings.labels]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5), squeeze=False)
    for ax, (task, label) in zip(axes[0], panels):
        for twin, style in zip(TWINS, ("o-", "s--", "^:")):
            points = [(b, cell(results, lambda s: f"{task}/{label}/{b:g}/{twin}/seed{s}", settings.seeds))
                      for b in settings.budgets]
            points = [(b, v) for b, v in points if isinstance(v, tuple)]
            if points:
                ax.errorbar([b for b, _ in points], [v[0] for _, v in points], yerr=[v[1] for _, v in points],
                            fmt=style, capsize=3, label=twin)
        tfidf = results.get(f"{task}/{label}/tfidf")
        if tfidf:
            ax.axhline(100 * tfidf["accuracy"], color="gray", linestyle=":", label="TF-IDF + LR")
        minilm = cell(results, lambda s: f"{task}/{label}/minilm/seed{s}", settings.seeds)
        if isinstance(minilm, tuple):
            ax.axhline(minilm[0], color="green", linestyle="-.", label="MiniLM")
        ax.set_title(f"{task}, {label} labels")
        ax.set_xlabel("pre-training minutes")
        ax.set_ylabel("dev accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the benchmark's folder: its runs and results.json")
    p.add_argument("--data", default=os.environ.get("SESAME_DATA", "../shared/data"))
    p.add_argument("--budgets", type=float, nargs="+", default=[15, 60], help="pre-training minutes")
    p.add_argument("--labels", nargs="+", default=["1000", ALL], help="labeled rows fine-tuned on (all: every row)")
    p.add_argument("--seeds", type=int, default=None, help="fine-tuning seeds (default 3; 2 with --smoke)")
    p.add_argument("--tasks", nargs="+", default=["airline", "sst2"], choices=["airline", "sst2"])
    p.add_argument("--approaches", nargs="+", default=list(APPROACHES), choices=APPROACHES)
    p.add_argument("--device", help="sesame's --device (default: its own choice)")
    p.add_argument("--pretrain-option", action="append", default=[], type=keyword, metavar="KEY=VALUE",
                   help="a keyword of sesame.pretrain beyond the defaults, for an ablation (e.g. objective=mlm, "
                        "size=auto; repeatable)")
    p.add_argument("--task-text-only", action="store_true",
                   help="an ablation: pre-train on the task's training texts alone, without WikiText-2 and the books "
                        "(task-adaptive pre-training, Gururangan et al. 2020)")
    p.add_argument("--finetune-option", action="append", default=[], type=keyword, metavar="KEY=VALUE",
                   help="a keyword of sesame.finetune beyond the defaults, for an ablation (repeatable)")
    p.add_argument("--pretrained-from", metavar="FOLDER",
                   help="fine-tune another benchmark folder's pre-trained runs instead of pre-training again (a "
                        "--finetune-option ablation on the very same weights; FOLDER must have pre-trained with the "
                        "same --pretrain-option and --task-text-only changes); they are read, never written")
    p.add_argument("--markdown", help="the page the table goes to (default docs/results/time_to_quality.md; with "
                                      "--smoke, OUT/time_to_quality.md)")
    p.add_argument("--smoke", action="store_true", help="tiny data, model and budgets: checks the plumbing")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.argv = argv  # the command the page shows
    return run_benchmark(args)


if __name__ == "__main__":
    main()
