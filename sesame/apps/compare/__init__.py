"""``sesame compare``: pre-training approaches side by side at equal compute, against two baselines.

Every approach (``FAMILY:SIZE[:KEY=VALUE...]``) pre-trains on the same corpus for the same wall time,
then fine-tunes with the same settings on each task (text or text-pair classification). Two baselines
join every table: the same architecture fine-tuned from random weights with the approach's tokenizer
(one row for all approaches that share architecture, tokenizer and fine-tuning options), and TF-IDF word
and character n-grams with logistic regression. An approach may instead start from an existing run
(``from=RUN``: nothing is pre-trained here, its time is read from the run), and a family without a
pre-training objective (``lstm``, ``gru``, ``bilstm``) is a baseline row of its own, trained from scratch.
Each cell is a directory under ``out``::

    pretrain/bert-mini/          the pretrained run
    airline/bert-mini/           fine-tuned from it
    airline/scratch-bert-mini/   the same architecture from random weights
    airline/lstm-mini/           a baseline family, from random weights
    airline/tfidf/               the TF-IDF baseline (its record only)

A cell is finished once its ``compare.json`` record (settings and measurements) is written; a finished
cell is reused, an unfinished one resumed from its checkpoint, or started afresh when it has none.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import inspect
import json
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

from ... import api
from ...data.corpus import resolve_sources
from ...errors import SesameError
from ...families import Family, backbone_config, get_family, get_size
from ...interop.sources import MINILM, minilm_dir, transformers_config
from ...metrics import classification_report
from ...tasks import POOLINGS
from ...options import defaults as option_defaults
from ...pipelines.stages import NO_STEP_CAP, LabeledFiles, cached_stage, duration, trainer_state
from ...rundir import read_config
from ...sources import resolve_source
from ...specs import FinetuneSpec, PretrainSpec, RunConfig
from ...train import TrainConfig
from ...train.recipes import Recipe
from ...train.checkpoint import checkpoint_dir, write_json

C_GRID = (0.25, 1.0, 4.0, 16.0)  # logistic regression's inverse regularisation, picked on dev
SHORTCUTS = {  # name: the task's files (relative to --data) and columns
    "airline": {"train": "airline/train.csv", "dev": "airline/dev.csv", "text_column": "text",
                "label_column": "airline_sentiment"},
    "sst2": {"train": "glue/SST-2/train.tsv", "dev": "glue/SST-2/dev.tsv", "text_column": "sentence",
             "label_column": "label"},
    "rte": {"train": "glue/RTE/train.tsv", "dev": "glue/RTE/dev.tsv", "text_column": "sentence1",
            "pair_column": "sentence2", "label_column": "label"},
    "mrpc": {"train": "glue/MRPC/train.tsv", "dev": "glue/MRPC/dev.tsv", "text_column": "#1 String",
             "pair_column": "#2 String", "label_column": "Quality"},
}
FINETUNE_OPTIONS = ("epochs", "lr", "batch_size", "max_length")  # a task may set its own
COLUMNS = {  # CSV/JSON field: Markdown header
    "approach": "approach", "kind": "kind", "parameters": "parameters", "pretrain_seconds": "pre-training time",
    "pretrain_tokens": "pre-training tokens", "finetune_epochs": "fine-tuning epochs",
    "finetune_seconds": "fine-tuning time", "train_accuracy": "train accuracy", "dev_accuracy": "dev accuracy",
    "dev_macro_f1": "dev macro-F1",
}
KINDS = {"pretrained": ("#4c72b0", ""), "baseline": ("#55a868", ".."), "scratch": ("#b0b0b0", "//"),
         "tf-idf": ("#dd8452", "xx")}  # colour, hatch
# set by compare itself, the same for every approach
RESERVED = {"corpus", "out", "family", "size", "valid", "resume", "progress", "objective_options", "training",
            "max_minutes", "max_steps", "seed"}
FINETUNE = "finetune."  # an approach's item finetune.KEY=VALUE sets api.finetune's KEY for its rows
# api.finetune keywords compare sets itself: the task's files and columns, the run, the seed (the same for every
# row) and the budget (whole epochs, evaluated and saved after each)
FINETUNE_RESERVED = {"base", "train", "dev", "out", "task", "text_column", "label_column", "task_options", "tokenizer",
                     "recipe", "training", "resume", "progress", "select", "seed", "max_steps", "max_minutes", "eval_every", "save_every"}


@dataclass
class Approach:
    """One approach: a family, a size, a recipe of pre-training options (or an existing run to start from)
    and fine-tuning options of its own."""
    spec: str  # as written: FAMILY:SIZE[:KEY=VALUE...]
    family: str
    size: str
    options: dict  # keyword arguments for sesame.pretrain
    finetune: dict = field(default_factory=dict)  # keyword arguments for sesame.finetune (finetune.KEY=VALUE)
    base: str | None = None  # from=RUN: fine-tune this run instead of pre-training

    @property
    def slug(self) -> str:
        return _slug(self.spec)

    @property
    def kind(self) -> str:
        """``pretrained``, or ``baseline`` for a family without pre-training (trained from scratch)."""
        return "pretrained" if self.base or get_family(self.family).objective else "baseline"

    @property
    def pretrains(self) -> bool:
        """Whether compare pre-trains it (not a baseline, not ``from=`` a run)."""
        return self.kind == "pretrained" and not self.base

    @property
    def has_twin(self) -> bool:
        """Whether a from-scratch twin measures its pre-training: not for baselines (scratch already), feature
        extractors (their task model is a BiLSTM, not their own network) or a run sesame did not make (whose
        architecture ``scratch:FAMILY:SIZE`` may not be)."""
        fam = get_family(self.family)
        return fam.objective is not None and not fam.feature_extractor and \
            (self.base is None or _run_config(self.base) is not None)

    def run(self, pretrained: Path) -> Path:
        """The run it fine-tunes: its ``from=`` run, or its directory under ``pretrained``."""
        return Path(self.base) if self.base else pretrained / self.slug

    def fine_tuning(self, common: dict, task: "CompareTask") -> dict:
        """Its fine-tuning options on ``task``: the command's ``common`` ones < the family's defaults
        (``Family.finetune``) < the task's own < the approach's ``finetune.KEY=VALUE`` items."""
        return {**common, **get_family(self.family).finetune, **task.options, **self.finetune}


def _slug(name: str) -> str:
    """``name`` as a directory name: ``:`` and anything unusual become ``-``."""
    return re.sub(r"[^\w.=+-]+", "-", name.replace(":", "-"))


@dataclass
class CompareTask(LabeledFiles):
    """A task of the comparison: its labeled files, and ``options``, the fine-tuning settings (of
    ``FINETUNE_OPTIONS``) it sets for itself."""
    options: dict = field(default_factory=dict)


def _recipe_defaults() -> dict:
    """Every option a recipe may name, with its default: sesame.pretrain's parameters and TrainConfig's fields."""
    defaults = {**option_defaults(PretrainSpec), **option_defaults(TrainConfig)}
    return {k: v for k, v in defaults.items() if k not in RESERVED}


def _typed(where: str, key: str, text: str, default: object, shown: bool = True) -> object:
    """``text`` read as JSON when it parses (else as a string), checked against the type of ``default``
    (named in the error when ``shown``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    return _checked(where, key, value, default, shown)


def _checked(where: str, key: str, value: object, default: object, shown: bool = True) -> object:
    """``value``, if it has the type of ``default`` (an int passes for a float); else an error naming ``where``."""
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if default is not None and type(value) is not type(default):
        raise SesameError(f"{where}: {key}={json.dumps(value)} should be a {type(default).__name__}"
                          + (f", like the default {key}={json.dumps(default)}" if shown else ""))
    return value


def _finetune_defaults() -> dict:
    """Every option a ``finetune.KEY`` item may name, with its default: sesame.finetune's keywords and
    TrainConfig's fields, but those compare sets itself (``FINETUNE_RESERVED``)."""
    defaults = {**option_defaults(FinetuneSpec), **option_defaults(Recipe), **option_defaults(TrainConfig)}
    return {k: v for k, v in defaults.items() if k not in FINETUNE_RESERVED}


def _run_config(base: str) -> RunConfig | None:
    """The config.json of ``base`` if it is a run sesame made (pretrained or fine-tuned), else None."""
    source = resolve_source(base, "from=") if (Path(base) / "config.json").is_file() else None
    return source.config if source is not None else None


def _check_base(spec: str, fam: Family, size: str, base: str) -> None:
    """``from=base``: a run of this family and size, a transformers directory or ``minilm``."""
    where = f"--approaches {spec}: from={base}"
    if base == MINILM:
        try:
            minilm_dir()  # installed?
        except SesameError as err:
            raise SesameError(f"{where}: {err}") from None
        return
    if not Path(base).is_dir():
        raise SesameError(f"{where}: no such directory; give a run (of sesame pretrain, sesame cove, sesame "
                          "ulmfit's target-lm), a transformers model directory or minilm")
    config = _run_config(base)
    if config is None:
        if transformers_config(Path(base)) is None:
            raise SesameError(f"{where}: neither a sesame run nor a transformers model directory (no config.json "
                              "with kind or model_type)")
        return
    if (config.family, config.size) != (fam.name, size):
        raise SesameError(f"{where}: a {config.family} {config.size} run; write "
                          f"{config.family}:{config.size}:from={base}")


def _parse_finetune(spec: str, fam: Family, kind: str, items: dict) -> dict:
    """The ``finetune.KEY=VALUE`` items of ``spec``, typed like sesame.finetune's defaults and checked now,
    so a bad one fails before any training."""
    where, known, options = f"--approaches {spec}", _finetune_defaults(), {}
    text_options = {f.name for cls in (FinetuneSpec, Recipe) for f in fields(cls)
                    if str(f.type).startswith("str")}  # paths and names, never read as JSON
    for key, text in items.items():
        if key in FINETUNE_RESERVED:
            raise SesameError(f"{where}: finetune.{key} is set by compare for every row alike (the task, --seed, "
                              "epochs as the budget)")
        if key not in known:
            raise SesameError(f"{where}: finetune.{key} is not a fine-tuning option; use one of "
                              f"{', '.join(sorted(known))}")
        # compare's and the family's defaults differ from api.finetune's, so none is shown as "the default"
        options[key] = text if key in text_options else _typed(where, f"finetune.{key}", text, known[key], False)
    if "vectors" in options:
        if not (fam.word_vectors and (fam.feature_extractor or kind == "baseline")):
            raise SesameError(f"{where}: finetune.vectors initialises the word embedding of a new recurrent task "
                              "model: for lstm, gru, bilstm or elmo approaches (a cove run brings its own)")
        if not Path(options["vectors"]).is_file():
            raise SesameError(f"{where}: finetune.vectors={options['vectors']}: no such file (GloVe or word2vec text)")
    if options.get("pooling") is not None and options["pooling"] not in POOLINGS:
        raise SesameError(f"{where}: finetune.pooling={options['pooling']}: choose one of {', '.join(POOLINGS)}")
    train = {f.name for f in fields(TrainConfig)}
    try:
        TrainConfig(**{"lr": 5e-5, "warmup": 0.1, **fam.finetune,
                       **{k: v for k, v in options.items() if k in train}}).validate()
    except SesameError as err:
        raise SesameError(f"{where}: fine-tuning {err} (set it with finetune.KEY=VALUE)") from None
    return options


def parse_approach(spec: str) -> Approach:
    """``FAMILY:SIZE[:KEY=VALUE...]``: KEY is a ``sesame.pretrain`` option or a TrainConfig field (e.g.
    ``seq_len``, ``lr``, ``accumulate``), or else an option of the family's objective (e.g. ``masking``);
    ``from=RUN`` fine-tunes RUN (anything ``sesame finetune --from`` takes) instead of pre-training;
    ``finetune.KEY=VALUE`` sets a ``sesame.finetune`` option (or TrainConfig field) for this approach's rows."""
    parts = spec.split(":")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise SesameError(f"--approaches {spec!r}: write FAMILY:SIZE[:KEY=VALUE...], e.g. bert:mini or "
                          "roberta:mini:accumulate=4")
    family, size, *items = parts
    try:
        fam = get_family(family)
        get_size(size)
    except SesameError as err:
        raise SesameError(f"--approaches {spec}: {err}") from None
    given: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key or key in given:
            raise SesameError(f"--approaches {spec}: {item!r} should be KEY=VALUE, each KEY once, e.g. lr=1e-3")
        given[key] = text
    base = given.pop("from", None)
    tuning = {k[len(FINETUNE):]: v for k, v in given.items() if k.startswith(FINETUNE)}
    recipe = {k: v for k, v in given.items() if not k.startswith(FINETUNE)}
    if base is None and fam.objective is None and fam.feature_extractor:
        raise SesameError(f"--approaches {spec}: {family} is not pre-trained by compare; train it with "
                          f"`sesame {family}` and give the run: {family}:{size}:from=RUN")
    if recipe and (base is not None or fam.objective is None):
        why = f"starts from {base}" if base is not None else f"({family}) is a baseline without pre-training"
        raise SesameError(f"--approaches {spec}: {', '.join(recipe)}: pre-training options, but this approach "
                          f"{why}; give fine-tuning options as finetune.KEY=VALUE, e.g. finetune.lr=1e-3")
    if base is not None:
        _check_base(spec, fam, size, base)
    known, options, objective = _recipe_defaults(), {}, {}
    for key, text in recipe.items():
        if key in RESERVED:
            raise SesameError(f"--approaches {spec}: {key} is set by compare for every approach alike "
                              "(--minutes, --max-steps, --seed, --corpus, --valid)")
        if key in known:
            options[key] = _typed(f"--approaches {spec}", key, text, known[key])
        else:  # the objective checks these when pre-training starts
            objective[key] = _typed(f"--approaches {spec}", key, text, None)
    try:
        train = {f.name for f in fields(TrainConfig)}
        TrainConfig(**{**fam.recipe, **{k: v for k, v in options.items() if k in train}}).validate()
    except SesameError as err:
        raise SesameError(f"--approaches {spec}: {err}") from None
    approach = Approach(spec, family, size, {**options, **({"objective_options": objective} if objective else {})},
                        base=base)
    approach.finetune = _parse_finetune(spec, fam, approach.kind, tuning)
    return approach


def resolve_tasks(specs: Sequence[str], data: str, defaults: dict | None = None) -> list[CompareTask]:
    """Tasks from ``NAME[:KEY=VALUE...]`` specs. NAME is built in (resolved against ``data``) or a JSON file
    holding one task object or a list of them: ``{"name", "train", "dev", "text_column", "label_column",
    "pair_column"}`` and optionally fine-tuning settings, paths relative to the file. KEY=VALUE items set a
    fine-tuning option (``FINETUNE_OPTIONS``) for that task alone, typed like its entry in ``defaults``."""
    defaults = defaults or {}
    tasks = []
    for spec in specs:
        name, *items = spec.split(":")
        options = {}
        for item in items:
            key, sep, text = item.partition("=")
            if not sep or key not in FINETUNE_OPTIONS or key in options:
                raise SesameError(f"--tasks {spec}: {item!r} should be KEY=VALUE with KEY one of "
                                  f"{', '.join(FINETUNE_OPTIONS)}, each once, e.g. sst2:epochs=1")
            options[key] = _typed(f"--tasks {spec}", key, text, defaults.get(key))
        tasks += [CompareTask(**{**asdict(task), "options": {**task.options, **options}}) for task in _named_tasks(name, data)]
    for task in tasks:
        task.options = {k: _checked(f"--tasks (task {task.name})", k, v, defaults.get(k))
                        for k, v in task.options.items()}
        check_task(task)
    names = [t.name for t in tasks]
    for name in names:
        if names.count(name) > 1 or name == "pretrain" or not re.fullmatch(r"[A-Za-z0-9][\w-]*", name):
            raise SesameError(f"--tasks: task name {name!r} must be unique, not 'pretrain', and use only letters, "
                              "digits, _ and -")
    return tasks


def _named_tasks(spec: str, data: str) -> list[CompareTask]:
    """The built-in task ``spec`` or the tasks of the JSON file ``spec``."""
    if spec in SHORTCUTS:
        files = {k: str(Path(data) / SHORTCUTS[spec][k]) for k in ("train", "dev")}
        return [CompareTask(spec, **{**SHORTCUTS[spec], **files})]
    path = Path(spec)
    if not path.is_file():
        raise SesameError(f"--tasks {spec}: neither a built-in task ({', '.join(SHORTCUTS)}) nor a JSON task "
                          "file; give one of those names or a file like "
                          '{"name": "mine", "train": "train.csv", "dev": "dev.csv"}')
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SesameError(f"--tasks {spec}: not valid JSON ({err})") from None
    names = {f.name for f in fields(CompareTask)} - {"options"}
    tasks = []
    for entry in entries if isinstance(entries, list) else [entries]:
        if not isinstance(entry, dict) or not {"name", "train", "dev"} <= set(entry) or \
                set(entry) - names - set(FINETUNE_OPTIONS):
            raise SesameError(f"--tasks {spec}: each task is an object with name, train, dev and optionally "
                              f"text_column, label_column, pair_column, {', '.join(FINETUNE_OPTIONS)}")
        relative = {k: str(path.parent / entry[k]) for k in ("train", "dev")}
        tasks.append(CompareTask(**{k: v for k, v in {**entry, **relative}.items() if k in names},
                          options={k: entry[k] for k in FINETUNE_OPTIONS if k in entry}))
    return tasks


def check_task(task: CompareTask) -> None:
    """Read both files now, so a bad column or label fails before any training."""
    hint = f" (task {task.name}; check --data)" if task.name in SHORTCUTS else f" (task {task.name})"
    for path in (task.train, task.dev):
        if not Path(path).is_file():
            raise SesameError(f"--tasks: {path}: no such file{hint}")
    task.check_labels()


# -- cells -----------------------------------------------------------------------------------------

def _say(where: str, name: str, record: dict, reused: bool) -> None:
    what = (f"dev accuracy {record['dev']['accuracy']:.4f}" if "dev" in record
            else f"{record['steps']:,} steps, {record['tokens']:,} tokens")
    print(f"{where:<10} {name:<36} {what} in {duration(record['seconds'])}{'  (reused)' if reused else ''}",
          file=sys.stderr, flush=True)


def _pretrain(approach: Approach, run: Path, corpus: list[str], valid: list[str] | None, minutes: float,
              max_steps: int | None, seed: int, progress: bool) -> tuple[dict, bool]:
    def work(resume: bool) -> dict:
        try:
            api.pretrain(corpus, str(run), family=approach.family, size=approach.size, valid=valid, resume=resume,
                         progress=progress, max_minutes=minutes, max_steps=max_steps or NO_STEP_CAP, seed=seed,
                         **approach.options)
        except SesameError as err:
            raise SesameError(f"--approaches {approach.spec}: {err}") from None
        state, config = trainer_state(run), read_config(run, "--out")
        return {"steps": state["step"], "tokens": state["step"] * state["config"]["batch_size"] * config.seq_len,
                "seconds": round(state["elapsed"], 3)}

    settings = {"approach": approach.spec, "corpus": corpus, "valid": valid, "minutes": minutes,
                "max_steps": max_steps, "seed": seed}
    return cached_stage(run, settings, work)


def _prior_training(base: str) -> dict:
    """``{"seconds", "tokens"}`` spent pre-training the run ``base``, read from its checkpoint and summed over
    the runs it continued (``config.base``: ULMFiT's target LM continues the general one); tokens are
    steps × batch × sequence length. None for what the runs do not record (a transformers directory, MiniLM,
    a run without checkpoint; tokens of a ``sesame cove`` run, whose examples are sentence pairs)."""
    seconds, tokens, path, seen = 0.0, 0, Path(base), set()
    while path is not None:
        config = _run_config(str(path))
        if config is None or config.kind != "pretrained" or checkpoint_dir(path) is None or path.resolve() in seen:
            return {"seconds": None, "tokens": None}
        seen.add(path.resolve())
        state = trainer_state(path)
        seconds += state["elapsed"]
        tokens = tokens + state["step"] * state["config"]["batch_size"] * config.seq_len \
            if tokens is not None and config.seq_len is not None else None
        path = Path(config.base) if config.base else None
    return {"seconds": round(seconds, 3), "tokens": tokens}


def _origin(base: str) -> dict:
    """What a cell fine-tuned from the run ``base`` depends on: its path and a fingerprint of its weights and
    config (size and modification time), so that a changed run is noticed."""
    path = minilm_dir() if base == MINILM else Path(base)
    files = sorted(p for p in path.iterdir() if p.is_file() and (p.suffix in (".safetensors", ".bin")
                                                                 or p.name == "config.json"))
    return {"from": base if base == MINILM else str(path.resolve()),
            "fingerprint": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}}


