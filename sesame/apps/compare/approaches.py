"""The approach language of ``sesame compare --approaches``: ``FAMILY:SIZE[:KEY=VALUE...]``.

KEY is a pre-training option (a :class:`sesame.specs.PretrainSpec` or TrainConfig field, e.g. ``seq_len``,
``lr``, ``accumulate``, or ``precision``, the approach's own ``--precision``), or else an option of the family's
objective (e.g. ``masking``); ``teacher=MODEL`` with DistilBERT's keys (``kl_weight``, ``student_layers``, ...)
pre-trains a student of MODEL (``sesame pretrain --teacher``, :mod:`sesame.pipelines.distilbert`), which takes the
teacher's family, size and tokenizer; ``from=RUN`` fine-tunes RUN instead of pre-training; ``finetune.KEY=VALUE``
sets a fine-tuning option (a :class:`sesame.specs.FinetuneSpec`, Recipe or TrainConfig field, or ``precision``) for the
approach's rows. The runtime's other fields (device, TF32, compile) are the machine's choice, the same for every
approach: compare's own flags. Every item is typed and checked when parsed, so a bad one fails before any
training.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import SesameError
from ...families import Family, get_family, get_size
from ...interop.sources import MINILM, minilm_dir, transformers_config
from ...objectives import OBJECTIVES
from ...objectives.distillation import Distillation
from ...options import defaults as option_defaults
from ...options import flag_name, parse_value
from ...pipelines.distilbert import STUDENT_OBJECTIVE, TEACHERS_OWN
from ...run import RunConfig
from ...runtime import Runtime
from ...sources import resolve_source
from ...specs import FINETUNE_TRAINING, FinetuneSpec, PretrainSpec
from ...tasks import POOLINGS
from ...train import TrainConfig
from ...train.recipes import Recipe
from .values import typed

if TYPE_CHECKING:
    from .tasks import CompareTask

# set by compare itself, the same for every approach
RESERVED = {"corpus", "out", "family", "size", "valid", "resume", "explicit", "progress", "objective_options",
            "training", "max_minutes", "max_steps", "seed"}
FINETUNE = "finetune."  # an approach's item finetune.KEY=VALUE sets api.finetune's KEY for its rows
# api.finetune keywords compare sets itself: the task's files and columns, the run, the seed (the same for every
# row) and the budget (whole epochs, evaluated and saved after each)
FINETUNE_RESERVED = {"base", "train", "dev", "out", "task", "text_column", "label_column", "task_options", "tokenizer",
                     "recipe", "training", "resume", "progress", "select", "seed", "max_steps", "max_minutes",
                     "eval_every", "save_every", "explicit"}


@dataclass
class Approach:
    """One approach: a family, a size, pre-training options (or an existing run to start from) and
    fine-tuning options of its own."""
    spec: str  # as written: FAMILY:SIZE[:KEY=VALUE...]
    family: str
    size: str
    options: dict  # keyword arguments for sesame.pretrain
    row: Family = field(repr=False)  # the family's registry row
    finetune: dict = field(default_factory=dict)  # keyword arguments for sesame.finetune (finetune.KEY=VALUE)
    base: str | None = None  # from=RUN: fine-tune this run instead of pre-training

    @property
    def slug(self) -> str:
        return dir_name(self.spec)

    @property
    def kind(self) -> str:
        """``pretrained``, or ``baseline`` for a family without pre-training (trained from scratch)."""
        return "pretrained" if self.base or self.row.objective else "baseline"

    @property
    def pretrains(self) -> bool:
        """Whether compare pre-trains it (not a baseline, not ``from=`` a run)."""
        return self.kind == "pretrained" and not self.base

    @property
    def distils(self) -> bool:
        """Whether it pre-trains a student of a ``teacher=`` (DistilBERT), whose family, size and tokenizer are the
        teacher's and whose layers are some of the teacher's."""
        return self.options.get("teacher") is not None

    @property
    def has_twin(self) -> bool:
        """Whether a from-scratch twin measures its pre-training: not for baselines (scratch already), feature
        extractors (their task model is a BiLSTM, not their own network), a run sesame did not make or a teacher's
        student (whose architecture ``scratch:FAMILY:SIZE`` may not be: the student has some of the teacher's
        layers)."""
        fam = self.row
        return fam.objective is not None and fam.reader.scratch_refusal(fam) is None and not self.distils and \
            (self.base is None or run_config(self.base) is not None)

    def pretraining(self) -> dict:
        """Its keywords for ``sesame.pretrain``: the family, the size and its pre-training options; a student takes its
        teacher's family and size, so they are not given (``sesame pretrain --teacher`` refuses them)."""
        model = {} if self.distils else {"family": self.family, "size": self.size}
        return {**model, **self.options}

    def run_dir(self, pretrained: Path) -> Path:
        """The run it fine-tunes: its ``from=`` run, or its directory under ``pretrained``."""
        return Path(self.base) if self.base else pretrained / self.slug

    def fine_tuning(self, common: dict, task: CompareTask) -> dict:
        """Its fine-tuning options on ``task``: the command's ``common`` ones < the family's defaults
        (``Family.finetune``) < the task's own < the approach's ``finetune.KEY=VALUE`` items."""
        return {**common, **self.row.finetune, **task.options, **self.finetune}


