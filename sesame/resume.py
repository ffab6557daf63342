"""``--resume``: continue a run as it was made.

A run records how it was made: config.json (and :data:`SETUP`, the set-up options no other field holds) and
its checkpoint's trainer state. Resuming may change only the budget, :data:`RESUMABLE`: more steps, minutes
or epochs, and the new values are recorded in config.json. Every other option given with ``--resume`` must
agree with what the run recorded, else it is refused, naming the flag, the value given and the run's; an option
not given takes the run's value. (Runs made before :data:`SETUP` was recorded are checked on the rest.)
The runtime (:mod:`sesame.runtime`) is the machine's choice, not the run's: any device, TF32 and compile setting
may resume a run, and its precision is the run's unless ``--precision`` is given.
"""
from __future__ import annotations

from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Callable

from .errors import SesameError
from .interop.sources import MINILM
from .objectives.distillation import Distillation
from .options import flag_name
from .run import RunConfig, read_config, write_config
from .rundir import setup_killed
from .runtime import Runtime
from .specs import AUTO, DistilSpec, FinetuneSpec, PretrainSpec, layer_pairs
from .tasks.mixing import read_mixture
from .train import TrainConfig
from .train.checkpoint import checkpoint_dir, read_json
from .train.recipes import Recipe

RESUMABLE = ("max_steps", "max_minutes", "epochs")  # the budget: all that --resume may change
# set-up options recorded in config.json's "setup", for --resume to check (paths resolved)
FINETUNE_SETUP = ("tokenizer", "cased", "drop_mult", "dropout")  # dropout: as given, not as scaled or moved
SETUP = {PretrainSpec: ("corpus", "valid", "tokenizer", "vocab_size", "cased", "text_field", "drop_mult"),
         FinetuneSpec: (*FINETUNE_SETUP, "mixture", "mixing_cap", "mixing_temperature"),
         DistilSpec: (*FINETUNE_SETUP, "teacher", "unlabeled", "loss", "temperature", "alpha", "hidden_weight",
                      "layer_map")}  # layer_map: as the run resolved it (sesame.pipelines.distil)
# a pretrain run's with --teacher: the teacher and its distillation's fields (student_layers: as the run resolved them,
# sesame.pipelines.distilbert)
TEACHER_SETUP = ("teacher", "student_layers", "kl_weight", "mlm_weight", "cosine_weight", "temperature",
                 "train_positions", "mlm_smoothing")
# what a run pre-trained with a teacher before DistilBERT's frozen positions and smoothed masking were its defaults did
TEACHER_BEFORE = {"train_positions": True, "mlm_smoothing": 0.0}
PATHS = ("corpus", "valid", "tokenizer", "base", "train", "dev", "train_src", "train_tgt", "valid_src", "valid_tgt",
         "vectors", "mixture", "teacher", "unlabeled")
COLUMNS = ("text_column", "label_column", "pair_column", "symmetric")  # task options with flags of their own
MOVED = ("precision",)  # TrainConfig fields of older runs that the runtime holds now
# settings whose written forms differ where their meanings agree, compared as read: a layer map is a set of pairs
READ = {"layer_map": lambda items: sorted(layer_pairs(items))}


def resolved(value: object) -> object:
    """A path made absolute; not ``scratch:...`` nor ``minilm``, which name no file (sesame.sources)."""
    if isinstance(value, list):
        return [str(Path(p).resolve()) for p in value]
    if not isinstance(value, (str, Path)) or ":" in str(value) or str(value) == MINILM:
        return value
    return str(Path(value).resolve())


def setup_record(spec: PretrainSpec | FinetuneSpec) -> dict:
    """config.json's ``setup``: the spec's :data:`SETUP` options (and a teacher's, :data:`TEACHER_SETUP`), paths
    resolved."""
    names = (*SETUP[type(spec)], *(TEACHER_SETUP if isinstance(spec, PretrainSpec) and spec.teacher else ()))
    return {name: resolved(_value(spec, name)) if name in PATHS else _value(spec, name) for name in names}