def _finetune(base: str, run: Path, task: CompareTask, origin: dict, options: dict, tokenizer: str | None,
              progress: bool, spec: str | None = None) -> tuple[dict, bool]:
    """Fine-tune ``base``; ``origin`` (the records it depends on) is part of the cell's settings. An error
    names the approach ``spec``, when given."""
    def work(resume: bool) -> dict:
        try:
            dev = api.finetune(base, task.train, task.dev, str(run), task=task.task, task_options=task.columns,
                               tokenizer=tokenizer, resume=resume, progress=progress, **options)
        except SesameError as err:
            raise SesameError(f"--approaches {spec} (task {task.name}): {err}" if spec else str(err)) from None
        model = api.load(run)
        return {"parameters": sum(p.numel() for p in model.model.parameters()), "epochs": options["epochs"],
                "seconds": round(trainer_state(run)["elapsed"], 3), "train": _scores(model.evaluate(task.train)),
                "dev": _scores(dev)}

    return cached_stage(run, {"from": origin, "task": asdict(task), **options}, work)


def _scratch_twins(plan: list[Approach], runs: Path) -> dict[str, list[Approach]]:
    """``{name: approaches}``: one from-scratch twin per distinct architecture, tokenizer and fine-tuning
    options, named ``scratch:FAMILY:SIZE`` (and the approach's ``finetune.`` items) after the first approach
    that has them, whose tokenizer it uses. bert, spanbert and electra at one size with one tokenizer file
    share a twin: their runs would be identical. ``runs`` holds the runs compare pre-trained; approaches
    without a twin (:attr:`Approach.has_twin`) are left out."""
    twins: dict[tuple, str] = {}
    named: dict[str, list[Approach]] = {}
    for a in plan:
        if not a.has_twin:
            continue
        tokenizer = hashlib.sha256((a.run(runs) / "tokenizer.json").read_bytes()).hexdigest()
        key = (json.dumps(asdict(backbone_config(a.family, a.size, 1, 0))), tokenizer,
               json.dumps(a.finetune, sort_keys=True))
        if key not in twins:
            name = ":".join([f"scratch:{a.family}:{a.size}", *(item for item in a.spec.split(":")[2:]
                                                               if item.startswith(FINETUNE))])
            twins[key] = name if name not in named else f"{name}:tokenizer-of-{a.slug}"
        named.setdefault(twins[key], []).append(a)
    return named