PRECISION = "precision"  # the one runtime field an approach may set: a setting, unlike the machine's device
RUNTIME = {f.name for f in fields(Runtime)}


def _runtime_item(where: str, key: str, text: str) -> str:
    """``precision=VALUE`` (or ``finetune.precision``) checked against the precisions; any other runtime field is
    refused, naming compare's flag for it."""
    name = key.removeprefix(FINETUNE)
    if name != PRECISION:
        flag = flag_name(next(f for f in fields(Runtime) if f.name == name))
        raise SesameError(f"{where}: {key} is the machine's choice, the same for every approach; give compare {flag}")
    return parse_value(Runtime, PRECISION, text, where)


def dir_name(name: str) -> str:
    """``name`` as a directory name: ``:`` and anything unusual become ``-``."""
    return re.sub(r"[^\w.=+-]+", "-", name.replace(":", "-"))


def _pretraining_defaults() -> dict:
    """Every pre-training option an approach may name, with its default: PretrainSpec's (its distillation's too) and
    TrainConfig's fields, but those compare sets itself (``RESERVED``)."""
    defaults = {**option_defaults(PretrainSpec), **option_defaults(Distillation), **option_defaults(TrainConfig)}
    return {k: v for k, v in defaults.items() if k not in RESERVED and k != "distillation"}  # its fields are keys


def _finetune_defaults() -> dict:
    """Every option a ``finetune.KEY`` item may name, with its default: sesame.finetune's keywords and
    TrainConfig's fields, but those compare sets itself (``FINETUNE_RESERVED``)."""
    defaults = {**option_defaults(FinetuneSpec), **option_defaults(Recipe), **option_defaults(TrainConfig)}
    return {k: v for k, v in defaults.items() if k not in FINETUNE_RESERVED}


def run_config(base: str) -> RunConfig | None:
    """The config.json of ``base`` if it is a run sesame made (pretrained or fine-tuned), else None."""
    source = resolve_source(base, "from=") if (Path(base) / "config.json").is_file() else None
    return source.config if source is not None else None


# a model an approach names: from=RUN (fine-tuned instead of pre-training) or teacher=MODEL → the runs it may be
MODEL_KEYS = {"from": "a run (of sesame pretrain, sesame cove, sesame ulmfit's target-lm)",
              "teacher": "a pretrained masked LM run (sesame pretrain)"}


def _check_model(spec: str, fam: Family, size: str, key: str, model: str) -> None:
    """``KEY=model`` (:data:`MODEL_KEYS`): a run of this family and size, a transformers directory or ``minilm``."""
    where = f"--approaches {spec}: {key}={model}"
    if model == MINILM:
        try:
            minilm_dir()  # installed?
        except SesameError as err:
            raise SesameError(f"{where}: {err}") from None
        return
    if not Path(model).is_dir():
        raise SesameError(f"{where}: no such directory; give {MODEL_KEYS[key]}, a transformers model directory or "
                          "minilm")
    config = run_config(model)
    if config is None:
        if transformers_config(Path(model)) is None:
            raise SesameError(f"{where}: neither a sesame run nor a transformers model directory (no config.json "
                              "with kind or model_type)")
        return
    if (config.family, config.size) != (fam.name, size):
        raise SesameError(f"{where}: a {config.family} {config.size} run; write "
                          f"{config.family}:{config.size}:{key}={model}")


def _check_items(spec: str, fam: Family, options: dict, objective: dict) -> None:
    """The pre-training items of ``spec`` that a spec checks only once it reads its files, checked now: DistilBERT's
    keys (only with ``teacher=``, in range) and none of what a student takes from its teacher; the objective
    options against the objective's (a student's: :data:`STUDENT_OBJECTIVE`)."""
    where = f"--approaches {spec}"
    teacher = options.get("teacher")
    names = {f.name for f in fields(Distillation)}
    try:
        Distillation(**{k: v for k, v in options.items() if k in names}).check(teacher)
    except SesameError as err:
        raise SesameError(f"{where}: {err} (an approach's keys: teacher, {', '.join(sorted(names))})") from None
    if teacher is not None:
        own = [key for key in options if key in TEACHERS_OWN]
        if own:
            raise SesameError(f"{where}: {', '.join(own)}: a student has its teacher's family, size, tokenizer and "
                              f"width (teacher={teacher}); drop {'it' if len(own) == 1 else 'them'}")
    name = STUDENT_OBJECTIVE if teacher is not None else options.get("objective") or fam.objective
    known = set(OBJECTIVES[name].options) if name in OBJECTIVES else set(objective)  # else: pretrain says
    unknown = sorted(set(objective) - known)
    if unknown:
        raise SesameError(f"{where}: {', '.join(unknown)}: neither a pre-training option nor an option of the {name} "
                          f"objective ({', '.join(sorted(known)) or 'it has none'}); pre-training options are "
                          "`sesame pretrain`'s and the training settings (lr, batch_size, ...)")


