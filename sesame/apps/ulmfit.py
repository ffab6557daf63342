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

Each is a resumable stage (:mod:`sesame.pipelines.stages`): finished once its record (its settings and
measurements) is written; a finished stage is reused, an unfinished one resumed from its checkpoint, or
started afresh when it has none. A stage's settings include the records of the stages it
builds on, so changing an earlier stage's settings is refused rather than mixed with old later stages.

Hyperparameters follow §4: batch 64, BPTT 70, a base rate of 0.004 for fine-tuning the LM and 0.01 for
the classifier, dropouts of the ``ulmfit`` family row, times 0.3 for the target LM and 0.5 for the classifier as
in fastai's ULMFiT notebook (``dropout`` sets the classifier's output dropout, applied once, in the concat head). The target vocabulary is the
general corpus's plus the training texts' words seen twice or more
(at most ``vocab_size``), each new word starting at the mean embedding as in the paper's code (§3.2), and the
classifier keeps it. Deviations: AdamW with the trainer's betas (the paper: Adam with β1 = 0.7, β2 = 0.99);
the general LM trains for a wall-time budget with the family's recipe (linear decay), not to convergence;
texts longer than ``max_length`` tokens are cut (no BPT3C, §3.3); one direction only (no backward LM
ensemble, §3.3).
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import api
from ..data.shards import Shards, prepare_corpus
from ..errors import SesameError
from ..families import FAMILIES, get_size
from ..objectives import OBJECTIVES
from ..options import RATE, check_ranges, option
from ..outputs import claim_dir
from ..pipelines.stages import NO_STEP_CAP, LabeledFiles, cached_stage, duration, stage_runtime, trainer_state
from ..run import load_tokenizer, read_config
from ..runtime import Runtime
from ..tokenizer import extend_words
from ..train.checkpoint import checkpoint_dir, write_json

COMMAND = "ulmfit"
ROW = next(f for f in FAMILIES.values() if f.command == COMMAND)  # the family whose whole recipe this is
FAMILY = ROW.name
DISCRIMINATIVE = 2.6  # §3.2: η^{l−1} = η^l / 2.6
CUT_FRAC = 0.1  # STLR's cut_frac (§3.2, eq. 3; its ratio 32 is TrainConfig.stlr_ratio's default)
# the classifier's dropouts: AWD-LSTM's five times 0.5, as fastai's text_classifier_learner (drop_mult=0.5) and
# its ULMFiT notebook fine-tune the classifier; at the row's full rates the recipe stayed at the majority class
# from scratch, in sesame and in fastai alike (tests/test_ulmfit.py's word-cue task)
CLASSIFIER_DROP_MULT = 0.5
# the target-task LM's (stage b): fastai's ULMFiT notebook fine-tunes the LM with language_model_learner(drop_mult=0.3)
TARGET_LM_DROP_MULT = 0.3
# gradual unfreezing reaches "all" in the epoch that unfreezes the last of the 5 layer groups (embeddings,
# 3 LSTM layers, head), so the classifier trains for at least that many epochs
MIN_CLASSIFIER_EPOCHS = 5
STAGES = ("general-lm", "target-lm", "classifier")
UNFREEZING = ("classifier: head only", "classifier: unfreeze last 1", "classifier: unfreeze last 2")
COLUMNS = ("stage", "epochs", "time", "train loss", "dev loss", "dev accuracy")