def _scores(report: dict) -> dict:
    return {"accuracy": round(report["accuracy"], 6), "macro_f1": round(report["macro_f1"], 6)}


def tfidf_baseline(task: CompareTask, seed: int = 0) -> dict:
    """TF-IDF word 1–2-grams and character 2–5-grams (within words) → logistic regression.

    A text pair (u, v) is represented as InferSent's (u, v, |u − v|, u ∗ v) (Conneau et al. 2017, §3.3),
    one vectoriser fitted on both sides; the product (what the texts share) is L2-normalised, as its raw
    entries are too small for the regularised fit to use. The inverse regularisation C is the one of
    ``C_GRID`` with the best dev accuracy (the smallest on ties), so the dev score is slightly optimistic.
    Returns parameters (coefficients), C, seconds, and train and dev accuracy and macro-F1.
    """
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion
    from sklearn.preprocessing import normalize

    started = time.time()
    train, dev = task.read(task.train), task.read(task.dev)
    labels = sorted({row["label"] for row in train})
    y_train, y_dev = ([labels.index(row["label"]) for row in rows] for rows in (train, dev))
    features = FeatureUnion([
        ("word", TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)),
        ("char", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), min_df=2, sublinear_tf=True))])
    features.fit([row[side] for row in train for side in ("text", "pair")[:1 + bool(task.pair_column)]])

    def vectors(rows: list[dict]):
        first = features.transform([row["text"] for row in rows])
        if not task.pair_column:
            return first
        second = features.transform([row["pair"] for row in rows])
        return hstack([first, second, abs(first - second), normalize(first.multiply(second))]).tocsr()

    x_train, x_dev = vectors(train), vectors(dev)
    fits = [LogisticRegression(C=c, max_iter=3000, random_state=seed).fit(x_train, y_train) for c in C_GRID]
    best = max(fits, key=lambda model: model.score(x_dev, y_dev))
    return {"parameters": int(best.coef_.size + best.intercept_.size), "C": best.C,
            "seconds": round(time.time() - started, 3),
            "train": _scores(classification_report(y_train, best.predict(x_train).tolist(), labels)),
            "dev": _scores(classification_report(y_dev, best.predict(x_dev).tolist(), labels))}