def _explicit(spec: PretrainSpec | FinetuneSpec) -> set[str]:
    """The fields the user set (``spec.explicit``, else those not at their default), without those set to None."""
    if getattr(spec, "explicit", None) is not None:
        names = set(spec.explicit)
    else:
        defaults = {f.name: f.default for f in fields(spec)}
        names = {f.name for f in fields(spec) if getattr(spec, f.name) != defaults[f.name]}
        for part in _parts(spec):
            names |= {f.name for f in fields(part) if getattr(part, f.name) != f.default}
    return {name for name in names if _value(spec, name) is not None}


def _parts(spec: PretrainSpec | FinetuneSpec) -> tuple:
    """The typed parts of ``spec`` whose fields are options of their own: a fine-tuning's recipe, a pre-training's
    distillation (with a teacher)."""
    part = spec.recipe if isinstance(spec, FinetuneSpec) else getattr(spec, "distillation", None)
    return (part,) if part is not None else ()


def _value(spec: PretrainSpec | FinetuneSpec, name: str) -> object:
    """The spec's field ``name``, or its parts' (None where it has no such part)."""
    if hasattr(spec, name):
        return getattr(spec, name)
    return next((getattr(part, name) for part in _parts(spec) if hasattr(part, name)), None)


def _show(value: object) -> str:
    text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(flag: str, given: object, recorded: object, spec: PretrainSpec | FinetuneSpec) -> None:
    budget = ", ".join("--" + name.replace("_", "-") for name in RESUMABLE
                       if hasattr(spec, name) or name in {f.name for f in fields(TrainConfig)})
    raise SesameError(f"{flag} {_show(given)}: the run in {spec.out} was made with {_show(recorded)}, and --resume "
                      f"changes only its budget ({budget}); give the run's value or leave {flag} out, or choose a "
                      "new --out")


def _check(flag: str, given: object, recorded: object, spec: PretrainSpec | FinetuneSpec, *,
           path: bool = False, read: Callable[[Any], object] | None = None) -> None:
    """Refuse ``given`` unless it agrees with ``recorded`` (paths: once resolved; others: as ``read`` reads them, or
    as they are)."""
    if recorded is None or given is None:
        return
    if path:
        same = given == recorded or resolved(given) == resolved(recorded)
    else:
        same = given == recorded if read is None else read(given) == read(recorded)
    if not same:
        _refuse(flag, given, recorded, spec)


def _training(spec: PretrainSpec | FinetuneSpec, config: RunConfig) -> dict:
    """The TrainConfig to resume with: the run's (its checkpoint's trainer state, else config.json's), with the
    budget given now; any other training option that differs is refused. A field the run predates takes
    TrainConfig's own default, which keeps what the code that made it did (``eval_points``: none), not the defaults
    a new run of the command gets."""
    ckpt = checkpoint_dir(Path(spec.out))
    recorded = read_json(ckpt / "trainer_state.json")["config"] if ckpt is not None else dict(config.train or {})
    recorded = {name: value for name, value in recorded.items() if name not in MOVED}
    if recorded:
        recorded = {**{f.name: f.default for f in fields(TrainConfig) if f.name not in recorded}, **recorded}
    flags = {f.name: flag_name(f) for f in fields(TrainConfig)}
    for name, value in spec.training.items():
        if name not in RESUMABLE and value is not None:
            _check(flags.get(name, name), value, recorded.get(name), spec)
    return {**recorded, **{k: v for k, v in spec.training.items() if k in RESUMABLE and v is not None}}


def _runtime(spec: PretrainSpec | FinetuneSpec, config: RunConfig) -> Runtime:
    """The runtime to resume with: the one given, with the run's precision unless ``--precision`` was given (older
    runs kept it in their TrainConfig)."""
    if spec.runtime.precision is not None:
        return spec.runtime
    older = (config.train or {}).get("precision")
    return replace(spec.runtime, precision=(config.runtime or {}).get("precision", older))