@dataclass(kw_only=True)
class UlmfitSpec:
    """``sesame ulmfit``: the labeled task, where the general-domain LM comes from (``corpus`` to pre-train on,
    or ``lm``, a pretrained ulmfit run), and the three stages' settings (module docstring)."""
    train: str = option(help="labeled training file (CSV, TSV or JSONL)")
    dev: str = option(help="labeled dev file")
    text_column: str = option("text", help="the column of the texts")
    label_column: str = option("label", help="the column of the labels")
    corpus: list[str] | None = option(None, help="general-domain text to pre-train on (e.g. WikiText-2's train.txt)")
    valid: list[str] | None = option(None, help="its validation text (default: the corpus's last 1%%)")
    lm: str | None = option(None, help="a pretrained ulmfit run to start from instead of --corpus (skips stage a)")
    out: str = option(help="directory of the three stages and the results; rerun to resume")
    size: str = option("mini", help="with --corpus: tiny, mini, small, medium or base")
    vocab_size: int = option(30000, help="words in the general vocabulary (with --corpus), and at most as many of the "
                                         "task's words added to it for the target LM")
    seq_len: int = option(70, help="BPTT length")
    lm_minutes: float | None = option(60.0, help="general-domain LM: wall-time budget")
    lm_steps: int | None = option(None, help="general-domain LM: also stop at this many steps")
    target_epochs: int = option(4, help="target-task LM fine-tuning epochs")
    classifier_epochs: int = option(MIN_CLASSIFIER_EPOCHS, help=f"classifier epochs, at least {MIN_CLASSIFIER_EPOCHS}")
    lm_lr: float = option(4e-3, help="peak rate of target LM fine-tuning")
    classifier_lr: float = option(1e-2, help="peak rate of the classifier")
    batch_size: int = option(64, help="all stages")
    max_length: int = option(128, help="classifier: tokens per text")
    dropout: float = option(0.4, within=RATE, help="classifier: output dropout (the concat head's first), times 0.5 "
                                                   "as AWD-LSTM's other four (fastai's classifier drop_mult)")
    seed: int = option(0, help="seed of every stage")
    runtime: Runtime = option(factory=Runtime, cli=False, help="every stage's device and precision (sesame.runtime; "
                                                               "the precision is a stage setting, the device not)")
    progress: bool = option(True, cli=False, help="show progress bars")

    def validate(self) -> None:
        """Every check before anything is written: one LM source, positive budgets and rates, both files."""
        check_ranges(self)
        if (self.corpus is None) == (self.lm is None):
            raise SesameError("--corpus or --lm: give one (a general-domain corpus to pre-train on, or a pretrained "
                              "ulmfit run to start from)")
        if self.corpus is not None:
            get_size(self.size)
            if self.lm_minutes is None and self.lm_steps is None:
                raise SesameError("--lm-minutes or --lm-steps: give the general-domain LM a budget")
        for flag, value in (("--lm-minutes", self.lm_minutes), ("--lm-steps", self.lm_steps),
                            ("--target-epochs", self.target_epochs), ("--lm-lr", self.lm_lr),
                            ("--classifier-lr", self.classifier_lr), ("--batch-size", self.batch_size)):
            if value is not None and value <= 0:
                raise SesameError(f"{flag} {value}: must be positive")
        if self.classifier_epochs < MIN_CLASSIFIER_EPOCHS:
            raise SesameError(f"--classifier-epochs {self.classifier_epochs}: use at least {MIN_CLASSIFIER_EPOCHS}, "
                              "so gradual unfreezing reaches all layer groups (head, 3 LSTM layers, embeddings)")
        for flag, path in (("--train", self.train), ("--dev", self.dev)):
            if not Path(path).is_file():
                raise SesameError(f"{flag} {path}: no such file; give a labeled CSV, TSV or JSONL file")

    @property
    def task(self) -> LabeledFiles:
        return LabeledFiles("target", self.train, self.dev, self.text_column, self.label_column)


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


def _target_shards(task: LabeledFiles, lm: Path, folder: Path, length: int, new_words: int, progress: bool
                   ) -> tuple[Shards, Shards]:
    """The task's training and dev texts as token shards, each checked to hold at least one window of
    ``length`` tokens, under the LM's tokenizer extended with the training texts' words (seen twice or
    more, at most ``new_words``; §3.2: the LM is fine-tuned on the target vocabulary). Continuing the LM
    on these shards starts each new word at the mean embedding (:func:`sesame.pipelines.pretrain`)."""
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
        config, state = read_config(general, "--lm"), trainer_state(general)
        part = config.pretrained
        shards = Path(part.shards)
        windows = len(Shards(shards).windows(OBJECTIVES[part.objective].window_length(part.seq_len))) \
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


