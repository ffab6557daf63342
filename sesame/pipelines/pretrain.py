"""``sesame pretrain``: a :class:`PretrainSpec` → a pretrained run directory.

The corpus (raw text or prepared shards) is decided in :mod:`sesame.data.windows`; what the model starts from (a new
model of the family, a pretrained run continued on a new corpus, DistilBERT's student of a teacher) is a
:class:`~sesame.pipelines.starts.Start`, which gives the tokenizer and the backbone; the objective wraps the
backbone; the trainer does the rest.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from ..data.shards import Shards, Window
from ..data.windows import (Corpus, corpus_mixing, examples, partners, require_documents, training_windows,
                            warn_if_few, window_batches)
from ..metrics import language_model_report
from ..objectives import OBJECTIVES, CausalLM, Objective, build_objective
from ..objectives.seq2seq import require_sentinels
from ..resume import record_training, resumed_pretraining, setup_record
from ..run import PretrainedPart, RunConfig, build_backbone, load_tokenizer, read_config, write_config
from ..rundir import check_batch, claimed_run, from_checkpoint
from ..runtime import Placement, device_of, to_device
from ..specs import AUTO, PretrainSpec
from ..tasks import EVAL_BATCH
from ..train import RunSettings, Trainer, TrainConfig, recipes
from ..train.trainer import all_sum, loss_counts, loss_parts, world
from .distilbert import PretrainTeacher
from .sizing import auto_size
from .starts import Continued, NewModel, Start, ppmi_embedding


def pretrain(spec: PretrainSpec) -> dict:
    """Pre-train as ``spec`` says (:class:`sesame.specs.PretrainSpec`); returns the last validation metrics.
    The time budget counts the whole command, tokenizer and preparation included, so runs compare at equal
    compute. Read top to bottom: resolve the spec and what the model starts from (a :class:`~.starts.Start`), set
    the run up (tokenizer, shards, config.json), build the objective, train."""
    started = time.time()
    spec, teacher = _resolved(spec)
    placement, cfg = spec.runtime.place(), spec.train_config()
    resumed = from_checkpoint(spec.out, spec.resume)
    start: Start = teacher or (Continued(spec) if spec.base and not resumed else NewModel())
    check_batch(cfg)
    with claimed_run(spec.out, "pretrained", spec.resume, lambda run: _set_up(run, spec, start, cfg, placement)
                     ) as run:
        config = read_config(run, "--out", ("pretrained",))
        if config.pretrained.sizing:  # --size auto's batch (a resumed run's recorded choice: nothing is measured again)
            cfg = replace(cfg, batch_size=config.pretrained.sizing.batch_size)
        torch.manual_seed(cfg.seed)
        tok, shards, backbone = load_tokenizer(run), Shards(config.pretrained.shards), build_backbone(config)
        if not resumed and config.pretrained.embedding_init == "ppmi":  # (before an untied decoder copies the table)
            ppmi_embedding(backbone, shards, skip=tok.specials.all, seed=cfg.seed, progress=spec.progress)
        obj = build_objective(config.pretrained.objective, backbone, tok, config.pretrained.objective_options)
        if not resumed:
            start.initialise(obj, spec)
        learner = start.learner(obj, spec, shards)  # trained; obj's weights are kept
        settings = RunSettings(run, cfg, placement=placement, progress=spec.progress, started=started)
        return _trainer(learner, obj, config, shards, settings).fit(resume=resumed, record=lambda: record_training(
            run, config, cfg, runtime=spec.runtime.record(placement)))  # a resume's budget


def _resolved(spec: PretrainSpec) -> tuple[PretrainSpec, PretrainTeacher | None]:
    """The spec to run (a resumed run's own, with the budget given now; a teacher's student's) and the teacher, if
    any, validated."""
    if spec.resume:
        spec = resumed_pretraining(spec)
    elif spec.base is not None and "family" not in spec.given_fields():  # --from RUN: the run's family
        spec = replace(spec, family=read_config(spec.base, "--from", ("pretrained",)).family)
    teacher = PretrainTeacher(spec.teacher) if spec.teacher is not None else None
    if teacher is not None:
        spec = teacher.taught(spec)
    spec.validate()
    return spec, teacher


def _set_up(run: Path, spec: PretrainSpec, start: Start, cfg: TrainConfig, placement: Placement) -> None:
    """A new run's tokenizer.json, shards and config.json, after checking the corpus gives the objective enough;
    with ``--size auto``, the size (and batch) the budget affords on this machine, measured on the shards."""
    corpus = Corpus.of(spec.corpus, "--corpus", spec.text_field)
    held_out = Corpus.of(spec.valid, "--valid", spec.text_field) if spec.valid else None
    tok, file = start.tokenizer(corpus, spec)
    read = corpus.shard_dir or file  # (a tokenizer trained here was checked with the spec)
    fam = spec.fam
    require_sentinels(OBJECTIVES[spec.objective_name], *spec.longest_examples(), spec.objective_settings(),
                      have=len(tok.sentinels()), source=f"the tokenizer {read}" if read else "the tokenizer",
                      fix=", or a tokenizer with more (sesame tokenizer train --sentinels N)",
                      none=f"train one with them (`sesame tokenizer train --kind {fam.tokenizer} --sentinels 100`)")
    shards = corpus.shards(tok, run / "shards", spec.progress)
    valid = held_out.shards(tok, run / "valid-shards", spec.progress) if held_out else None
    windows, _, valid_windows = training_windows(shards, valid, length=spec.window_length(), seq_len=spec.seq_len)
    mixing = corpus_mixing(corpus, shards, windows, spec.mixing_temperature) \
        if spec.mixing_temperature is not None else None
    if mixing is not None:
        print(f"sesame: {mixing.line()}", file=sys.stderr, flush=True)
    sizing = auto_size(spec, tok, shards, cfg, placement) if spec.size == AUTO else None
    if sizing is not None:
        print(f"sesame: {sizing.line()}", file=sys.stderr, flush=True)
        spec, cfg = replace(spec, size=sizing.size), replace(cfg, batch_size=sizing.batch_size)
    model = replace(start.backbone(spec, tok),
                    **spec.recurrent_dropouts(spec.family, spec.dropout, arch=fam.arch, what=f"--family {fam.name}"))
    origin = start.origin(spec, model)
    config = RunConfig(
        kind="pretrained", family=spec.family, size=origin.size, base=origin.base, pooling=origin.pooling,
        model=model, train=asdict(cfg), setup=setup_record(spec), pretrained=PretrainedPart(
            objective=spec.objective_name, objective_options=spec.objective_settings(), seq_len=spec.seq_len,
            static_masks=spec.static_masks, final_seq_len=spec.final_seq_len, added_words=origin.added_words,
            discriminative=spec.discriminative, embedding_init=spec.embedding_start,
            embedding_rate=spec.embedding_rate, shards=str(shards.path.resolve()),
            valid_shards=str(valid.path.resolve()) if valid else None,
            valid_size=held_out.size() if held_out else None, sizing=sizing, corpus_mixing=mixing))
    _check_windows(config, shards, valid, valid_windows)
    fam.inputs.pretrained(tok)  # the run's tokenizer frames fine-tuning's inputs as the family reads them (after the
    # shards, which a tokenizer without the template may have made)
    tok.save(run / "tokenizer.json")
    write_config(run, config)


def _check_windows(config: RunConfig, shards: Shards, valid: Shards | None, valid_windows: list[Window]) -> None:
    """Enough text for the objective's windows (and, for pair objectives, documents to draw partners from); a
    warning where the validation windows are few."""
    objective = config.pretrained.objective
    if OBJECTIVES[objective].pairs:
        for flag, given in (("--corpus", shards), ("--valid", valid)):
            if given is not None:
                require_documents(given, flag=flag, objective=objective)
    warn_if_few(valid_windows, window_length(config),
                "--valid" if valid else "the corpus's last 1% (the validation split without --valid)")


def _trainer(learner: nn.Module, obj: Objective, config: RunConfig, shards: Shards, settings: RunSettings
             ) -> Trainer:
    """The trainer of ``learner`` over the windows of the run's ``shards`` (BERT's second phase of longer ones last),
    validating ``obj`` on the held-out windows, with ULMFiT's discriminative rates when the run has them and the
    token table at its own share of the rate (``--embedding-rate``; 0: frozen, so no gradient is computed for it)."""
    cfg, part = settings.config, config.pretrained
    windows, valid_shards, valid_windows = _windows(config, shards, Shards(part.valid_shards)
                                                    if part.valid_shards else None)
    phases = [(window_length(config), windows)]
    if part.final_seq_len:
        final = window_length(config, part.final_seq_len)
        phases.append((final, shards.windows(final)))
    factor, share = part.discriminative, part.embedding_rate
    if share == 0:
        obj.backbone.embed.tokens.weight.requires_grad_(False)
    rates = recipes.discriminative_param_groups(recipes.layer_groups(obj, obj.backbone), cfg.lr, cfg.weight_decay,
                                                factor) if factor != 1 or share not in (0, 1) else None
    if share not in (0, 1):
        rates = recipes.table_share(rates, obj.backbone.embed.tokens.weight, share)
    return Trainer(learner, settings, window_batches(learner, shards, phases, cfg, part.static_masks,
                                                     part.corpus_mixing),
                   evaluate=lambda m: lm_metrics(m, valid_shards, valid_windows, window_length(config), cfg.seed,
                                                 part.valid_size), param_groups=rates, keeps=obj)


def window_length(config: RunConfig, seq_len: int | None = None) -> int:
    """The corpus tokens of one example of the run's objective, with its options, at ``seq_len`` positions (by
    default the run's)."""
    part = config.pretrained
    return OBJECTIVES[part.objective].window_length(seq_len or part.seq_len, **part.objective_options)


