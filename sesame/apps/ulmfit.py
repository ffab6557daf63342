"""``sesame ulmfit``: Universal Language Model Fine-tuning (Howard & Ruder 2018) as one resumable pipeline.

Three stages, each a run directory under ``out``:

    general-lm/     (a) general-domain LM pre-training (§3.1): an AWD-LSTM (family ``ulmfit``) trained as a
                        language model on a large corpus (WikiText-103 in the paper; WikiText-2 here) with
                        variable-length BPTT (:class:`sesame.objectives.clm.AwdLM`); skipped with ``lm=RUN``
    target-texts/   the task's training texts (and dev texts) as JSON Lines, one document per text, and
                        their token shards under (a)'s tokenizer
    target-lm/      (b) target-task LM fine-tuning (§3.2): (a) continued on the task's training texts with
                        discriminative fine-tuning (η^{l−1} = η^l / 2.6, eq. 2) and slanted triangular
                        learning rates (eq. 3, cut_frac 0.1, ratio 32); validated on the dev texts
    classifier/     (c) target-task classifier fine-tuning (§3.3): (b)'s LM under concat pooling
                        [h_T; maxpool(H); meanpool(H)] and two batch-norm/dropout/linear blocks, with gradual
                        unfreezing (head alone in epoch 1, one more layer group per epoch), discriminative
                        rates and STLR; the epoch with the best dev accuracy is kept

A stage is finished once its record (``compare.json``, the record of a :mod:`sesame.compare` cell: its
settings and measurements) is written; a finished stage is reused, an unfinished one resumed from its
checkpoint, or started afresh when it has none. A stage's settings include the records of the stages it
builds on, so changing an earlier stage's settings is refused rather than mixed with old later stages.

Hyperparameters follow §4: batch 64, BPTT 70, a base rate of 0.004 for fine-tuning the LM and 0.01 for
the classifier, dropouts of the ``ulmfit`` family row. Deviations: the word vocabulary is the general
corpus's, kept for the target task (the paper adds the target task's new words, initialised at the mean
embedding); AdamW with the trainer's betas (the paper: Adam with β1 = 0.7, β2 = 0.99); the general LM
trains for a wall-time budget with the family's recipe (linear decay), not to convergence; texts longer
than ``max_length`` tokens are cut (no BPT3C, §3.3); one direction only (no backward LM ensemble, §3.3).
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Sequence

from .. import api
from .compare import NO_STEP_CAP, Task, check_task, duration, run_cell, trainer_state
from ..data.shards import Shards, prepare_corpus
from ..errors import SesameError
from ..families import get_family, get_size
from ..objectives import OBJECTIVES
from ..rundir import load_tokenizer, read_config
from ..tokenizer import extend_words
from ..train.checkpoint import checkpoint_dir, read_json, write_json

FAMILY = "ulmfit"
DISCRIMINATIVE = 2.6  # §3.2: η^{l−1} = η^l / 2.6
CUT_FRAC = 0.1  # STLR's cut_frac (§3.2, eq. 3; its ratio 32 is TrainConfig.stlr_ratio's default)
# gradual unfreezing reaches "all" in the epoch that unfreezes the last of the 5 layer groups (embeddings,
# 3 LSTM layers, head), so the classifier trains for at least that many epochs
MIN_CLASSIFIER_EPOCHS = 5
STAGES = ("general-lm", "target-lm", "classifier")
UNFREEZING = ("classifier: head only", "classifier: unfreeze last 1", "classifier: unfreeze last 2")
COLUMNS = ("stage", "epochs", "time", "train loss", "dev loss", "dev accuracy")


def _evaluations(run: Path) -> list[dict]:
    """One row per dev evaluation in ``run``'s metrics.jsonl, in order: its metrics (``dev``), the mean
    training loss logged since the evaluation before (``train_loss``, None when none was logged) and the
    seconds the run had spent (``seconds``, setup included)."""
    rows, losses = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["split"] == "train":
            losses.append(record["loss"])
        elif record["split"] == "dev":
            rows.append({"dev": record, "train_loss": sum(losses) / len(losses) if losses else None,
                         "seconds": record["elapsed"]})
            losses = []
    return rows


def _lm_record(run: Path) -> dict:
    state = trainer_state(run)
    return {"steps": state["step"], "seconds": round(state["elapsed"], 3), "dev": state["last_eval"]}


def _write_texts(rows: list[dict], path: Path) -> None:
    """The texts of ``rows`` as JSON Lines (one document each), rewritten only when they changed, so the
    shards made from the file (keyed by its modification time) stay valid."""
    text = "".join(json.dumps({"text": row["text"]}, ensure_ascii=False) + "\n" for row in rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _target_shards(task: Task, lm: Path, folder: Path, length: int, new_words: int, progress: bool
                   ) -> tuple[Shards, Shards]:
    """The task's training and dev texts as token shards, each checked to hold at least one window of
    ``length`` tokens, under the LM's tokenizer extended with the training texts' words (seen twice or
    more, at most ``new_words``; §3.2: the LM is fine-tuned on the target vocabulary). Continuing the LM
    on these shards starts each new word at the mean embedding (:func:`sesame.api.pretrain`)."""
    tok, _ = extend_words(load_tokenizer(lm, "--lm"), (row["text"] for row in task.read(task.train)), new_words)
    shards = []
    for split, path in (("train", task.train), ("dev", task.dev)):
        _write_texts(task.read(path), folder / f"{split}.jsonl")
        made = prepare_corpus([folder / f"{split}.jsonl"], tok, folder / f"{split}-shards", progress=progress)
        if not made.windows(length):
            raise SesameError(f"--{split} {path}: its texts hold {made.n_tokens} tokens, fewer than one window of "
                              f"{length}; lower --seq-len")
        shards.append(made)
    return shards[0], shards[1]


def _table(general: Path, target: Path, classifier: Path) -> list[dict]:
    """The table's rows: the general LM (when its run is at hand), the fine-tuned LM (its last epoch), and
    the classifier after epochs 1, 2, 3 (head only, then one more layer group each) and after the last. The
    general LM's epochs are passes over its training windows (unknown, None, when its shards are gone)."""
    rows = []

    def add(stage: str, epochs: float | int, evaluation: dict, accuracy: float | None) -> None:
        rows.append({"stage": stage, "epochs": epochs, "seconds": round(evaluation["seconds"], 3),
                     "train_loss": evaluation["train_loss"], "dev_loss": evaluation["dev"]["loss"],
                     "dev_accuracy": accuracy})

    if (general / "metrics.jsonl").is_file() and checkpoint_dir(general) and _evaluations(general):
        config, state = read_json(general / "config.json"), trainer_state(general)
        shards = Path(config.shards)
        windows = len(Shards(shards).windows(OBJECTIVES[config.objective].window_length(config.seq_len))) \
            if shards.is_dir() else 0
        passes = round(state["step"] * state["config"]["batch_size"] / windows, 2) if windows else None
        add("general-domain LM", passes, _evaluations(general)[-1], None)
    add("fine-tune LM", len(_evaluations(target)), _evaluations(target)[-1], None)
    epochs = _evaluations(classifier)
    for i, name in enumerate(UNFREEZING):
        add(name, i + 1, epochs[i], epochs[i]["dev"]["accuracy"])
    add("classifier: all", len(epochs), epochs[-1], epochs[-1]["dev"]["accuracy"])
    return rows