def _general_lm(spec: UlmfitSpec, general: Path) -> tuple[Path, dict, dict | None]:
    """Stage (a), or the ``lm`` run given instead: (the LM the next stage continues, what it depends on, the
    stage's record or None)."""
    if spec.lm is not None:
        config = read_config(spec.lm, "--lm", ("pretrained",))
        if config.family != FAMILY:
            raise SesameError(f"--lm {spec.lm}: a {config.family} run; ULMFiT starts from a pretrained ulmfit run")
        return Path(spec.lm), {"lm": str(Path(spec.lm).resolve())}, None
    corpus = [str(Path(p).resolve()) for p in spec.corpus]
    valid = [str(Path(p).resolve()) for p in spec.valid] if spec.valid else None
    runtime, precision = stage_runtime(spec.runtime)

    def pretrain(resume: bool) -> dict:
        api.pretrain(corpus=corpus, out=str(general), family=FAMILY, size=spec.size, vocab_size=spec.vocab_size,
                     seq_len=spec.seq_len, valid=valid, resume=resume, progress=spec.progress,
                     max_minutes=spec.lm_minutes, max_steps=spec.lm_steps or NO_STEP_CAP, batch_size=spec.batch_size,
                     seed=spec.seed, runtime=runtime)
        return _lm_record(general)

    record, reused = cached_stage(general, {
        "stage": STAGES[0], "corpus": corpus, "valid": valid, "size": spec.size, "vocab_size": spec.vocab_size,
        "seq_len": spec.seq_len, "minutes": spec.lm_minutes, "max_steps": spec.lm_steps, "batch_size": spec.batch_size,
        "seed": spec.seed, **precision}, pretrain)
    _say(STAGES[0], record, reused)
    return general, record, record


def _target_lm(spec: UlmfitSpec, base: Path, origin: dict, out: Path) -> dict:
    """Stage (b): the LM ``base`` continued on the task's texts, discriminatively and with STLR."""
    target = out / STAGES[1]
    runtime, precision = stage_runtime(spec.runtime)

    def fine_tune_lm(resume: bool) -> dict:
        length = OBJECTIVES[ROW.objective].window_length(spec.seq_len)
        texts, dev_texts = _target_shards(spec.task, base, out / "target-texts", length, spec.vocab_size,
                                          spec.progress)
        per_epoch = math.ceil(len(texts.windows(length)) / spec.batch_size)
        api.pretrain(corpus=[str(texts.path)], out=str(target), family=FAMILY,
                     size=read_config(base, "--lm", ("pretrained",)).size, seq_len=spec.seq_len,
                     valid=[str(dev_texts.path)], resume=resume, progress=spec.progress, base=str(base),
                     discriminative=DISCRIMINATIVE, schedule="stlr", warmup=CUT_FRAC, lr=spec.lm_lr,
                     max_steps=spec.target_epochs * per_epoch, eval_every=per_epoch, save_every=per_epoch,
                     batch_size=spec.batch_size, seed=spec.seed, drop_mult=TARGET_LM_DROP_MULT, runtime=runtime)
        return {**_lm_record(target), "epochs": spec.target_epochs}

    record, reused = cached_stage(target, {
        "stage": STAGES[1], "from": origin, "task": {"train": str(Path(spec.train).resolve()),
                                                     "dev": str(Path(spec.dev).resolve()),
                                                     "text_column": spec.text_column},
        "seq_len": spec.seq_len, "epochs": spec.target_epochs, "lr": spec.lm_lr, "batch_size": spec.batch_size,
        "seed": spec.seed, "new_words": spec.vocab_size, "drop_mult": TARGET_LM_DROP_MULT, **precision}, fine_tune_lm)
    _say(STAGES[1], record, reused)
    return record


