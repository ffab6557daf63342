"""``sesame finetune``: a :class:`FinetuneSpec` → a fine-tuned run directory.

The model it starts from is resolved once (:func:`sesame.sources.resolve_source`): a run, a
transformers directory, ``minilm`` or ``scratch:FAMILY:SIZE``. Its configuration becomes the task
model's through the family's hooks (GPT's input tokens; a frozen feature extractor read beside new
embeddings), the recipe's techniques (:meth:`sesame.train.recipes.Recipe.techniques`: what the backbone
carries, what trains, how fast, which losses are added) are driven through one protocol, the task
(:mod:`sesame.tasks`) reads the files and builds the head, and the trainer keeps the best dev epoch.
Those steps are :func:`train_task_model`, which ``sesame distil`` shares: a :class:`Teaching` says what the task
model learns from (here :class:`GoldAnswers`, the training file's).
"""
from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields, replace
from itertools import accumulate
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..data.mixing import mixing_rates, mixture_example
from ..errors import SesameError
from ..families import Family, backbone_config, head_dropouts, run_family
from ..inputs import grow_token_embedding
from ..models import ModelConfig, position_limit
from ..models.additions import Additions, inserted
from ..options import flag_name
from ..resume import record_training, resumed_finetuning, setup_record
from ..run import FinetunedPart, RunConfig, build_backbone, load_tokenizer, read_config, write_config
from ..rundir import check_batch, claimed_run, from_checkpoint
from ..sources import SCRATCH, Source, resolve_source
from ..specs import FinetuneSpec, default_epochs
from ..tasks import BATCHINGS, Task, TaskModel, bucketed_batches, infer, make_task, steps_per_epoch
from ..tasks.mixing import MEAN, SHARED, mixture_metrics, mixture_scores, read_mixture
from ..tokenizer import TextTokenizer, train_tokenizer
from ..train import RunSettings, Trainer, TrainConfig, recipes
from ..train.checkpoint import load_weights, write_json
from ..data.vectors import embedding_matrix, load_vectors
from ..train.recipes import Recipe, Techniques
from ..train.trainer import micro_batches, world
from .starts import counted_table
from .teaching import GoldAnswers, Teaching

SCRATCH_VOCAB = 8000  # the tokenizer a scratch model trains on its training texts
# TrainConfig fields the epochs decide unless given: the budget (the epochs' steps), dev evaluations and checkpoints
# (each epoch's end; given, they fall inside epochs too: a step's batches are a function of the step)
BY_EPOCH = ("max_steps", "eval_every", "save_every")


def finetune(spec: FinetuneSpec) -> dict:
    """Fine-tune as ``spec`` says; evaluates on dev after every epoch (or every ``--eval-every`` steps) and keeps the
    weights with the best dev ``select`` metric. Returns the kept weights' dev metrics with the trainable and total
    parameter counts."""
    started = time.time()
    if spec.resume:
        spec = resumed_finetuning(spec)  # as the run was made, with the budget given now
    return train_task_model(spec, GoldAnswers(), started=started)


def train_task_model(spec: FinetuneSpec, teaching: Teaching, *, started: float) -> dict:
    """A task model trained as ``spec`` says on what ``teaching`` gives (:func:`finetune`, and ``sesame distil``), from
    the command's start ``started``. Read top to bottom: resolve the model it starts from and read the data; a new
    run's :class:`Plan` (config.json and tokenizer) is made and written; the task model is built, its starting
    weights loaded and the recipe's techniques applied; the weights with the best dev ``select`` metric are kept.
    Returns their dev metrics with the trainable and total parameter counts."""
    spec.validate(processes=world()[1])
    placement = spec.runtime.place()
    resumed = from_checkpoint(spec.out, spec.resume)
    source = None if resumed else resolve_source(spec.base, base_flag(spec))
    family, size, scratch = _trained_model(spec, source)
    cfg = spec.train_config(family, size=size, scratch=scratch)
    data = _read(spec, make_task(spec.task, spec.task_options), teaching)
    check_batch(cfg)
    with (source.open() if source else nullcontext(None)) as base_dir, \
            claimed_run(spec.out, "finetuned", spec.resume,
                        lambda run: plan(source, base_dir, spec, data, cfg).write(run, data)) as run:
        config = read_config(run, "--out", ("finetuned",))
        data.for_family(family)  # as rank 0's plan did (under torchrun, the other ranks)
        tok = load_tokenizer(run)
        torch.manual_seed(cfg.seed)
        model = data.job.build(build_backbone(config), len(data.labels), config.pooling, spec.head_dropout)
        recipe = config.finetuned.recipe
        techniques = recipe.techniques()
        coverage = {} if resumed else _start_weights(model, source, base_dir, recipe, tok,
                                                     fresh=techniques.fresh(model), progress=spec.progress)
        recipes.freeze_features(model.backbone)
        techniques.prepare(model)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        settings = RunSettings(run, cfg, placement=placement, progress=spec.progress, started=started)
        trainer, epochs = _trainer(teaching.learner(model, run, data.train), model, settings, spec, data, tok,
                                   techniques)
        # recorded: the epochs and steps the training set's size decided, or a resume's budget
        metrics = trainer.fit(resume=resumed, record=lambda: record_training(  # the TrainConfig the epochs decided
            run, config, trainer.config, epochs, runtime=spec.runtime.record(placement)))
        _record_threshold(run, metrics)
        return {**metrics, **coverage, "trainable_parameters": trainable,
                "parameters": sum(p.numel() for p in model.parameters())}


