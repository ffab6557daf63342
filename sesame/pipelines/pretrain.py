"""``sesame pretrain``: a :class:`PretrainSpec` → a pretrained run directory.

The corpus (raw text or prepared shards) and the tokenizer are decided in :mod:`sesame.data.windows`;
the objective wraps the family's backbone; the trainer does the rest. ``spec.base`` continues a
pretrained run on a new corpus (ULMFiT's target-task LM, Howard & Ruder 2018, §3.2).
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..data.shards import Shards, Window
from ..data.windows import (Corpus, examples, partners, require_documents, training_windows, warn_if_few,
                            window_batches)
from ..errors import SesameError
from ..families import backbone_config
from ..metrics import language_model_report
from ..objectives import OBJECTIVES, CausalLM, Objective, build_objective
from ..objectives.seq2seq import require_sentinels
from ..resume import record_training, resumed_pretraining, setup_record
from ..run import RunConfig, build_backbone, load_tokenizer, read_config, write_config
from ..rundir import check_batch, claimed_run, from_checkpoint
from ..runtime import device_of, to_device
from ..specs import PretrainSpec
from ..tasks import EVAL_BATCH
from ..tokenizer import extend_words, put_cls_last
from ..train import RunSettings, Trainer, recipes
from ..train.checkpoint import load_weights
from ..train.trainer import all_sum, loss_counts, loss_parts, world
from .distilbert import PretrainTeacher


def pretrain(spec: PretrainSpec) -> dict:
    """Pre-train as ``spec`` says (:class:`sesame.specs.PretrainSpec`); returns the last validation metrics.
    The time budget counts the whole command, tokenizer and preparation included, so runs compare at equal
    compute."""
    started = time.time()
    if spec.resume:
        spec = resumed_pretraining(spec)  # as the run was made, with the budget given now
    teacher = PretrainTeacher(spec.teacher) if spec.teacher is not None else None
    if teacher is not None:
        spec = teacher.taught(spec)
    spec.validate()
    placement = spec.runtime.place()
    cfg = spec.train_config()
    fam = spec.fam
    resumed = from_checkpoint(spec.out, spec.resume)
    base = read_config(spec.base, "--from", ("pretrained",)) if spec.base and not resumed else None
    if base is not None:
        if base.family != spec.family:
            raise SesameError(f"--from {spec.base}: a {base.family} run; continue it with --family {base.family}")
        if spec.tokenizer or spec.cased:
            flag = "--tokenizer" if spec.tokenizer else "--cased"
            raise SesameError(f"{flag}: {spec.base} brings its own tokenizer; drop {flag}")
    check_batch(cfg)

    def setup(run: Path) -> None:
        corpus = Corpus.of(spec.corpus, "--corpus", spec.text_field)
        held_out = Corpus.of(spec.valid, "--valid", spec.text_field) if spec.valid else None
        tokenizer = str(Path(spec.base) / "tokenizer.json") if base else spec.tokenizer
        tok = teacher.tok if teacher is not None else \
            corpus.tokenizer(tokenizer, fam.tokenizer, spec.vocab_size, spec.progress, cased=spec.cased,
                             sentinels=fam.sentinels)
        read = corpus.shard_dir or tokenizer  # (a tokenizer trained here was checked with the spec)
        require_sentinels(OBJECTIVES[spec.objective_name], *spec.longest_examples(), spec.objective_settings(),
                          have=len(tok.sentinels()), source=f"the tokenizer {read}" if read else "the tokenizer",
                          fix=", or a tokenizer with more (sesame tokenizer train --sentinels N)",
                          none=f"train one with them (`sesame tokenizer train --kind {fam.tokenizer} --sentinels 100`)")
        if base is not None and fam.target_words and corpus.shard_dir is None:
            tok, _ = extend_words(tok, corpus.texts(), spec.vocab_size)
        shards = corpus.shards(tok, run / "shards", spec.progress)
        valid = held_out.shards(tok, run / "valid-shards", spec.progress) if held_out else None
        if base is not None:
            # the words continued pre-training added, if any (a converted T5's table may also have unused rows
            # beyond its tokenizer's ids, which it keeps)
            model = {**base.model, "vocab_size": max(tok.vocab_size, base.model["vocab_size"]),
                     **({"dropout": spec.dropout} if spec.dropout is not None else {})}
        elif teacher is not None:
            model = teacher.student_model(spec, spec.dropout if spec.dropout is not None else fam.pretrain_dropout)
        else:
            dropout = spec.dropout if spec.dropout is not None else fam.pretrain_dropout
            model_cfg = backbone_config(spec.family, spec.size, tok.vocab_size, tok.specials.pad, dropout,
                                        max(fam.context, spec.seq_len), specials=tok.specials)
            if spec.attention_window is not None:
                model_cfg.attention_window = spec.attention_window
            model = model_cfg.to_dict()
        model.update(spec.recurrent_dropouts(spec.family, spec.dropout, arch=fam.arch, what=f"--family {fam.name}"))
        config = RunConfig(
            kind="pretrained", family=spec.family, size=base.size if base else None if teacher else spec.size,
            objective=spec.objective_name, objective_options=spec.objective_settings(),
            static_masks=spec.static_masks, final_seq_len=spec.final_seq_len, pooling=fam.pooling, model=model,
            seq_len=spec.seq_len, base=spec.base or spec.teacher,
            added_words=model["vocab_size"] - base.model["vocab_size"] if base else 0,
            discriminative=spec.discriminative, shards=str(shards.path.resolve()),
            valid_shards=str(valid.path.resolve()) if valid else None,
            valid_size=held_out.size() if held_out else None, train=asdict(cfg), setup=setup_record(spec))
        _, _, valid_windows = _windows(config, shards, valid)  # enough text?
        if OBJECTIVES[config.objective].pairs:  # and documents to draw negatives from?
            for flag, given in (("--corpus", shards), ("--valid", valid)):
                if given is not None:
                    require_documents(given, flag=flag, objective=config.objective)
        warn_if_few(valid_windows, window_length(config),
                    "--valid" if valid else "the corpus's last 1% (the validation split without --valid)")
        if fam.cls_last:  # the run's tokenizer encodes fine-tuning's inputs as the family reads them (after the
            put_cls_last(tok)  # shards, which a tokenizer without the template may have made)
        tok.save(run / "tokenizer.json")
        write_config(run, config)

    with claimed_run(spec.out, "pretrained", spec.resume, setup) as run:
        config = read_config(run, "--out", ("pretrained",))
        tok = load_tokenizer(run)
        shards = Shards(config.shards)
        valid_shards = Shards(config.valid_shards) if config.valid_shards else None
        torch.manual_seed(cfg.seed)
        obj = build_objective(config.objective, build_backbone(config), tok, config.objective_options)
        if base is not None:
            obj.load_state_dict(_with_new_words(load_weights(Path(spec.base) / "model.safetensors"),
                                                config.model["vocab_size"]))
        if teacher is not None and not resumed:
            teacher.initialise(obj, spec)
        learner = teacher.learner(obj, spec, shards) if teacher is not None else obj  # trained; obj's weights are kept
        windows, valid_shards, valid_windows = _windows(config, shards, valid_shards)
        phases = [(window_length(config), windows)]
        if config.final_seq_len:
            final = window_length(config, config.final_seq_len)
            phases.append((final, shards.windows(final)))
        factor = config.discriminative
        rates = recipes.discriminative_param_groups(recipes.layer_groups(obj, obj.backbone), cfg.lr, cfg.weight_decay,
                                                    factor) if factor != 1 else None
        settings = RunSettings(run, cfg, placement=placement, progress=spec.progress, started=started)
        trainer = Trainer(learner, settings, window_batches(learner, shards, phases, cfg, config.static_masks),
                          evaluate=lambda m: lm_metrics(m, valid_shards, valid_windows, window_length(config),
                                                        cfg.seed, config.valid_size), param_groups=rates, keeps=obj)
        return trainer.fit(resume=resumed, record=lambda: record_training(  # a resume's budget
            run, config, cfg, runtime=spec.runtime.record(placement)))


def window_length(config: RunConfig, seq_len: int | None = None) -> int:
    """The corpus tokens of one example of the run's objective, with its options, at ``seq_len`` positions (by
    default the run's)."""
    return OBJECTIVES[config.objective].window_length(seq_len or config.seq_len, **config.objective_options)


def _windows(config: RunConfig, shards: Shards, valid: Shards | None) -> tuple[list[Window], Shards, list[Window]]:
    return training_windows(shards, valid, length=window_length(config), seq_len=config.seq_len)


def _with_new_words(weights: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """``weights`` whose word embedding grew to ``vocab_size`` rows, each new word at the mean of the old rows
    (ULMFiT's target vocabulary, :func:`sesame.tokenizer.extend_words`)."""
    name = "backbone.embed.tokens.weight"
    table = weights.get(name)
    if table is None or table.shape[0] == vocab_size:
        return weights
    return {**weights, name: torch.cat([table, table.mean(0).expand(vocab_size - table.shape[0], -1)])}


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