def classifier_recipe(*, epochs: int, lr: float, dropout: float) -> dict:
    """Stage (c)'s fine-tuning options (§3.3), for :func:`sesame.api.finetune` from an ulmfit run or
    ``scratch:ulmfit:SIZE``: gradual unfreezing (the head alone in epoch 1, one more layer group per epoch),
    discriminative rates (÷2.6 per group) and one slanted triangle per epoch peaking at ``lr``, for ``epochs``;
    ``dropout`` is the output dropout (the concat head's first, applied once:
    :func:`sesame.tasks.classify.concat_head`), AWD-LSTM's other four the family row's, all five times
    :data:`CLASSIFIER_DROP_MULT` as in fastai. Concat pooling is the family's."""
    return {"discriminative": DISCRIMINATIVE, "gradual_unfreezing": True, "schedule": "stlr", "warmup": CUT_FRAC,
            "lr": lr, "epochs": epochs, "cycles": epochs, "dropout": dropout, "drop_mult": CLASSIFIER_DROP_MULT}


def _classifier(spec: UlmfitSpec, target: dict, out: Path) -> dict:
    """Stage (c): the target LM fine-tuned as a classifier with gradual unfreezing."""
    classifier = out / STAGES[2]
    runtime, precision = stage_runtime(spec.runtime)

    def fine_tune_classifier(resume: bool) -> dict:
        dev_metrics = api.finetune(base=str(out / STAGES[1]), train=spec.train, dev=spec.dev, out=str(classifier),
                                   task="classify", text_column=spec.text_column, label_column=spec.label_column,
                                   max_length=spec.max_length, resume=resume, progress=spec.progress,
                                   batch_size=spec.batch_size, seed=spec.seed, runtime=runtime,
                                   **classifier_recipe(epochs=spec.classifier_epochs, lr=spec.classifier_lr,
                                                       dropout=spec.dropout))
        return {"epochs": spec.classifier_epochs, "seconds": round(trainer_state(classifier)["elapsed"], 3),
                "dev": {k: v for k, v in dev_metrics.items() if isinstance(v, (int, float))}}

    record, reused = cached_stage(classifier, {
        "stage": STAGES[2], "from": target, "task": {**spec.task.columns, "train": str(Path(spec.train).resolve()),
                                                     "dev": str(Path(spec.dev).resolve())},
        "epochs": spec.classifier_epochs, "lr": spec.classifier_lr, "batch_size": spec.batch_size,
        "max_length": spec.max_length, "dropout": spec.dropout, "drop_mult": CLASSIFIER_DROP_MULT, "seed": spec.seed,
        **precision},
        fine_tune_classifier)
    _say(STAGES[2], record, reused)
    return record


def ulmfit(spec: UlmfitSpec) -> dict:
    """Run ULMFiT's three stages (module docstring) into ``spec.out``, resuming or reusing what is there; write
    ``results.md`` and ``results.json`` there and return ``{"rows": [...], "records": {stage: record}}``.

    (a) pre-trains on ``corpus`` (validated on ``valid``, else the corpus's last 1%) for ``lm_minutes`` of
    wall time (``lm_steps`` caps the steps too; give only ``lm_steps`` for a run that repeats exactly), unless
    ``lm`` names a pretrained ulmfit run to start from; (b) fine-tunes it for ``target_epochs`` on the texts
    of ``train`` at ``lm_lr``; (c) fine-tunes the classifier for ``classifier_epochs`` (at least 5) at
    ``classifier_lr`` on ``train``'s ``text_column`` → ``label_column``, evaluated on ``dev``.
    """
    spec.validate()
    spec.runtime.place()  # a device or precision this machine lacks is refused before anything is written
    spec.task.check_labels()  # columns, two labels or more, no dev label unseen in training
    out = Path(spec.out)
    claim_dir(out, "--out", "ulmfit", fix="ulmfit writes into a new or empty folder, or continues its own")
    base, origin, general = _general_lm(spec, out / STAGES[0])
    records = {STAGES[0]: general} if general is not None else {}
    records[STAGES[1]] = _target_lm(spec, base, origin, out)
    records[STAGES[2]] = _classifier(spec, records[STAGES[1]], out)
    rows = _table(base, out / STAGES[1], out / STAGES[2])
    write_json(out / "results.json", {"rows": rows, "records": records})
    (out / "results.md").write_text(f"# ULMFiT: {spec.train} → {spec.dev}\n\n" + markdown(rows))
    return {"rows": rows, "records": records}