def _record_threshold(run: Path, metrics: dict) -> None:
    """SQuAD 2.0: the no-answer threshold tuned on dev, recorded in config.json's task options (by rank 0) for
    evaluate and predict, in the run's config as training recorded it."""
    threshold = metrics.get("null_threshold")
    if threshold is None or world()[0] != 0:
        return
    config = read_config(run, "--out", ("finetuned",))
    options = config.finetuned.task_options
    if threshold != options.get("null_threshold"):
        tuned = replace(config.finetuned, task_options={**options, "null_threshold": threshold})
        write_config(run, replace(config, finetuned=tuned))


@dataclass(frozen=True)
class Plan:
    """A new fine-tuned run, decided before anything is written: its config.json (the backbone as the task model
    reads it, the recipe, the task and its data) and its tokenizer."""
    config: RunConfig
    tok: TextTokenizer

    def write(self, run: Path, data: _Data) -> None:
        """tokenizer.json, labels.json (a task with labels) and config.json, the last."""
        self.tok.save(run / "tokenizer.json")
        if data.job.has_labels:
            write_json(run / "labels.json", data.labels)
        write_config(run, self.config)


def plan(source: Source, base_dir: Path | None, spec: FinetuneSpec, data: _Data, cfg: TrainConfig) -> Plan:
    """The :class:`Plan` of a task model of ``data.job`` starting from ``source`` (its run directory ``base_dir``) as
    ``spec`` and its recipe say: the starting point's configuration through the family's hooks (dropouts, GPT's
    input tokens, ULMFiT's documents, XLNet's ``<cls>`` last) and the recipe's techniques, checked against the task,
    the positions and what the task model learns from (``data.teaching``)."""
    config, tok = starting_point(source, base_dir, spec, _texts(data.train))
    model = replace(config.model, **spec.recurrent_dropouts(config.family, spec.dropout, arch=config.model.arch,
                                                            what=f"{source.flag} {source.given}"))
    pooling = spec.pooling or config.pooling
    model = replace(model, **head_dropouts(model, head_drops=data.job.head_drops))  # recurrent: the head's, once
    fam = source.family
    model = fam.inputs.frame(model, tok)  # gpt's input tokens; ulmfit: after </s>; xlnet: <sep> <cls>; t5: no <s>
    data.job.check_model(model)
    data.for_family(fam)  # the task options left to the family, recorded below
    recipe = spec.recipe.with_defaults(fam.finetune_recipe)
    techniques = recipe.techniques()
    model = techniques.configure(model, source=f"{source.flag} {source.given} is a {config.family} model")
    model = _word_vectors(model, recipe, source)
    positions = position_limit(model)  # None: any length (T5's relative positions)
    if positions is not None and spec.max_length > positions:
        raise SesameError(f"--max-length {spec.max_length} exceeds the model's {positions} positions")
    tuned = FinetunedPart(task=spec.task, task_options=data.options(), select=data.select, recipe=recipe,
                          epochs=spec.epochs, batching=spec.batching, train_file=spec.train, dev_file=spec.dev,
                          mixture=data.record())
    return Plan(RunConfig(
        kind="finetuned", family=config.family, size=config.size, pooling=pooling, model=model,
        additions=techniques.insert(Additions()), base=spec.base, max_length=spec.max_length, hf=config.hf,
        train=_as_given(cfg, spec), setup={**setup_record(spec), **data.teaching.record(config, tok)},
        finetuned=tuned), tok)