def _check_fields(spec: PretrainSpec | FinetuneSpec, recorded: dict, explicit: set[str], *, paths: bool) -> None:
    """Check the ``explicit`` fields of ``spec`` against their ``recorded`` values, in the record's order: the paths
    (``paths``) or the others (checked first: they say more)."""
    declared = [*fields(spec), *(fields(Distillation) if isinstance(spec, PretrainSpec) else ())]
    flags = {f.name: flag_name(f) for f in declared}
    for name, value in recorded.items():
        if name in explicit and (name in PATHS) == paths:
            _check(flags[name], _value(spec, name), value, spec, path=paths, read=READ.get(name))


def resumed_pretraining(spec: PretrainSpec) -> PretrainSpec:
    """``spec`` as the run in ``spec.out`` was made, with the budget given now; refuses an option that
    contradicts the run. A run killed in its setup recorded nothing: it starts afresh."""
    if setup_killed(spec.out):
        return replace(spec, resume=False)
    config = read_config(spec.out, "--out", ("pretrained",))
    part = config.pretrained
    if config.hf and part.shards is None:  # converted (sesame convert --from-hf): pre-trained elsewhere
        raise SesameError(f"--resume: {spec.out} was converted from transformers, not pre-trained by sesame, so it "
                          f"has no training to resume; continue its pre-training in a new run: sesame pretrain --from "
                          f"{spec.out} --corpus FILES --out NEW")
    recorded = {"family": config.family, "size": AUTO if part.sizing else config.size, "objective": part.objective,
                "seq_len": part.seq_len, "static_masks": part.static_masks, "final_seq_len": part.final_seq_len,
                "discriminative": part.discriminative, "embedding_init": part.embedding_init,
                "embedding_rate": part.embedding_rate, "base": config.base,
                "mixing_temperature": part.corpus_mixing.temperature if part.corpus_mixing else None,
                "dropout": config.model.dropout, "attention_window": getattr(config.model, "attention_window", None),
                **(TEACHER_BEFORE if "teacher" in config.setup else {}), **config.setup}
    explicit = _explicit(spec)
    _check_fields(spec, recorded, explicit, paths=False)
    for key, value in spec.objective_options.items():
        flag = f"--{key}" if key in ("masking", "phrases") else f"--objective-option {key}"
        _check(flag, value, part.objective_options.get(key, "the objective's default"), spec)
    for key, value in spec.model_options.items():
        _check(f"--model-option {key}", value, getattr(config.model, key, None), spec)
    if spec.mixing_temperature is not None and part.corpus_mixing is None:  # (else checked with the fields)
        _refuse("--mixing-temperature", spec.mixing_temperature, "no mixing", spec)
    training = _training(spec, config)
    _check_fields(spec, recorded, explicit, paths=True)
    if spec.teacher is not None and "teacher" not in config.setup:
        raise SesameError(f"--teacher {spec.teacher}: the run in {spec.out} was pre-trained without a teacher, and "
                          "--resume changes only its budget; leave --teacher out, or choose a new --out")
    teacher = spec.teacher or config.setup.get("teacher")
    taught = {f.name: recorded[f.name] for f in fields(Distillation) if recorded.get(f.name) is not None}
    distillation = replace(spec.distillation or Distillation(), **taught) if teacher else spec.distillation
    return replace(spec, **_kept(spec, recorded), objective_options=part.objective_options, training=training,
                   runtime=_runtime(spec, config), teacher=teacher, distillation=distillation)