# -- the whole comparison --------------------------------------------------------------------------

def compare(approaches: Sequence[str], corpus: Sequence[str], tasks: Sequence[str], out: str, minutes: float,
            valid: Sequence[str] | None = None, data: str = "../shared/data", epochs: int = 3, lr: float = 2e-4,
            batch_size: int = 32, max_length: int = 128, seed: int = 0, max_steps: int | None = None,
            progress: bool = True) -> list[dict]:
    """Pre-train every approach on ``corpus`` for ``minutes`` of wall time each (``max_steps`` caps the steps
    too, for quick checks), fine-tune each and its from-scratch twin on every task with the same settings,
    add the TF-IDF baseline, and write ``results.{md,csv,json,png}`` in ``out``. Returns the table's rows.

    ``approaches``: ``FAMILY:SIZE[:KEY=VALUE...]`` (see :func:`parse_approach`); one ``from=RUN`` is not
    pre-trained but fine-tuned from RUN, one of a family without a pre-training objective (lstm, gru, bilstm)
    is a ``baseline`` row trained from scratch. ``tasks``: built-in names (``airline``, ``sst2``, ``rte``,
    ``mrpc``, found under ``data``) or JSON task files, each optionally followed by its own fine-tuning
    settings (see :func:`resolve_tasks`). The fine-tuning options of a row, later ones winning: these
    arguments (defaults lr 2e-4, 3 epochs: they suit the small Transformers), the family's defaults
    (``Family.finetune``: lr 2e-3 for the recurrent ones), the task's, the approach's
    ``finetune.KEY=VALUE`` items (:meth:`Approach.fine_tuning`).
    """
    plan = [parse_approach(spec) for spec in approaches]  # checks every approach before any training
    slugs = [a.slug for a in plan]
    if not plan or len(set(slugs)) < len(slugs):
        raise SesameError("--approaches: give at least one approach, each once")
    for flag, bad in (("--minutes", minutes <= 0), ("--epochs", epochs <= 0), ("--max-steps", (max_steps or 1) <= 0)):
        if bad:
            raise SesameError(f"{flag}: must be positive")
    resolve_sources(corpus, "--corpus")
    if valid:
        resolve_sources(valid, "--valid")
    options = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "max_length": max_length, "seed": seed}
    task_list = resolve_tasks(tasks, data, options)
    command = shlex.join(["sesame", "compare", "--approaches", *approaches, "--corpus", *corpus,
                          *(["--valid", *valid] if valid else []), "--tasks", *tasks, "--data", data, "--out", str(out),
                          "--minutes", f"{minutes:g}", *(["--max-steps", str(max_steps)] if max_steps else []),
                          "--epochs", str(epochs), "--lr", f"{lr:g}", "--batch-size", str(batch_size),
                          "--max-length", str(max_length), "--seed", str(seed)])
    out = Path(out)
    corpus_paths = [str(Path(p).resolve()) for p in corpus]
    valid_paths = [str(Path(p).resolve()) for p in valid] if valid else None
    no_pretraining = {"seconds": 0, "tokens": 0}
    origins, pre = {}, {}  # per approach: what its cells depend on, its pre-training columns
    for a in plan:
        if a.pretrains:
            origins[a.spec], reused = _pretrain(a, out / "pretrain" / a.slug, corpus_paths, valid_paths, minutes,
                                                max_steps, seed, progress)
            _say("pretrain", a.spec, origins[a.spec], reused)
            pre[a.spec] = origins[a.spec]
        elif a.base:
            origins[a.spec], pre[a.spec] = _origin(a.base), _prior_training(a.base)
        else:
            origins[a.spec], pre[a.spec] = {"scratch": f"scratch:{a.family}:{a.size}"}, no_pretraining
    scratch = _scratch_twins(plan, out / "pretrain")
    rows = []

    def add(task: CompareTask, name: str, kind: str, slug: str, record: dict, reused: bool, pre: dict,
            **extra: object) -> None:
        rows.append({"task": task.name, "approach": name, "kind": kind, "parameters": record["parameters"],
                     "pretrain_seconds": pre["seconds"], "pretrain_tokens": pre["tokens"],
                     "finetune_epochs": record.get("epochs"), "finetune_seconds": record["seconds"],
                     "train_accuracy": record["train"]["accuracy"], "dev_accuracy": record["dev"]["accuracy"],
                     "dev_macro_f1": record["dev"]["macro_f1"], "run": f"{task.name}/{slug}",
                     **({"C": record["C"]} if "C" in record else {}), **extra})
        _say(task.name, name, record, reused)

    for task in task_list:
        for a in plan:
            tuned = a.fine_tuning(options, task)
            base = str(a.run(out / "pretrain")) if a.kind == "pretrained" else origins[a.spec]["scratch"]
            add(task, a.spec, a.kind, a.slug, *_finetune(base, out / task.name / a.slug, task, origins[a.spec], tuned,
                                                         None, progress, a.spec), pre[a.spec], finetune=tuned,
                **({"from": a.base} if a.base else {}))
        for name, (a, *others) in scratch.items():
            tuned = a.fine_tuning(options, task)
            add(task, name, "scratch", _slug(name), *_finetune(
                f"scratch:{a.family}:{a.size}", out / task.name / _slug(name), task,
                {"scratch": name, "tokenizer": origins[a.spec]}, tuned, str(a.run(out / "pretrain")), progress, name),
                no_pretraining, twin_of=[a.spec, *(o.spec for o in others)], finetune=tuned)
        add(task, "tf-idf + logistic regression", "tf-idf", "tfidf", *cached_stage(
            out / task.name / "tfidf", {"task": {**asdict(task), "options": {}}, "grid": C_GRID, "seed": seed},
            lambda resume: tfidf_baseline(task, seed)), no_pretraining)
    _write_results(out, rows, task_list, command, minutes, options)
    return rows