def _parse_finetune(spec: str, fam: Family, kind: str, items: dict) -> dict:
    """The ``finetune.KEY=VALUE`` items of ``spec``, typed like the fine-tuning defaults and checked now,
    so a bad one fails before any training."""
    where, known, options = f"--approaches {spec}", _finetune_defaults(), {}
    text_options = {f.name for cls in (FinetuneSpec, Recipe) for f in fields(cls)
                    if str(f.type).startswith("str")}  # paths and names, never read as JSON
    for key, text in items.items():
        if key in RUNTIME:
            options[key] = _runtime_item(where, FINETUNE + key, text)
            continue
        if key in FINETUNE_RESERVED:
            raise SesameError(f"{where}: finetune.{key} is set by compare for every row alike (the task, --seed, "
                              "epochs as the budget)")
        if key not in known:
            raise SesameError(f"{where}: finetune.{key} is not a fine-tuning option; use one of "
                              f"{', '.join(sorted(known))}")
        # compare's and the family's defaults differ from FinetuneSpec's, so none is shown as "the default"
        options[key] = text if key in text_options else typed(where, f"finetune.{key}", text, known[key], False)
    if "vectors" in options:
        refusal = fam.reader.vectors_refusal(fam, scratch=kind == "baseline")  # a baseline: scratch:FAMILY:SIZE
        if refusal:
            raise SesameError(f"{where}: finetune.vectors {refusal}")
        if not Path(options["vectors"]).is_file():
            raise SesameError(f"{where}: finetune.vectors={options['vectors']}: no such file (GloVe or word2vec text)")
    if options.get("pooling") is not None and options["pooling"] not in POOLINGS:
        raise SesameError(f"{where}: finetune.pooling={options['pooling']}: choose one of {', '.join(POOLINGS)}")
    train = {k: v for k, v in options.items() if k in {f.name for f in fields(TrainConfig)}}
    try:
        TrainConfig(**{**FINETUNE_TRAINING, **fam.finetune, **train}).validate()
    except SesameError as err:
        raise SesameError(f"{where}: fine-tuning {err} (set it with finetune.KEY=VALUE)") from None
    return options


def parse_approach(spec: str) -> Approach:
    """One approach (module docstring); ``from=RUN`` takes anything ``sesame finetune --from`` takes."""
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
    pretraining = {k: v for k, v in given.items() if not k.startswith(FINETUNE)}
    if base is None and fam.objective is None and fam.reader.scratch_refusal(fam):  # neither pre-trained nor a baseline
        raise SesameError(f"--approaches {spec}: {family} is not pre-trained by compare; train it with "
                          f"`sesame {family}` and give the run: {family}:{size}:from=RUN")
    if pretraining and (base is not None or fam.objective is None):
        why = f"starts from {base}" if base is not None else f"({family}) is a baseline without pre-training"
        raise SesameError(f"--approaches {spec}: {', '.join(pretraining)}: pre-training options, but this approach "
                          f"{why}; give fine-tuning options as finetune.KEY=VALUE, e.g. finetune.lr=1e-3")
    if base is not None:
        _check_model(spec, fam, size, "from", base)
    known, options, objective = _pretraining_defaults(), {}, {}
    for key, text in pretraining.items():
        if key in RUNTIME:
            options[key] = _runtime_item(f"--approaches {spec}", key, text)
            continue
        if key in RESERVED:
            raise SesameError(f"--approaches {spec}: {key} is set by compare for every approach alike "
                              "(--minutes, --max-steps, --seed, --corpus, --valid)")
        if key in known and known[key] is not None:
            options[key] = typed(f"--approaches {spec}", key, text, known[key])
        elif key in known:  # a PretrainSpec (or Distillation) field without a default to type it by: by its annotation
            declared = Distillation if key in {f.name for f in fields(Distillation)} else PretrainSpec
            options[key] = parse_value(declared, key, text, f"--approaches {spec}")
        else:  # the objective's, checked against its options below
            objective[key] = typed(f"--approaches {spec}", key, text, None)
    if options.get("teacher") is not None:
        _check_model(spec, fam, size, "teacher", options["teacher"])
    _check_items(spec, fam, options, objective)
    try:
        train = {f.name for f in fields(TrainConfig)}
        TrainConfig(**{**fam.recipe, **{k: v for k, v in options.items() if k in train}}).validate()
    except SesameError as err:
        raise SesameError(f"--approaches {spec}: {err}") from None
    approach = Approach(spec, family, size, {**options, **({"objective_options": objective} if objective else {})},
                        fam, base=base)
    approach.finetune = _parse_finetune(spec, fam, approach.kind, tuning)
    return approach