def _start_weights(model: TaskModel, source: Source, base_dir: Path | None, recipe: Recipe, tok: TextTokenizer, *,
                   fresh: list[nn.Module], progress: bool) -> dict:
    """A new run's starting weights: the pretrained ones (none for a scratch model; a counted twin's token table
    from its run's counts) but in the ``fresh`` modules, which keep the initialisation they were built with
    (``--reinit-layers``), and ``--vectors`` in the word embedding; returns the vectors' coverage of the vocabulary,
    if given."""
    if not source.scratch:
        kept = [copy.deepcopy(module.state_dict()) for module in fresh]
        load_pretrained(model, base_dir, flag=source.flag)
        for module, state in zip(fresh, kept):
            module.load_state_dict(state)
    elif source.counted:
        counted_table(model.backbone, source.config, tok, progress=progress)
    return {"vectors_coverage": _embed_vectors(model.backbone, recipe.vectors, tok)} if recipe.vectors else {}


@dataclass
class _Part:
    """One task's training examples and labeled dev examples: the task (its options), the examples, its labels."""
    job: Task
    train: list[dict]
    dev: list[dict]
    labels: list[str]


@dataclass
class _Data:
    """What fine-tuning reads: the task that builds the model (``job``) and the examples, of --train and --dev (one
    part, named "") or of each task of a --mixture (its parts, by name, with the files they came from), the dev metric
    that picks the kept weights, and what the training examples teach (``teaching``)."""
    job: Task
    parts: dict[str, _Part]
    select: str
    mixture: dict[str, dict] | None
    teaching: Teaching

    @property
    def train(self) -> list[dict]:
        """Every part's training examples, in order."""
        return [row for part in self.parts.values() for row in part.train]

    @property
    def labels(self) -> list[str]:
        """The label vocabulary of labels.json: the one task's; a mixture's are each task's, in its record."""
        return [] if self.mixture else self.parts[""].labels

    def for_family(self, family: Family | None) -> None:
        for task in [self.job, *(p.job for p in self.parts.values() if p.job is not self.job)]:
            task.for_family(family)

    def options(self) -> dict:
        """config.json's ``task_options``: the task's, or those a mixture's tasks share (:data:`SHARED`; what each
        reads differently is in its record), which a resumed run gives its tasks again."""
        options = self.job.options()
        return {k: v for k, v in options.items() if k in SHARED} if self.mixture else options

    def record(self) -> dict | None:
        """config.json's ``mixture``: each task's files, reading options and labels (None: one task)."""
        if self.mixture is None:
            return None
        return {name: {**files, "labels": self.parts[name].labels} for name, files in self.mixture.items()}

    def scores(self, reports: dict[str, dict]) -> dict:
        """The dev metrics of each part's report: the one task's, or a mixture's (:func:`mixture_scores`)."""
        if self.mixture is None:
            return {k: v for k, v in reports[""].items() if isinstance(v, (int, float))}
        return mixture_scores(reports, {name: part.job.select for name, part in self.parts.items()})


def _read(spec: FinetuneSpec, job: Task, teaching: Teaching) -> _Data:
    """The training examples ``teaching`` gives of --train, and --dev's labeled ones, read by ``job``; or of each task
    of --mixture, read by the task its entry's options make over the shared ones (:mod:`sesame.tasks.mixing`); labels
    checked, --select checked."""
    mixture = read_mixture(spec.mixture) if spec.mixture else None
    files = mixture or {"": {"train": spec.train, "dev": spec.dev, "options": {}}}
    parts = {}
    for name, entry in files.items():
        task = make_task(spec.task, {**spec.task_options, **entry["options"]}) if mixture else job
        train, labels = teaching.examples(task, entry["train"])
        dev = task.read(entry["dev"])
        task.check(dev, labels, entry["dev"])
        parts[name] = _Part(task, train, dev, labels)
    if mixture:
        choices, select = mixture_metrics({n: p.job.metrics(p.labels) for n, p in parts.items()}), MEAN
    else:
        choices, select = job.metrics(parts[""].labels), job.select
    select = spec.select or select
    if select not in choices:
        raise SesameError(f"--select {select!r}: choose one of {', '.join(choices)} for --task {spec.task}"
                          + (f" over --mixture {spec.mixture}" if mixture else ""))
    return _Data(job, parts, select, mixture, teaching)