def _windows(config: RunConfig, shards: Shards, valid: Shards | None) -> tuple[list[Window], Shards, list[Window]]:
    return training_windows(shards, valid, length=window_length(config), seq_len=config.pretrained.seq_len)


def lm_metrics(obj: Objective, shards: Shards, windows: list[Window], length: int, seed: int = 0,
               text: dict | None = None) -> dict:
    """Loss and perplexity of ``obj`` over ``windows`` of ``length`` tokens (the objective's window length;
    corruption seeded by window index, so repeatable),
    and for a causal LM, given the size of the ``text`` (:meth:`Corpus.size`), bits per byte and per character.

    For objectives with several losses (``obj.part_names``), ``loss`` is their weighted sum as
    trained, each part's mean is reported as ``<part>_loss``, and perplexity is that of the first
    part, the language model's; a part that classifies (NSP, SOP) also reports ``<part>_accuracy``."""
    rank, size = world()
    mine = range(rank, len(windows), size)  # under torchrun each process scores its share
    partner = partners(shards, windows, length) if obj.pairs else None
    names = obj.part_names or ("loss",)
    sums, counts, right = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0), dict.fromkeys(obj.classified, 0.0)
    with torch.no_grad():
        for start in range(0, len(mine), EVAL_BATCH):
            idx = mine[start: start + EVAL_BATCH]
            batch = to_device(examples(obj, shards, windows, idx, idx, length, seed + 1, partner), device_of(obj))
            n = loss_counts(batch)
            losses, correct = obj.score(batch)
            for name, value in loss_parts(losses).items():
                sums[name] += value.item()
                counts[name] += n[name]
            for name, value in correct.items():
                right[name] += value.item()
    flat = all_sum([*sums.values(), *counts.values(), *right.values()])
    k = len(names)
    sums, counts, right = (dict(zip(names, flat[:k])), dict(zip(names, map(int, flat[k: 2 * k]))),
                           dict(zip(right, flat[2 * k:])))
    scored = None
    if text and isinstance(obj, CausalLM):  # the share of the text whose tokens were scored (windows drop a tail)
        scored = {unit: n * counts[names[0]] / max(1, shards.n_tokens) for unit, n in text.items()}
    report = language_model_report(sums[names[0]], counts[names[0]], scored)
    if obj.part_names:
        means = {name: sums[name] / max(1, counts[name]) for name in names}
        report["loss"] = sum(obj.part_weights.get(name, 1.0) * mean for name, mean in means.items())
        report.update({f"{name}_loss": mean for name, mean in means.items()})
    report.update({f"{name}_accuracy": n / max(1, counts[name]) for name, n in right.items()})
    return report