# -- outputs ---------------------------------------------------------------------------------------

def _count(n: int) -> str:
    for unit, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= unit:
            return f"{n / unit:.1f}{name}"
    return str(n)


def _shared_recipe(rows: list[dict]) -> list[str]:
    """The recipe items (``KEY=VALUE``) that every approach names, when there are several."""
    recipes = [row["approach"].split(":")[2:] for row in rows if row["kind"] in ("pretrained", "baseline")]
    return [item for item in recipes[0] if all(item in r for r in recipes)] if len(recipes) > 1 else []


def _short(approach: str, shared: list[str]) -> str:
    """``approach`` without the ``shared`` recipe items."""
    return ":".join(part for i, part in enumerate(approach.split(":")) if i < 2 or part not in shared)


def _cells(row: dict, shared: list[str]) -> list[str]:
    """The Markdown cells of ``row``; pre-training that did not happen or is unknown shows as ``—``."""
    pre, tokens = row["pretrain_seconds"], row["pretrain_tokens"]
    return [_short(row["approach"], shared), row["kind"], _count(row["parameters"]), duration(pre) if pre else "—",
            _count(tokens) if tokens else "—", str(row["finetune_epochs"] or "—"),
            duration(row["finetune_seconds"]), *(f"{row[k]:.4f}" for k in ("train_accuracy", "dev_accuracy",
                                                                            "dev_macro_f1"))]