def resumed_finetuning(spec: FinetuneSpec) -> FinetuneSpec:
    """``spec`` as the fine-tuned run in ``spec.out`` was made, with the budget (epochs, steps, minutes) given
    now; refuses an option that contradicts the run. A run killed in its setup recorded nothing: it starts afresh."""
    if setup_killed(spec.out):
        return replace(spec, resume=False)
    config = read_config(spec.out, "--out", ("finetuned",))
    tuned = config.finetuned
    recorded = {"task": tuned.task, "select": tuned.select, "max_length": config.max_length,
                "pooling": config.pooling, "dropout": config.model.dropout, "batching": tuned.batching,
                **config.setup,
                "base": config.base, "train": tuned.train_file, "dev": tuned.dev_file}
    explicit = _explicit(spec)
    _check_fields(spec, recorded, explicit, paths=False)
    _check_mixture(spec, config)
    for key, value in spec.task_options.items():
        flag = f"--{key.replace('_', '-')}" if key in COLUMNS else f"--task-option {key}"
        _check(flag, value, tuned.task_options.get(key), spec)
    for f in fields(Recipe):
        if f.name in explicit:
            recorded_value = getattr(tuned.recipe, f.name) if tuned.recipe is not None else None
            _check(flag_name(f), getattr(spec.recipe, f.name), recorded_value, spec)
    training = _training(spec, config)
    _check_fields(spec, recorded, explicit, paths=True)
    epochs = spec.epochs if "epochs" in explicit else tuned.epochs
    if "epochs" in explicit and "max_steps" not in spec.training:
        training.pop("max_steps", None)  # the new epochs set the steps
    return replace(spec, **_kept(spec, recorded), task_options=tuned.task_options, epochs=epochs, training=training,
                   recipe=tuned.recipe if tuned.recipe is not None else spec.recipe,
                   runtime=_runtime(spec, config))


def _check_mixture(spec: FinetuneSpec, config: RunConfig) -> None:
    """A run fine-tuned on a mixture resumes on the same tasks: --mixture given again, its tasks' files and options
    as recorded (config.json's ``mixture``); a run of one task resumes without one."""
    mixture = config.finetuned.mixture
    if spec.mixture is None or mixture is None:
        if (spec.mixture is None) != (mixture is None):
            how = f"with --mixture ({', '.join(mixture)})" if mixture else "on --train and --dev"
            raise SesameError(f"--resume: the run in {spec.out} was fine-tuned {how}; give the same files, or choose "
                              "a new --out")
        return
    now = read_mixture(spec.mixture)
    for name in dict.fromkeys([*mixture, *now]):
        made = {k: v for k, v in mixture.get(name, {}).items() if k != "labels"} or None
        if now.get(name) != made:
            raise SesameError(f"--mixture {spec.mixture}: task {name!r} is {now.get(name, 'absent')}, but the run in "
                              f"{spec.out} was made with {made or 'no such task'}; --resume changes only the budget: "
                              "give the run's mixture, or choose a new --out")


def resumed_spec(spec: Any, config: RunConfig, recorded: dict) -> Any:
    """An application's spec (``sesame cove``'s) as its run was made: the ``recorded`` values (spec field →
    the run's value), the run's training with the budget given now and its precision unless one is given;
    refuses an option that contradicts them."""
    explicit = _explicit(spec)
    _check_fields(spec, recorded, explicit, paths=False)
    training = _training(spec, config)
    _check_fields(spec, recorded, explicit, paths=True)
    return replace(spec, **_kept(spec, recorded), training=training, runtime=_runtime(spec, config))


def _kept(spec: PretrainSpec | FinetuneSpec, recorded: dict) -> dict:
    """The recorded values the resumed spec takes: its fields', but for paths (as given now, checked equal)."""
    names = {f.name for f in fields(spec)}
    return {name: value for name, value in recorded.items() if name in names and name not in PATHS
            and value is not None}


def record_training(run: Path, config: RunConfig, cfg: TrainConfig, epochs: int | None = None, *,
                    runtime: dict | None = None) -> RunConfig:
    """The run's ``config`` with its TrainConfig (and epochs, and the ``runtime`` it trains with now), written to its
    config.json when they changed (a resume's budget, another device)."""
    tuned = config.finetuned if epochs is None else replace(config.finetuned, epochs=epochs)
    recorded = replace(config, train=asdict(cfg), runtime=runtime if runtime is not None else config.runtime,
                       finetuned=tuned)
    if recorded != config:
        write_config(run, recorded)
    return recorded