def _trainer(learner: nn.Module, model: TaskModel, settings: RunSettings, spec: FinetuneSpec, data: _Data,
             tok: TextTokenizer, techniques: Techniques) -> tuple[Trainer, int]:
    """The trainer of ``learner`` (``model``, or a module computing another loss around it) over the batches of
    :func:`_training_order`, evaluating ``model`` on dev (:func:`_dev_evaluation`) and saving a checkpoint after every
    epoch (or every ``--eval-every`` and ``--save-every`` steps where given), with the recipe's parameter groups,
    per-step actions and loss counts; and its epochs (``spec.epochs``, or :func:`sesame.specs.default_epochs` of the
    training set's size and the time budget; a mixture's epoch is as many examples as its tasks hold together). The
    trainer's TrainConfig is a new one: ``settings.config`` with the steps the epochs decide where not given
    (:data:`BY_EPOCH`), which config.json records once the trainer starts (:func:`sesame.resume.record_training`)."""
    cfg = settings.config
    train_features, order, per_labeled_epoch = _training_order(model, spec, data, tok, cfg)
    first_job = data.parts[next(iter(data.parts))].job  # a mixture's tasks frame and batch alike

    def labeled_batches(step: int, progress: float) -> list[dict[str, torch.Tensor]]:
        micro = micro_batches(order(step), cfg.accumulate, lambda part: data.teaching.collate(
            first_job, [train_features[i] for i in part], tok.specials.pad))
        for batch in micro:
            techniques.count(batch)
        return micro

    batches, stride = data.job.training_batches(labeled_batches, tok, spec.max_length, cfg.batch_size, cfg.seed)
    per_epoch = per_labeled_epoch * stride
    epochs = spec.epochs or default_epochs(per_epoch, timed=cfg.max_minutes is not None)
    decided = {name: value for name, value in zip(BY_EPOCH, (epochs * per_epoch, per_epoch, per_epoch))
               if spec.training.get(name) is None}
    cfg = replace(cfg, **decided)
    groups = with_learners_own(techniques.param_groups(model, lr=cfg.lr, weight_decay=cfg.weight_decay), model,
                               learner, lr=cfg.lr, weight_decay=cfg.weight_decay)
    evaluate = _dev_evaluation(model, data, tok, spec.max_length)
    return Trainer(learner, replace(settings, config=cfg), batches, evaluate=evaluate, select=data.select,
                   keeps=model, param_groups=groups,
                   before_step=lambda step: techniques.before_step(step=step, epoch=step // per_epoch)), epochs


def _training_order(model: TaskModel, spec: FinetuneSpec, data: _Data, tok: TextTokenizer,
                    cfg: TrainConfig) -> tuple[list, Callable[[int], list[int]], int]:
    """Every task's training features (in task order), the feature indices of each step's batch (length-bucketed or
    shuffled per epoch; a mixture's draws at the rates of T5's mixing, :func:`sesame.tasks.mixing.mixture_example`)
    and the steps of a pass over the labeled features."""
    causal = model.backbone.config.causal
    features = {name: p.job.features(p.train, tok, spec.max_length, p.labels, causal)
                for name, p in data.parts.items()}
    train_features = [f for part in features.values() for f in part]
    first = dict(zip(features, accumulate([0, *map(len, features.values())])))  # each task's first feature
    sizes = {name: len(part) for name, part in features.items()}
    rates = mixing_rates(sizes, cap=spec.mixing_cap, temperature=spec.mixing_temperature) if data.mixture else None
    per_labeled_epoch = steps_per_epoch(len(train_features), cfg.batch_size)
    lengths = [data.job.length(f) for f in train_features]

    def order(step: int) -> list[int]:
        if rates is not None:
            draws = (mixture_example(rates, sizes, seed=cfg.seed, index=step * cfg.batch_size + j)
                     for j in range(cfg.batch_size))
            return [first[name] + i for name, i in draws]
        epoch, k = divmod(step, per_labeled_epoch)
        return bucketed_batches(lengths, cfg.batch_size, torch.Generator().manual_seed(cfg.seed + epoch),
                                window=BATCHINGS[spec.batching])[k]

    return train_features, order, per_labeled_epoch


def _dev_evaluation(model: TaskModel, data: _Data, tok: TextTokenizer,
                    max_length: int) -> Callable[[nn.Module], dict]:
    """The trainer's dev evaluation: the task model's scores on every task's dev split (not the learner's around
    it), combined as ``data.scores`` does."""
    causal = model.backbone.config.causal
    dev_features = {name: p.job.features(p.dev, tok, max_length, p.labels, causal) for name, p in data.parts.items()}

    def evaluate_dev(_: nn.Module) -> dict:
        reports = {}
        for name, part in data.parts.items():
            outputs = infer(model, part.job, dev_features[name], tok.specials.pad)
            reports[name] = part.job.score(part.dev, dev_features[name], outputs, part.labels)
        return data.scores(reports)

    return evaluate_dev


def _as_given(cfg: TrainConfig, spec: FinetuneSpec) -> dict:
    """config.json's ``train`` until the epoch's steps decide the budget and the evaluation and checkpoint steps
    (:func:`_trainer`, then ``record_training``): those not given are None, so a run killed in between resumes
    deciding them again instead of taking TrainConfig's defaults as given."""
    return {**asdict(cfg), **{name: None for name in BY_EPOCH if spec.training.get(name) is None}}


def with_learners_own(groups: list[dict] | None, model: nn.Module, learner: nn.Module, *, lr: float,
                      weight_decay: float) -> list[dict] | None:
    """A recipe's parameter ``groups`` of ``model``, and the parameters ``learner`` trains beside it (distillation's
    layer maps) at ``lr``, split as every group is: weights decay, biases and norms do not. None (AdamW's default
    groups, which split the learner whole) where the recipe gives none."""
    ours = {id(p) for p in model.parameters()}
    added = [p for p in learner.parameters() if id(p) not in ours]
    if groups is None or not added:
        return groups
    return [*groups, *recipes.discriminative_param_groups([added], lr, weight_decay, factor=1.0)]


def base_flag(spec: FinetuneSpec) -> str:
    """The flag that names the model a task model starts from: ``--from`` (finetune), ``--student`` (distil)."""
    return next(flag_name(f) for f in fields(spec) if f.name == "base")


def _trained_model(spec: FinetuneSpec, source: Source | None) -> tuple[Family, str | None, bool]:
    """(family, size, scratch): the task model's family and what fine-tuning's default rate depends on
    (:meth:`FinetuneSpec.train_config`), from the run being resumed, else from ``source``; size is None for weights
    imported from transformers; scratch: a new model's rate, which a counted twin (``counts:RUN``) does not take: it
    fine-tunes at its run's (docs/results/time_to_quality.md measured both on two tasks)."""
    if source is None:
        run = read_config(spec.out, "--out", ("finetuned",))
        family, size, scratch = run_family(run, f"--out {spec.out}"), run.size, str(run.base).startswith(SCRATCH)
    else:
        run, family, size, scratch = source.config, source.family, source.size, source.scratch and not source.counted
    imported = source is not None and source.kind == "transformers" or run is not None and run.hf is not None
    return family, None if imported else size, scratch


def starting_point(source: Source, base_dir: Path | None, spec: FinetuneSpec, train_texts: list[str]
           ) -> tuple[RunConfig, TextTokenizer]:
    """The configuration and tokenizer the task model starts from: a new model of the scratch family (its
    tokenizer given, or trained on the training texts), or the run's (also for its scratch twin, which then loads no
    weights), as the family's reader reads it (:class:`sesame.families.Reader`: a feature extractor's run becomes
    the task model that reads it)."""
    fam = source.family
    refusal = fam.reader.scratch_refusal(fam) if source.scratch else None
    if refusal:
        raise SesameError(f"{source.flag} {source.given}: {refusal}")
    if source.scratch and source.config is None:  # scratch:FAMILY:SIZE (scratch:RUN is the run's, below)
        if spec.tokenizer and spec.cased:
            raise SesameError(f"--cased: --tokenizer {spec.tokenizer} has its case decided; drop --cased")
        tok = load_tokenizer(spec.tokenizer) if spec.tokenizer else \
            train_tokenizer(train_texts, fam.tokenizer, SCRATCH_VOCAB, lowercase=False if spec.cased else None)
        if tok.kind != fam.tokenizer:
            raise SesameError(f"--tokenizer {spec.tokenizer}: a {tok.kind} tokenizer, but {fam.name} uses "
                              f"{fam.tokenizer}")
        model = backbone_config(fam.name, source.size, tok.vocab_size, tok.specials.pad, spec.dropout,
                                specials=tok.specials)
        return RunConfig(kind="pretrained", family=fam.name, size=source.size, pooling=fam.pooling, model=model), tok
    if spec.tokenizer or spec.cased:
        flag = "--tokenizer" if spec.tokenizer else "--cased"
        raise SesameError(f"{flag}: {spec.base} brings its own tokenizer; drop {flag}")
    config = source.config or read_config(base_dir, source.flag)  # a run's, read when resolved; an import's converted
    config = replace(config, model=replace(config.model, dropout=spec.dropout))
    return fam.reader.task_model(fam, config, dropout=spec.dropout), load_tokenizer(base_dir, source.flag)


def _word_vectors(model: ModelConfig, recipe: Recipe, source: Source) -> ModelConfig:
    """A new recurrent task model's backbone config ``model`` with a word embedding as wide as ``recipe.vectors``
    (GloVe/word2vec text), which it starts from (:func:`_embed_vectors`); refused for models whose embedding is
    already trained (:meth:`sesame.families.Reader.vectors_refusal`)."""
    if not recipe.vectors:
        return model
    if source.counted:
        raise SesameError(f"--vectors {recipe.vectors}: {source.given} starts the word embedding from the run's "
                          f"counts; drop --vectors, or use scratch:{source.path}")
    refusal = source.family.reader.vectors_refusal(source.family, scratch=source.scratch)
    if refusal:
        raise SesameError(f"--vectors {recipe.vectors}: {refusal}")
    return replace(model, embedding_size=load_vectors(recipe.vectors).dim)


def load_pretrained(model: TaskModel, run: Path, *, flag: str = "--from") -> None:
    """Copy the backbone weights of a pretrained or fine-tuned run (its heads are left behind; an ELMo or
    CoVe run's go to the task model's frozen feature extractor, CoVe's word vectors also to its embedding),
    and the [CLS] pooler when the run trained one (BERT's NSP, ALBERT's SOP) and the task model pools [CLS].
    Adapters and a scalar mix the recipe inserts keep their fresh initialisation, and those of a run fine-tuned
    with them are left behind unless inserted again; GPT's input tokens get new embedding rows
    (:mod:`sesame.inputs`)."""
    weights = load_weights(run / "model.safetensors")
    # a task model reading features, fine-tuned from the extractor's own run (not from another such task model)
    extractor = getattr(model.backbone, "features", None) is not None and \
        not any(k.startswith("backbone.features.") for k in weights)
    for part in ("backbone", "pooler"):
        prefix = part + "."
        found = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        if part == "backbone" and not extractor:
            found = grow_token_embedding(found, model.backbone.config.vocab_size)
        if found and (part == "backbone" or getattr(model, "pooling", None) == "cls"):
            target = model.backbone.features if extractor and part == "backbone" else getattr(model, part)
            loaded = target.load_state_dict(found, strict=False)
            words = getattr(target.embed, "tokens", None) if extractor and part == "backbone" else None
            if words is not None:  # CoVe: the task model's own embedding starts as the MT-LSTM's word vectors
                model.backbone.embed.tokens.weight.data.copy_(words.weight.data)
            missing = [k for k in loaded.missing_keys if not inserted(k)]
            unexpected = [k for k in loaded.unexpected_keys if not inserted(k)]
            if missing or unexpected:  # only what recipes insert may be new, or left behind
                raise SesameError(f"{flag} {run}: its {part} does not fit this model (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]})")


def _embed_vectors(backbone: torch.nn.Module, path: str, tok: TextTokenizer) -> float:
    """Copy word vectors (GloVe/word2vec text) into the backbone's word embedding; returns the share of the
    vocabulary found (the rest start at random, :func:`sesame.data.vectors.embedding_matrix`)."""
    vocabulary = [tok.backend.id_to_token(i) for i in range(tok.vocab_size)]
    matrix, found = embedding_matrix(load_vectors(path), vocabulary)
    with torch.no_grad():
        backbone.embed.tokens.weight.copy_(matrix)
    return round(float(found.float().mean()), 4)


def _texts(rows: list[dict]) -> list[str]:
    """The raw text of examples (every string, or list of strings, they hold; each once: SQuAD shares
    a context among several questions), for training a tokenizer on the way."""
    texts = []
    for row in rows:
        for value in row.values():
            texts += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    return list(dict.fromkeys(texts))