def _own_settings(rows: list[dict], common: dict, shared: list[str]) -> str:
    """The rows of one task fine-tuned with other settings than ``common`` (the command's and the task's),
    by the family's defaults or their ``finetune.`` items: ``lstm:mini`` (lr 0.002); ..."""
    def item(key: str, value: object) -> str:
        shown = f"{value:g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, bool) else value
        return f"{key.replace('_', ' ')} {shown}"

    own = [(r["approach"], [item(k, v) for k, v in r["finetune"].items() if common.get(k) != v])
           for r in rows if "finetune" in r]
    return "; ".join(f"`{_short(name, shared)}` ({', '.join(diff)})" for name, diff in own if diff)


def _write_results(out: Path, rows: list[dict], tasks: list[CompareTask], command: str, minutes: float,
                  options: dict) -> None:
    """results.json (command and rows), results.csv, results.md (a table per task) and results.png."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"command": command, "rows": rows})
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, ["task", *COLUMNS, "run"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shared = _shared_recipe(rows)
    twins = {r["approach"]: r["twin_of"] for r in rows if r["kind"] == "scratch"}
    here = any(r["kind"] == "pretrained" and "from" not in r for r in rows)
    lines = ["# sesame compare", "", "Made by:", "", "```bash", command, "```", "",
             *([f"- Pre-training: {minutes:g} min of wall time per approach pre-trained here, on the same corpus "
                "(tokenizer, data preparation and training); pre-training tokens = steps × batch × sequence "
                "length."] if here else []),
             *([f"- Every approach's recipe includes `{':'.join(shared)}`, left out of the tables."] if shared else []),
             *(["- `from=` rows fine-tune an existing run, pre-trained elsewhere: its time and tokens are read from its "
                "checkpoints (summed over the runs it continued, as ULMFiT's target LM continues the general one); "
                "`—` where the run does not record them."] if any("from" in r for r in rows) else []),
             f"- Fine-tuning: epochs {options['epochs']}, lr {options['lr']:g}, batch {options['batch_size']}, max "
             f"length {options['max_length']}, seed {options['seed']}, unless the family (its defaults), the task or "
             "the approach (`finetune.KEY=VALUE`) says otherwise, in that order of precedence; each task lists the "
             "rows that differ. The epoch with the best dev accuracy is kept.",
             *(["- `baseline` rows: a family without pre-training (an LSTM, GRU or BiLSTM classifier), trained from "
                "random weights (or `finetune.vectors`) on the task alone, with a word tokenizer of its training "
                "texts."] if any(r["kind"] == "baseline" for r in rows) else []),
             *(["- `scratch:` rows: the same architecture from random weights, with the approach's tokenizer and "
                "fine-tuning options; one row serves every approach with the same architecture, tokenizer and "
                "options: " + "; ".join(f"`{name}` for {', '.join(_short(a, shared) for a in of)}"
                                        for name, of in twins.items()) + "."] if twins else []),
             "- The TF-IDF row: logistic regression on word 1–2-gram and character 2–5-gram TF-IDF features (for a "
             "pair (u, v): u, v, |u − v| and u ∗ v), its C picked on dev. Like the best epoch above, that makes its "
             "dev score slightly optimistic."]
    for task in tasks:
        mine = [r for r in rows if r["task"] == task.name]
        own = "".join(f", {k.replace('_', ' ')} {v:g}" for k, v in task.options.items())
        differ = _own_settings(mine, {**options, **task.options}, shared)
        lines += ["", f"## {task.name}", "",
                  f"`{task.train}` → `{task.dev}`, {task.text_column}"
                  f"{f' + {task.pair_column}' if task.pair_column else ''} → {task.label_column}"
                  f"{f'; fine-tuning for this task{own}' if own else ''}; TF-IDF C = "
                  f"{next(r['C'] for r in mine if r['kind'] == 'tf-idf'):g}."
                  f"{f' Fine-tuned otherwise: {differ}.' if differ else ''}", "",
                  "| " + " | ".join(COLUMNS.values()) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_cells(r, shared)) + " |" for r in mine]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    _chart(rows, [t.name for t in tasks], [_short(r["approach"], shared) for r in rows], out / "results.png")


def _chart(rows: list[dict], tasks: list[str], names: list[str], path: Path) -> None:
    """Dev accuracy per approach, one panel per task; baselines hatched, TF-IDF's score a dashed line."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    per_task = max(sum(r["task"] == t for r in rows) for t in tasks)
    fig = Figure(figsize=(8, 1.2 + len(tasks) * (0.8 + 0.35 * per_task)), layout="constrained")
    for ax, task in zip(fig.subplots(len(tasks), 1, squeeze=False)[:, 0], tasks):
        mine = [(r, name) for r, name in zip(rows, names) if r["task"] == task]
        for i, (r, _) in enumerate(mine):
            colour, hatch = KINDS[r["kind"]]
            ax.barh(i, r["dev_accuracy"], color=colour, hatch=hatch, edgecolor="#333333")
            ax.text(r["dev_accuracy"], i, f" {r['dev_accuracy']:.3f}", va="center", fontsize=8)
            if r["kind"] == "tf-idf":
                ax.axvline(r["dev_accuracy"], color=colour, linestyle="--", linewidth=1)
        ax.set_yticks(range(len(mine)), [name for _, name in mine])
        ax.invert_yaxis()
        ax.set_xlim(0, 1.1)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("dev accuracy", fontsize=8)
        ax.tick_params(labelsize=8)
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    fig.legend(handles=[Patch(facecolor=KINDS[k][0], hatch=KINDS[k][1], edgecolor="#333333", label=k) for k in kinds],
               loc="outside lower center", ncols=len(kinds), fontsize=8)
    fig.savefig(path, dpi=120)