def _cells(row: dict) -> list[str]:
    def number(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    return [row["stage"], "—" if row["epochs"] is None else f"{row['epochs']:g}", duration(row["seconds"]),
            "—" if row["train_loss"] is None else f"{row['train_loss']:.4f}", number(row["dev_loss"]),
            number(row["dev_accuracy"])]


def markdown(rows: list[dict]) -> str:
    """The table as Markdown: stage | epochs | time | train loss | dev loss | dev accuracy."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(_cells(r)) + " |" for r in rows]) + "\n"


def _say(stage: str, record: dict, reused: bool) -> None:
    what = f"dev accuracy {record['dev']['accuracy']:.4f}" if "accuracy" in record["dev"] else \
        f"{record['steps']:,} steps, dev loss {record['dev']['loss']:.4f}"
    print(f"{stage:<11} {what} in {duration(record['seconds'])}{'  (reused)' if reused else ''}", file=sys.stderr,
          flush=True)


def ulmfit(train: str, dev: str, out: str, corpus: Sequence[str] | None = None, valid: Sequence[str] | None = None,
           lm: str | None = None, text_column: str = "text", label_column: str = "label", size: str = "mini",
           vocab_size: int = 30000, seq_len: int = 70, lm_minutes: float | None = 60.0, lm_steps: int | None = None,
           target_epochs: int = 4, classifier_epochs: int = MIN_CLASSIFIER_EPOCHS, lm_lr: float = 4e-3,
           classifier_lr: float = 1e-2, batch_size: int = 64, max_length: int = 128, dropout: float = 0.4,
           seed: int = 0, progress: bool = True) -> dict:
    """Run ULMFiT's three stages (module docstring) into ``out``, resuming or reusing what is there; write
    ``results.md`` and ``results.json`` there and return ``{"rows": [...], "records": {stage: record}}``.

    (a) pre-trains on ``corpus`` (validated on ``valid``, else the corpus's last 1%) for ``lm_minutes`` of
    wall time (``lm_steps`` caps the steps too; give only ``lm_steps`` for a run that repeats exactly), unless
    ``lm`` names a pretrained ulmfit run to start from; (b) fine-tunes it for ``target_epochs`` on the texts
    of ``train`` at ``lm_lr``; (c) fine-tunes the classifier for ``classifier_epochs`` (at least 5) at
    ``classifier_lr`` on ``train``'s ``text_column`` → ``label_column``, evaluated on ``dev``.
    """
    if (corpus is None) == (lm is None):
        raise SesameError("--corpus or --lm: give one (a general-domain corpus to pre-train on, or a pretrained "
                          "ulmfit run to start from)")
    if corpus is not None:
        get_size(size)
        if lm_minutes is None and lm_steps is None:
            raise SesameError("--lm-minutes or --lm-steps: give the general-domain LM a budget")
    for flag, value in (("--lm-minutes", lm_minutes), ("--lm-steps", lm_steps), ("--target-epochs", target_epochs),
                        ("--lm-lr", lm_lr), ("--classifier-lr", classifier_lr), ("--batch-size", batch_size)):
        if value is not None and value <= 0:
            raise SesameError(f"{flag} {value}: must be positive")
    if classifier_epochs < MIN_CLASSIFIER_EPOCHS:
        raise SesameError(f"--classifier-epochs {classifier_epochs}: use at least {MIN_CLASSIFIER_EPOCHS}, so gradual "
                          "unfreezing reaches all layer groups (head, 3 LSTM layers, embeddings)")
    for flag, path in (("--train", train), ("--dev", dev)):
        if not Path(path).is_file():
            raise SesameError(f"{flag} {path}: no such file; give a labeled CSV, TSV or JSONL file")
    task = Task("target", train, dev, text_column, label_column)
    check_task(task)  # columns, two labels or more, no dev label unseen in training
    out_dir = Path(out)
    general, target, classifier = (out_dir / name for name in STAGES)
    records: dict[str, dict] = {}
    if lm is not None:
        config = read_config(lm, "--lm", ("pretrained",))
        if config.family != FAMILY:
            raise SesameError(f"--lm {lm}: a {config.family} run; ULMFiT starts from a pretrained ulmfit run")
        base, origin = Path(lm), {"lm": str(Path(lm).resolve())}
    else:
        corpus_paths = [str(Path(p).resolve()) for p in corpus]
        valid_paths = [str(Path(p).resolve()) for p in valid] if valid else None

        def pretrain(resume: bool) -> dict:
            api.pretrain(corpus_paths, str(general), family=FAMILY, size=size, vocab_size=vocab_size, seq_len=seq_len,
                         valid=valid_paths, resume=resume, progress=progress, max_minutes=lm_minutes,
                         max_steps=lm_steps or NO_STEP_CAP, batch_size=batch_size, seed=seed)
            return _lm_record(general)

        records[STAGES[0]], reused = run_cell(general, {
            "stage": STAGES[0], "corpus": corpus_paths, "valid": valid_paths, "size": size, "vocab_size": vocab_size,
            "seq_len": seq_len, "minutes": lm_minutes, "max_steps": lm_steps, "batch_size": batch_size,
            "seed": seed}, pretrain)
        _say(STAGES[0], records[STAGES[0]], reused)
        base, origin = general, records[STAGES[0]]

    def fine_tune_lm(resume: bool) -> dict:
        length = OBJECTIVES[get_family(FAMILY).objective].window_length(seq_len)
        texts, dev_texts = _target_shards(task, base, out_dir / "target-texts", length, vocab_size, progress)
        per_epoch = math.ceil(len(texts.windows(length)) / batch_size)
        api.pretrain([str(texts.path)], str(target), family=FAMILY, size=read_config(base, "--lm", ("pretrained",))
                     ["size"], seq_len=seq_len, valid=[str(dev_texts.path)], resume=resume, progress=progress,
                     base=str(base), discriminative=DISCRIMINATIVE, schedule="stlr", warmup=CUT_FRAC, lr=lm_lr,
                     max_steps=target_epochs * per_epoch, eval_every=per_epoch, save_every=per_epoch,
                     batch_size=batch_size, seed=seed)
        return {**_lm_record(target), "epochs": target_epochs}

    records[STAGES[1]], reused = run_cell(target, {
        "stage": STAGES[1], "from": origin, "task": {"train": str(Path(train).resolve()),
                                                     "dev": str(Path(dev).resolve()), "text_column": text_column},
        "seq_len": seq_len, "epochs": target_epochs, "lr": lm_lr, "batch_size": batch_size, "seed": seed,
        "new_words": vocab_size}, fine_tune_lm)
    _say(STAGES[1], records[STAGES[1]], reused)

    def fine_tune_classifier(resume: bool) -> dict:
        dev_metrics = api.finetune(str(target), train, dev, str(classifier), task="classify", text_column=text_column,
                                   label_column=label_column, max_length=max_length, epochs=classifier_epochs,
                                   dropout=dropout, resume=resume, progress=progress, discriminative=DISCRIMINATIVE,
                                   gradual_unfreezing=True, schedule="stlr", warmup=CUT_FRAC, lr=classifier_lr,
                                   cycles=classifier_epochs,
                                   batch_size=batch_size, seed=seed)
        return {"epochs": classifier_epochs, "seconds": round(trainer_state(classifier)["elapsed"], 3),
                "dev": {k: v for k, v in dev_metrics.items() if isinstance(v, (int, float))}}

    records[STAGES[2]], reused = run_cell(classifier, {
        "stage": STAGES[2], "from": records[STAGES[1]], "task": {**task.columns, "train": str(Path(train).resolve()),
                                                                 "dev": str(Path(dev).resolve())},
        "epochs": classifier_epochs, "lr": classifier_lr, "batch_size": batch_size, "max_length": max_length,
        "dropout": dropout, "seed": seed}, fine_tune_classifier)
    _say(STAGES[2], records[STAGES[2]], reused)

    rows = _table(base, target, classifier)
    write_json(out_dir / "results.json", {"rows": rows, "records": records})
    (out_dir / "results.md").write_text(f"# ULMFiT: {train} → {dev}\n\n" + markdown(rows))
    return {"rows": rows, "records": records}


# -- command line ----------------------------------------------------------------------------------

def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``ulmfit`` to the ``sesame`` subcommands."""
    default = {name: param.default for name, param in inspect.signature(ulmfit).parameters.items()}
    p = subparsers.add_parser("ulmfit", help="ULMFiT's three stages, resumable: general LM, target LM, classifier "
                                             "(docs/ulmfit.md)")
    p.add_argument("--train", required=True, help="labeled training file (CSV, TSV or JSONL)")
    p.add_argument("--dev", required=True, help="labeled dev file")
    p.add_argument("--text-column", default=default["text_column"])
    p.add_argument("--label-column", default=default["label_column"])
    p.add_argument("--corpus", nargs="+", help="general-domain text to pre-train on (e.g. WikiText-2's train.txt)")
    p.add_argument("--valid", nargs="+", help="its validation text (default: the corpus's last 1%%)")
    p.add_argument("--lm", help="a pretrained ulmfit run to start from instead of --corpus (skips stage a)")
    p.add_argument("--out", required=True, help="directory of the three stages and the results; rerun to resume")
    p.add_argument("--size", default=default["size"], help="with --corpus: tiny, mini, small, medium or base "
                                                           "(default %(default)s)")
    p.add_argument("--vocab-size", type=int, default=default["vocab_size"],
                   help="words in the general vocabulary (with --corpus), and at most as many of the task's words added "
                        "to it for the target LM (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=default["seq_len"], help="BPTT length (default %(default)s)")
    p.add_argument("--lm-minutes", type=float, default=default["lm_minutes"],
                   help="general-domain LM: wall-time budget (default %(default)s)")
    p.add_argument("--lm-steps", type=int, help="general-domain LM: also stop at this many steps")
    p.add_argument("--target-epochs", type=int, default=default["target_epochs"],
                   help="target-task LM fine-tuning epochs (default %(default)s)")
    p.add_argument("--classifier-epochs", type=int, default=default["classifier_epochs"],
                   help=f"classifier epochs, at least {MIN_CLASSIFIER_EPOCHS} (default %(default)s)")
    p.add_argument("--lm-lr", type=float, default=default["lm_lr"],
                   help="peak rate of target LM fine-tuning (default %(default)s)")
    p.add_argument("--classifier-lr", type=float, default=default["classifier_lr"],
                   help="peak rate of the classifier (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=default["batch_size"], help="all stages (default %(default)s)")
    p.add_argument("--max-length", type=int, default=default["max_length"],
                   help="classifier: tokens per text (default %(default)s)")
    p.add_argument("--dropout", type=float, default=default["dropout"],
                   help="classifier: output and head dropout (default %(default)s)")
    p.add_argument("--seed", type=int, default=default["seed"])
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def run(args: argparse.Namespace) -> None:
    """``sesame ulmfit``: run the pipeline, then print the table (or its rows as JSON)."""
    result = ulmfit(args.train, args.dev, args.out, args.corpus, args.valid, args.lm, args.text_column,
                    args.label_column, args.size, args.vocab_size, args.seq_len, args.lm_minutes, args.lm_steps,
                    args.target_epochs, args.classifier_epochs, args.lm_lr, args.classifier_lr, args.batch_size,
                    args.max_length, args.dropout, args.seed, progress=not getattr(args, "no_progress", False))
    print(json.dumps(result["rows"]) if args.json else markdown(result["rows"]).rstrip())