# -- command line ----------------------------------------------------------------------------------

def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``compare`` to the ``sesame`` subcommands."""
    default = {name: param.default for name, param in inspect.signature(compare).parameters.items()}
    p = subparsers.add_parser("compare", help="pre-training approaches at equal compute, against baselines")
    p.add_argument("--approaches", nargs="+", required=True, metavar="FAMILY:SIZE[:KEY=VALUE...]",
                   help="e.g. bert:mini roberta:mini:accumulate=4 lstm:mini cove:mini:from=runs/cove "
                        "bert:mini:from=minilm:finetune.lr=5e-5; KEY: a pretrain option or objective option, "
                        "from (a run to fine-tune instead of pre-training) or finetune.KEY (a finetune option)")
    p.add_argument("--corpus", nargs="+", required=True, help="pre-training text files or folders, shared by all")
    p.add_argument("--valid", nargs="+", help="validation text (default: the corpus's last 1%%)")
    p.add_argument("--tasks", nargs="+", required=True, metavar="TASK[:KEY=VALUE...]",
                   help=f"built-in ({', '.join(SHORTCUTS)}, under --data) or JSON files "
                        '{"name", "train", "dev", "text_column", "label_column", "pair_column"}; KEY=VALUE: '
                        f"this task's own {', '.join(FINETUNE_OPTIONS)}, e.g. sst2:epochs=1")
    p.add_argument("--data", default=default["data"], help="where the built-in tasks live (default %(default)s)")
    p.add_argument("--out", required=True, help="directory of the cells and results; rerun to resume")
    p.add_argument("--minutes", type=float, required=True, help="pre-training wall-time budget per approach")
    p.add_argument("--max-steps", type=int, help="also stop pre-training at this many steps (quick checks)")
    for flag, kind, what in (("epochs", int, "epochs"), ("lr", float, "learning rate"),
                             ("batch_size", int, "batch size"), ("max_length", int, "tokens per text")):
        p.add_argument("--" + flag.replace("_", "-"), type=kind, default=default[flag],
                       help=f"fine-tuning {what} of every row whose family, task or approach sets none "
                            "(default %(default)s)")
    p.add_argument("--seed", type=int, default=default["seed"])
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def run(args: argparse.Namespace) -> None:
    """``sesame compare``: run the comparison, then print the rows (``--json``) or where the tables went."""
    rows = compare(args.approaches, args.corpus, args.tasks, args.out, args.minutes, valid=args.valid, data=args.data,
                   epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, max_length=args.max_length,
                   seed=args.seed, max_steps=args.max_steps, progress=not getattr(args, "no_progress", False))
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"wrote {Path(args.out) / 'results.md'} (and .csv, .json, .png)")
