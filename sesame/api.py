"""The high-level API: one function per stage, each a thin recipe over the library.

``pretrain`` → a ``pretrained`` run; ``finetune`` → a ``finetuned`` run; ``evaluate`` and ``load``
read either kind. The CLI calls exactly these functions.
"""
from __future__ import annotations

import math
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, fields
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .data.corpus import JSONL_SUFFIXES, iter_texts, resolve_sources
from .data.shards import Shards, Window, is_shard_dir, prepare_corpus
from .errors import SesameError
from .metrics import language_model_report
from .families import DOWNSTREAM, FAMILIES, RECURRENT_SIZES, backbone_config, get_family, get_size
from .interop import resolve
from .objectives import OBJECTIVES, CausalLM, Objective, build_objective, objective_option_names
from .rundir import build_backbone, load_tokenizer, new_run, read_config, write_config
from .models import model_config as model_config_object
from .tasks import (EVAL_BATCH, POOLINGS, TaskModel, add_auxiliary_lm, bucketed_batches, infer, make_task, next_tokens,
                    steps_per_epoch)
from .tasks.base import check_auxiliary_lm
from .tasks.inputs import add_input_tokens, grow_token_embedding
from .tokenizer import TextTokenizer, extend_words, train_tokenizer
from .train import TrainConfig, Trainer, recipes
from .train.checkpoint import load_weights, read_json, write_json
from .train.trainer import all_sum, loss_counts, loss_parts, world
from .wordvectors import embedding_matrix, load_vectors

MAX_EVAL_WINDOWS = 256
TWO_PHASE_SWITCH = 0.9  # BERT, Appendix A.2: short sequences for 90% of the steps, then long ones
PARTNER_SALT = 7919
FEATURE_EXTRACTORS = ("elmo", "cove")  # pretrained runs a task model reads, frozen, beside its own embeddings


def _train_config(overrides: dict) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    unknown = set(overrides) - names
    if unknown:
        raise TypeError(f"unknown training options {sorted(unknown)}; known: {sorted(names)}")
    return TrainConfig(**{k: v for k, v in overrides.items() if v is not None})


def _check_batch(cfg: TrainConfig) -> None:
    processes = world()[1]
    if cfg.batch_size % (processes * cfg.accumulate):
        raise SesameError(f"--batch-size {cfg.batch_size} must be divisible by processes × --accumulate "
                          f"({processes} × {cfg.accumulate})")


def _example_seed(seed: int, index: int) -> int:
    return (seed * 0x9E3779B1 + index * 0x85EBCA77 + 1) % (1 << 62)


def _generators(seed: int, indices: Sequence[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(_example_seed(seed, i)) for i in indices]


def _barrier(failed: bool = False) -> None:
    """Wait for every process; ``failed`` on any of them (rank 0's setup, say) makes the others raise too."""
    if world()[1] > 1:
        flag = torch.tensor([float(failed)])
        dist.all_reduce(flag)
        if flag.item() and not failed:
            raise SesameError("another process (rank 0) failed to set up the run; its error is printed above")


@contextmanager
def _claimed_run(out: str, kind: str, resume: bool, setup: Callable[[Path], None]) -> Iterator[Path]:
    """Rank 0 claims ``out`` and runs ``setup(run)`` (tokenizer, data, config.json) unless resuming; the
    other processes wait at a barrier, then open the same run. A setup failure on rank 0 is passed on
    to the waiting processes instead of leaving them hanging."""
    rank = world()[0]
    if rank > 0:
        _barrier()
    ready = rank > 0
    try:
        with new_run(out, kind, resume or rank > 0) as run:
            if rank == 0 and not resume:
                setup(run)
            if not ready:
                ready = True
                _barrier()
            yield run
    except BaseException:
        if not ready:
            _barrier(failed=True)
        raise


# -- pre-training ----------------------------------------------------------------------------------

def _shard_dir(paths: Sequence[str]) -> Path | None:
    return Path(paths[0]) if len(paths) == 1 and is_shard_dir(Path(paths[0])) else None


def _pretrain_tokenizer(corpus: Sequence[str], tokenizer: str | None, kind: str, vocab_size: int, text_field: str,
                        progress: bool) -> TextTokenizer:
    """The tokenizer named by --tokenizer, or the one stored with prepared shards, or one trained on the corpus."""
    given = _shard_dir(corpus) or tokenizer
    if given:
        tok = load_tokenizer(given, "--corpus" if given != tokenizer else "--tokenizer")
        if tok.kind != kind:
            raise SesameError(f"--tokenizer {given}: a {tok.kind} tokenizer, but this family uses {kind}")
        return tok
    return train_tokenizer(iter_texts(resolve_sources(corpus), text_field), kind, vocab_size, show_progress=progress)


def _prepared(paths: Sequence[str], tok: TextTokenizer, dest: Path, flag: str, text_field: str,
              progress: bool) -> Shards:
    """Shards for ``paths``: a prepared shard directory made with ``tok``, or raw text prepared into ``dest``."""
    existing = _shard_dir(paths)
    if existing is None:
        return prepare_corpus(resolve_sources(paths, flag), tok, dest, text_field, progress)
    shards = Shards(existing)
    if load_tokenizer(existing, flag).backend.to_str() != tok.backend.to_str():
        raise SesameError(f"{flag} {existing}: these shards were made with another tokenizer; prepare them again")
    return shards


def _partners(shards: Shards, windows: list[Window], length: int) -> Callable[[int, torch.Generator], Window]:
    """``partner(own, generator)``: a window (of ``length`` tokens) drawn uniformly from those sharing no
    document with window ``own`` (next-sentence negatives); when every window shares one, from the others."""
    first = shards.documents(windows)  # both non-decreasing: windows are in corpus order
    last = shards.documents([Window(w.shard, w.start + length - 1) for w in windows])

    def partner(own: int, generator: torch.Generator) -> Window:
        # windows lo..hi-1 overlap the documents of window own; the rest share none with it
        lo, hi = np.searchsorted(last, first[own], "left"), np.searchsorted(first, last[own], "right")
        if hi - lo == len(windows):
            lo, hi = own, own + 1
        r = int(torch.randint(max(1, len(windows) - (hi - lo)), (1,), generator=generator))
        return windows[min(len(windows) - 1, r if r < lo else r + hi - lo)]

    return partner


def _examples(obj: Objective, shards: Shards, windows: list[Window], picks: Sequence[int], seeds: Sequence[int],
              seq_len: int, seed: int, partner: Callable[[int, torch.Generator], Window] | None = None
              ) -> dict[str, torch.Tensor]:
    """The objective's batch for windows ``picks``, example ``i`` corrupted by a generator seeded by ``seeds[i]``;
    pair objectives also get a window from ``partner`` per example, drawn by a generator of the same seed."""
    length = obj.window_length(seq_len)
    rows = torch.from_numpy(np.stack([shards.read(windows[w], length) for w in picks]))
    partners = None
    if partner is not None:
        draws = _generators(seed + PARTNER_SALT, seeds)
        partners = torch.from_numpy(np.stack([shards.read(partner(w, g), length) for w, g in zip(picks, draws)]))
    return obj.make_batch(rows, _generators(seed, seeds), partners)


def _window_batches(obj: Objective, shards: Shards, phases: list[tuple[int, list[Window]]], cfg: TrainConfig,
                    static_masks: int = 0):
    """``batches(step, progress)``: this process's micro-batches of global step ``step``.

    ``phases`` holds ``(seq_len, windows)``: one, or two for BERT's two-phase schedule (the second from
    ``TWO_PHASE_SWITCH`` of the budget on). Example ``g`` of the run is window ``perm_e[g mod N]`` of
    epoch ``e = g div N`` and is corrupted with a generator seeded by ``g`` alone, so neither
    accumulation nor the number of processes changes it. With ``static_masks = k`` the seed is
    ``(window, e mod k)`` instead: each window has k fixed corruptions, as when BERT duplicated its
    data k times with different masks at preparation (same effect, nothing stored).
    """
    rank, size = world()
    cache: dict[tuple[int, int], list[int]] = {}
    partners = [_partners(shards, windows, obj.window_length(n)) if obj.pairs else None for n, windows in phases]

    def permutation(n: int, epoch: int) -> list[int]:
        if (n, epoch) not in cache:
            cache.clear()
            cache[n, epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed + epoch)).tolist()
        return cache[n, epoch]

    def batches(step: int, progress: float) -> list[dict[str, torch.Tensor]]:
        phase = len(phases) - 1 if progress >= TWO_PHASE_SWITCH else 0
        seq_len, windows = phases[phase]
        n = len(windows)
        mine = list(range(step * cfg.batch_size, (step + 1) * cfg.batch_size))[rank::size]
        per_micro = math.ceil(len(mine) / cfg.accumulate)
        micro = []
        for start in range(0, len(mine), per_micro):
            chunk = mine[start: start + per_micro]
            picks = [permutation(n, g // n)[g % n] for g in chunk]
            seeds = [w * static_masks + (g // n) % static_masks for g, w in zip(chunk, picks)] if static_masks else chunk
            micro.append(_examples(obj, shards, windows, picks, seeds, seq_len, cfg.seed, partners[phase]))
        return micro

    return batches


def text_size(paths: Sequence[str], flag: str, text_field: str = "text") -> dict | None:
    """The UTF-8 bytes and the characters of the text in ``paths`` (of JSONL files, their text fields), which
    bits per byte and per character divide by; None for a shard directory, whose text is gone."""
    if _shard_dir(paths) is not None:
        return None
    size = {"bytes": 0, "chars": 0}
    for f in resolve_sources(paths, flag):
        texts = iter_texts([f], text_field) if f.suffix in JSONL_SUFFIXES else [f.read_bytes().decode("utf-8")]
        for text in texts:
            size["bytes"] += len(text.encode("utf-8"))
            size["chars"] += len(text)
    return size


def lm_metrics(obj: Objective, shards: Shards, windows: list[Window], seq_len: int, seed: int = 0,
               text: dict | None = None) -> dict:
    """Loss and perplexity of ``obj`` over ``windows`` (corruption seeded by window index, so repeatable),
    and for a causal LM, given the size of the ``text`` (:func:`text_size`), bits per byte and per character.

    For objectives with several losses (``obj.part_names``), ``loss`` is their weighted sum as
    trained, each part's mean is reported as ``<part>_loss``, and perplexity is that of the first
    part, the language model's."""
    rank, size = world()
    mine = range(rank, len(windows), size)  # under torchrun each process scores its share
    partner = _partners(shards, windows, obj.window_length(seq_len)) if obj.pairs else None
    names = obj.part_names or ("loss",)
    sums, counts = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    with torch.no_grad():
        for start in range(0, len(mine), EVAL_BATCH):
            idx = mine[start: start + EVAL_BATCH]
            batch = _examples(obj, shards, windows, idx, idx, seq_len, seed + 1, partner)
            n = loss_counts(batch)
            for name, value in loss_parts(obj(batch)).items():
                sums[name] += value.item()
                counts[name] += n[name]
    flat = all_sum([*sums.values(), *counts.values()])
    sums, counts = dict(zip(names, flat[: len(names)])), dict(zip(names, map(int, flat[len(names):])))
    scored = None
    if text and isinstance(obj, CausalLM):  # the share of the text whose tokens were scored (windows drop a tail)
        scored = {unit: n * counts[names[0]] / max(1, shards.n_tokens) for unit, n in text.items()}
    report = language_model_report(sums[names[0]], counts[names[0]], scored)
    if obj.part_names:
        means = {name: sums[name] / max(1, counts[name]) for name in names}
        report["loss"] = sum(obj.part_weights.get(name, 1.0) * mean for name, mean in means.items())
        report.update({f"{name}_loss": mean for name, mean in means.items()})
    return report


def pretrain(corpus: Sequence[str], out: str, family: str = "bert", size: str = "mini", tokenizer: str | None = None,
             vocab_size: int = 16000, seq_len: int = 128, valid: Sequence[str] | None = None, text_field: str = "text",
             dropout: float | None = None, resume: bool = False, progress: bool = True, objective: str | None = None,
             objective_options: dict | None = None, static_masks: int = 0, final_seq_len: int | None = None,
             attention_window: int | None = None, base: str | None = None, discriminative: float = 1.0,
             **train) -> dict:
    """Pre-train a ``family``/``size`` model on ``corpus`` (text files, folders, JSONL, or a shard directory).

    ``base`` (a pretrained run of the same family) continues that model on the new corpus with its
    tokenizer, size and objective: ULMFiT's target-task LM fine-tuning (Howard & Ruder 2018, §3.2), where
    the corpus's words missing from a recurrent model's vocabulary (seen twice or more; at most
    ``vocab_size``) join it at the mean embedding, and ``discriminative`` = 2.6 divides the learning
    rate by 2.6 per layer down from the top and ``schedule="stlr"`` gives slanted triangular rates.

    ``objective`` and ``objective_options`` override the family's (e.g. BERT without NSP:
    ``objective="mlm"``; whole-word masking: ``objective_options={"masking": "whole_word"}``).
    ``static_masks=k`` gives each sequence k fixed corruptions (original BERT) instead of fresh ones;
    ``final_seq_len`` switches to longer sequences for the last 10% of the budget (BERT's two phases).
    ``attention_window`` w makes every second layer attend only to the w nearest positions (GPT-3's
    locally banded layers, :mod:`sesame.models.transformer`). Training options are
    :class:`sesame.train.TrainConfig` fields (``max_steps``, ``max_minutes``, ``lr``, ``batch_size``,
    ``accumulate``, ...) over the family's recipe. The time budget counts the whole
    command, tokenizer and preparation included, so runs compare at equal compute. Returns the last
    validation metrics.
    """
    started = time.time()
    fam = get_family(family)
    get_size(size)
    objective = objective or fam.objective
    if objective is None:
        how = "is trained on translation by `sesame cove`" if fam.arch == "cove" else \
            f"is a baseline trained from scratch: `sesame finetune --from scratch:{family}:SIZE`"
        raise SesameError(f"--family {family}: has no pre-training objective; it {how}")
    if objective not in OBJECTIVES:
        raise SesameError(f"--objective {objective!r} is unknown; choose one of: {', '.join(OBJECTIVES)}")
    options = {**(fam.objective_options if objective == fam.objective else {}), **(objective_options or {})}
    known = objective_option_names(OBJECTIVES[objective])
    if set(options) - known:
        raise SesameError(f"--objective-option {', '.join(sorted(set(options) - known))}: not an option of the "
                          f"{objective} objective; it takes {', '.join(sorted(known)) or 'none'}")
    cfg = _train_config({**fam.recipe, **train})
    cfg.validate()
    if discriminative < 1:
        raise SesameError(f"--discriminative {discriminative}: use 1 (one rate) or more (2.6 in ULMFiT)")
    base_config = read_config(base, "--from", ("pretrained",)) if base and not resume else None
    if base_config is not None:
        if base_config["family"] != family:
            raise SesameError(f"--from {base}: a {base_config['family']} run; continue it with --family "
                              f"{base_config['family']}")
        if tokenizer:
            raise SesameError(f"--tokenizer: {base} brings its own tokenizer; drop --tokenizer")
        tokenizer, size = str(Path(base) / "tokenizer.json"), base_config["size"]
    if not 8 <= seq_len <= 4096:
        raise SesameError(f"--seq-len {seq_len}: use a length between 8 and 4096")
    positions = max(fam.context, seq_len)
    if final_seq_len is not None and not seq_len < final_seq_len <= positions:
        raise SesameError(f"--final-seq-len {final_seq_len}: must exceed --seq-len {seq_len} and be at most "
                          f"{positions} (the model's positions)")
    if attention_window is not None and fam.arch != "transformer":
        raise SesameError(f"--attention-window: banded attention is for Transformers; {family} is {fam.arch}")
    if attention_window is not None and attention_window < 1:
        raise SesameError(f"--attention-window {attention_window}: give the band width in positions, e.g. 64")
    if static_masks < 0:
        raise SesameError(f"--static-masks {static_masks}: use 0 (fresh masks each time) or a positive count")
    _check_batch(cfg)

    def setup(run: Path) -> None:
        tok = _pretrain_tokenizer(corpus, tokenizer, fam.tokenizer, vocab_size, text_field, progress)
        if base_config is not None and fam.arch == "recurrent" and not _shard_dir(corpus):
            tok, _ = extend_words(tok, iter_texts(resolve_sources(corpus), text_field), vocab_size)
        shards = _prepared(corpus, tok, run / "shards", "--corpus", text_field, progress)
        valid_shards = _prepared(valid, tok, run / "valid-shards", "--valid", text_field, progress) if valid else None
        if base_config is not None:
            model = {**base_config["model"], "vocab_size": tok.vocab_size,
                     **({"dropout": dropout} if dropout is not None else {})}
        else:
            model_cfg = backbone_config(family, size, tok.vocab_size, tok.specials.pad, dropout, positions)
            if attention_window is not None:
                model_cfg.attention_window = attention_window
            model = model_cfg.to_dict()
        config = {"kind": "pretrained", "family": family, "size": size, "objective": objective,
                  "objective_options": options, "static_masks": static_masks, "final_seq_len": final_seq_len,
                  "pooling": fam.pooling, "model": model, "seq_len": seq_len, "base": base,
                  "added_words": tok.vocab_size - base_config["model"]["vocab_size"] if base_config else 0,
                  "discriminative": discriminative,
                  "shards": str(shards.path.resolve()),
                  "valid_shards": str(valid_shards.path.resolve()) if valid_shards else None,
                  "valid_size": text_size(valid, "--valid", text_field) if valid else None, "train": asdict(cfg)}
        _pretraining_data(config, shards, valid_shards)  # enough text?
        tok.save(run / "tokenizer.json")
        write_config(run, config)

    with _claimed_run(out, "pretrained", resume, setup) as run:
        config = read_config(run, "--out", ("pretrained",))
        tok = load_tokenizer(run)
        shards = Shards(config["shards"])
        valid_shards = Shards(config["valid_shards"]) if config["valid_shards"] else None
        torch.manual_seed(cfg.seed)
        obj = build_objective(config["objective"], build_backbone(config), tok, config["objective_options"])
        if base_config is not None:
            obj.load_state_dict(_with_new_words(load_weights(Path(base) / "model.safetensors"), tok.vocab_size))
        windows, valid_shards, valid_windows = _pretraining_data(config, shards, valid_shards)
        seq_len = config["seq_len"]
        phases = [(seq_len, windows)]
        if config["final_seq_len"]:
            phases.append((config["final_seq_len"], shards.windows(obj.window_length(config["final_seq_len"]))))
        factor = config.get("discriminative", 1.0)
        rates = recipes.discriminative_param_groups(recipes.layer_groups(obj, obj.backbone), cfg.lr, cfg.weight_decay,
                                                    factor) if factor != 1 else None
        trainer = Trainer(obj, run, cfg, _window_batches(obj, shards, phases, cfg, config["static_masks"]),
                          evaluate=lambda m: lm_metrics(m, valid_shards, valid_windows, seq_len, cfg.seed,
                                                        config.get("valid_size")),
                          started=started, progress=progress, param_groups=rates)
        return trainer.fit(resume=resume)


def _with_new_words(weights: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """``weights`` whose word embedding grew to ``vocab_size`` rows, each new word at the mean of the old rows
    (ULMFiT's target vocabulary, :func:`sesame.tokenizer.extend_words`)."""
    name = "backbone.embed.tokens.weight"
    table = weights.get(name)
    if table is None or table.shape[0] == vocab_size:
        return weights
    return {**weights, name: torch.cat([table, table.mean(0).expand(vocab_size - table.shape[0], -1)])}


def _pretraining_data(config: dict, shards: Shards, valid: Shards | None
                      ) -> tuple[list[Window], Shards, list[Window]]:
    """Training windows, and validation windows from ``valid`` or else the corpus's last 1% (at most 256)."""
    length = OBJECTIVES[config["objective"]].window_length(config["seq_len"])
    windows = shards.windows(length)
    if valid is not None:
        held, valid_windows = windows, valid.windows(length)[:MAX_EVAL_WINDOWS]
    else:
        n_valid = min(MAX_EVAL_WINDOWS, max(1, len(windows) // 100))
        held, valid, valid_windows = windows[:-n_valid], shards, windows[-n_valid:]
    if not held or not valid_windows:
        raise SesameError(f"--corpus: too little text for --seq-len {config['seq_len']} ({shards.n_tokens} tokens, "
                          f"validation {valid.n_tokens}); add text or lower --seq-len")
    return held, valid, valid_windows


# -- fine-tuning -----------------------------------------------------------------------------------

def _base_config(base: str, tokenizer: str | None, train_texts: list[str], dropout: float
                 ) -> tuple[dict, TextTokenizer]:
    """(config, tokenizer) of ``--from``: a run directory, or ``scratch:FAMILY:SIZE``."""
    if base.startswith("scratch:"):
        parts = base.split(":")
        if len(parts) != 3:
            raise SesameError(f"--from {base}: write scratch:FAMILY:SIZE, e.g. scratch:bert:mini")
        fam = get_family(parts[1])
        get_size(parts[2])
        if fam.arch in FEATURE_EXTRACTORS:
            how = "sesame cove" if fam.arch == "cove" else "sesame pretrain --family elmo"
            raise SesameError(f"--from {base}: {fam.name} gives a task model pretrained features; make a run first "
                              f"(`{how}`) and fine-tune from it")
        tok = load_tokenizer(tokenizer) if tokenizer else train_tokenizer(train_texts, fam.tokenizer, 8000)
        if tok.kind != fam.tokenizer:
            raise SesameError(f"--tokenizer {tokenizer}: a {tok.kind} tokenizer, but {fam.name} uses {fam.tokenizer}")
        model_cfg = backbone_config(fam.name, parts[2], tok.vocab_size, tok.specials.pad, dropout)
        return {"family": fam.name, "size": parts[2], "pooling": fam.pooling, "model": model_cfg.to_dict()}, tok
    config = read_config(base, "--from", ("pretrained", "finetuned"))
    if tokenizer:
        raise SesameError(f"--tokenizer: {base} brings its own tokenizer; drop --tokenizer")
    config["model"]["dropout"] = dropout
    if config["model"].get("arch") in FEATURE_EXTRACTORS:
        config = {**config, "pooling": get_family(config["family"]).pooling,
                  "model": _reading_features(config["model"], config["size"], dropout)}
    return config, load_tokenizer(base, "--from")


def _family_finetune(base: str) -> dict:
    """The fine-tuning defaults of ``base``'s family (recurrent ones train at Adam's usual 2e-3): from the
    scratch spec or the run's config.json; none for a transformers directory or a model name."""
    if base.startswith("scratch:"):
        name = base.split(":")[1] if base.count(":") == 2 else None
    else:
        config = Path(base) / "config.json"
        name = read_json(config).get("family") if config.is_file() and "kind" in read_json(config) else None
    return FAMILIES[name].finetune if name in FAMILIES else {}


def _reading_features(features: dict, size: str, dropout: float) -> dict:
    """The task model over a pretrained feature extractor (ELMo's biLM, CoVe's encoder): the ``DOWNSTREAM``
    family (a BiLSTM) of the same size reading [x_k; features_k], its own word embeddings beside the frozen
    extractor's output (Peters et al. 2018, §3.3; McCann et al. 2017, §4). ELMo's layers enter through a scalar
    mix the task learns; the extractor runs without dropout, as at inference."""
    features = {**features, "dropout": 0.0, **({"scalar_mix": True} if "scalar_mix" in features else {})}
    size = size if size in RECURRENT_SIZES else "mini"
    task = backbone_config(DOWNSTREAM, size, features["vocab_size"], features["pad_id"], dropout).to_dict()
    # CoVe's task model starts from the MT-LSTM's own word vectors, [GloVe(x); CoVe(x)]
    return {**task, "embedding_size": features.get("embedding_size", RECURRENT_SIZES[size][0]), "features": features}


def _load_pretrained(model: TaskModel, run: Path) -> None:
    """Copy the backbone weights of a pretrained or fine-tuned run (its heads are left behind; an ELMo or
    CoVe run's go to the task model's frozen feature extractor, CoVe's word vectors also to its embedding),
    and the [CLS] pooler when the run trained one (BERT's NSP, ALBERT's SOP) and the task model pools [CLS].
    Adapters and a scalar mix the recipe adds keep their fresh initialisation; GPT's input tokens get
    new embedding rows (:mod:`sesame.tasks.inputs`)."""
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
            missing = [k for k in loaded.missing_keys if ".adapter." not in k and not k.startswith("mix.")]
            if missing or loaded.unexpected_keys:  # only the recipe's additions may be new
                raise SesameError(f"--from {run}: its {part} does not fit this model (missing {missing[:3]}, "
                                  f"unexpected {loaded.unexpected_keys[:3]})")


def _embed_vectors(backbone: torch.nn.Module, path: str, tok: TextTokenizer) -> float:
    """Copy word vectors (GloVe/word2vec text) into the backbone's word embedding; returns the share of the
    vocabulary found (the rest start at random, :func:`sesame.wordvectors.embedding_matrix`)."""
    vocabulary = [tok.backend.id_to_token(i) for i in range(tok.vocab_size)]
    matrix, found = embedding_matrix(load_vectors(path), vocabulary)
    with torch.no_grad():
        backbone.embed.tokens.weight.copy_(matrix)
    return round(float(found.float().mean()), 4)


def _scalar_metrics(report: dict) -> dict:
    return {k: v for k, v in report.items() if isinstance(v, (int, float))}


def _texts(rows: list[dict]) -> list[str]:
    """The raw text of examples (every string, or list of strings, they hold; each once: SQuAD shares
    a context among several questions), for training a tokenizer on the way."""
    texts = []
    for row in rows:
        for value in row.values():
            texts += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    return list(dict.fromkeys(texts))


def finetune(base: str, train: str, dev: str, out: str, task: str = "classify", text_column: str | None = None,
             label_column: str | None = None, tokenizer: str | None = None, max_length: int = 128, epochs: int = 3,
             dropout: float = 0.1, resume: bool = False, progress: bool = True, pooling: str | None = None,
             discriminative: float = 1.0, gradual_unfreezing: bool = False, task_options: dict | None = None,
             select: str | None = None, adapters: int | None = None, features: bool = False, lm_weight: float = 0.0,
             vectors: str | None = None, **train_options) -> dict:
    """Fine-tune ``base`` (a run directory, a transformers model directory, ``minilm``, or
    ``scratch:FAMILY:SIZE``; see :func:`sesame.interop.resolve`) on ``task`` (a name in
    :data:`sesame.tasks.TASKS`; ``text_column``, ``label_column`` and ``task_options`` are its options).

    ``pooling`` (``cls``, ``last`` or ``mean``; default: the family's) picks the representation a
    sequence head reads. ULMFiT's recipes (Howard & Ruder 2018, §3.2): ``discriminative`` = 2.6 divides the
    learning rate by 2.6 per layer group down from the head; ``gradual_unfreezing`` trains the head
    alone in the first epoch and unfreezes one more group (top down) each epoch; slanted triangular
    rates are ``schedule="stlr"``. ``adapters`` = m trains only bottleneck adapters of width m, the
    LayerNorms and the head (Houlsby et al. 2019); ``features`` freezes the backbone and trains a
    scalar mix of its layers and the head (ELMo); ``lm_weight`` = λ adds GPT's auxiliary LM loss
    (causal backbones; 0.5 in the paper). ``vectors`` (a GloVe or word2vec text file) initialises the
    word embedding of a scratch recurrent model, whose width becomes the vectors'. Evaluates on ``dev``
    after every epoch and keeps the weights with the best dev ``select`` metric (default: the task's,
    e.g. accuracy). The result also reports the trainable and total parameter counts. Training options
    are :class:`sesame.train.TrainConfig` fields; fine-tuning defaults follow BERT (lr 5e-5, batch 32,
    warmup 10%) unless the family sets its own (the recurrent ones: lr 2e-3). Returns the kept weights'
    dev metrics.
    """
    started = time.time()
    cfg = _train_config({"lr": 5e-5, "warmup": 0.1, "batch_size": 32, **_family_finetune(base), **train_options})
    cfg.validate()
    job = make_task(task, {"text_column": text_column, "label_column": label_column, **(task_options or {})})
    if epochs <= 0:
        raise SesameError(f"--epochs {epochs}: must be positive")
    if discriminative < 1:
        raise SesameError(f"--discriminative {discriminative}: use 1 (one rate) or more (2.6 in ULMFiT)")
    if gradual_unfreezing and world()[1] > 1:
        raise SesameError("--gradual-unfreezing: not supported under torchrun (DistributedDataParallel fixes the "
                          "trainable parameters when it starts); run it in one process")
    if adapters is not None and adapters <= 0:
        raise SesameError(f"--adapters {adapters}: give the bottleneck width, e.g. 64")
    if adapters and features:
        raise SesameError("--adapters and --features: choose one (adapters tune inside the network, features "
                          "freeze it)")
    if (adapters or features) and (gradual_unfreezing or discriminative != 1):
        raise SesameError("--adapters/--features fix what trains; drop --gradual-unfreezing and --discriminative")
    if lm_weight < 0:
        raise SesameError(f"--lm-weight {lm_weight}: must be 0 (off) or positive (0.5 in GPT)")
    if pooling is not None and pooling not in POOLINGS:
        raise SesameError(f"--pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
    if not 8 <= max_length <= 4096:
        raise SesameError(f"--max-length {max_length}: use a length between 8 and 4096")
    train_rows, dev_rows = job.read(train), job.read(dev)
    labels = job.labels(train_rows, train)
    job.check(dev_rows, labels, dev)
    select = select or job.select
    if select not in job.metrics(labels):
        raise SesameError(f"--select {select!r}: choose one of {', '.join(job.metrics(labels))} for --task {task}")
    _check_batch(cfg)
    # a transformers directory or minilm becomes a temporary run while the model is built from it
    scratch = base.startswith("scratch:")
    base_run = nullcontext(Path(base)) if scratch or resume else resolve(base, "--from")

    def setup(run: Path) -> None:
        base_config, tok = _base_config(str(base_dir), tokenizer, _texts(train_rows), dropout)
        add_input_tokens(base_config, tok)  # gpt: start, delimiter and extract tokens
        job.check_model(base_config["model"])
        model_config = base_config["model"]
        if model_config.get("arch", "transformer") == "transformer":
            model_config.update(adapter_size=adapters, scalar_mix=features)
        elif adapters or features:
            raise SesameError(f"--adapters/--features: recipes for Transformer backbones, and --from {base} is a "
                              f"{base_config['family']} model (ELMo and CoVe runs are read as frozen features already)")
        if features:
            model_config["dropout"] = 0.0  # frozen features are computed as at inference
        if lm_weight:
            check_auxiliary_lm(model_config_object(model_config))
        if vectors:
            if model_config.get("arch") != "recurrent" or not (scratch or model_config.get("features")):
                raise SesameError(f"--vectors {vectors}: initialises the word embedding of a new recurrent task model; "
                                  "use it with --from scratch:lstm|gru|bilstm:SIZE or an elmo run")
            if (model_config.get("features") or {}).get("arch") == "cove":
                raise SesameError(f"--vectors {vectors}: a CoVe task model reads the MT-LSTM's own word vectors "
                                  "([GloVe(x); CoVe(x)]); give the vectors to `sesame cove --vectors` instead")
            model_config["embedding_size"] = load_vectors(vectors).dim
        if max_length > model_config.get("max_positions", max_length):
            raise SesameError(f"--max-length {max_length} exceeds the model's {model_config['max_positions']} "
                              "positions")
        tok.save(run / "tokenizer.json")
        if job.has_labels:
            write_json(run / "labels.json", labels)
        write_config(run, {
            "kind": "finetuned", "task": task, "task_options": job.options(), "family": base_config["family"],
            "size": base_config["size"], "pooling": pooling or base_config["pooling"], "model": base_config["model"],
            "base": base, "max_length": max_length, "select": select,
            **({"hf": base_config["hf"]} if base_config.get("hf") else {}),  # a converted checkpoint exports back
            "recipe": {"discriminative": discriminative, "gradual_unfreezing": gradual_unfreezing, "adapters": adapters,
                       "features": features, "lm_weight": lm_weight, "vectors": vectors},
            "train_file": str(train), "dev_file": str(dev), "epochs": epochs, "train": asdict(cfg)})

    with base_run as base_dir, _claimed_run(out, "finetuned", resume, setup) as run:
        config = read_config(run, "--out", ("finetuned",))
        tok = load_tokenizer(run)
        torch.manual_seed(cfg.seed)
        model = job.build(build_backbone(config), len(labels), config["pooling"], dropout)
        if not resume and not scratch:
            _load_pretrained(model, base_dir)
        recipe = config["recipe"]
        coverage = {}
        if not resume and vectors:
            coverage["vectors_coverage"] = _embed_vectors(model.backbone, vectors, tok)
        recipes.freeze_features(model.backbone)
        frozen = "adapters" if recipe["adapters"] else "features" if recipe["features"] else None
        trainable = recipes.train_only(model, model.backbone, frozen) if frozen else \
            sum(p.numel() for p in model.parameters() if p.requires_grad)
        if recipe["lm_weight"]:
            add_auxiliary_lm(model, recipe["lm_weight"])
        causal = config["model"]["causal"]
        train_features = job.features(train_rows, tok, max_length, labels, causal)
        dev_features = job.features(dev_rows, tok, max_length, labels, causal)
        per_labeled_epoch = steps_per_epoch(len(train_features), cfg.batch_size)
        rank, size_world = world()
        lengths = [job.length(f) for f in train_features]

        def labeled_batches(step: int, progress: float) -> list[dict[str, torch.Tensor]]:
            epoch, k = divmod(step, per_labeled_epoch)
            order = bucketed_batches(lengths, cfg.batch_size, torch.Generator().manual_seed(cfg.seed + epoch))[k]
            mine = order[rank::size_world]
            per_micro = math.ceil(len(mine) / cfg.accumulate)
            micro = [job.collate([train_features[i] for i in mine[j: j + per_micro]], tok.specials.pad)
                     for j in range(0, len(mine), per_micro)]
            if recipe["lm_weight"]:
                for batch in micro:
                    batch["counts"] = {**loss_counts(batch), "lm": int(next_tokens(batch["padding"]).sum())}
            return micro

        batches, stride = job.training_batches(labeled_batches, tok, max_length, cfg.batch_size, cfg.seed)
        per_epoch = per_labeled_epoch * stride
        cfg.max_steps = cfg.max_steps if "max_steps" in train_options else epochs * per_epoch
        cfg.eval_every = cfg.save_every = per_epoch

        def evaluate_dev(m: TaskModel) -> dict:
            outputs = infer(m, job, dev_features, tok.specials.pad)
            return _scalar_metrics(job.score(dev_rows, dev_features, outputs, labels))

        groups = recipes.layer_groups(model, model.backbone)
        rates = recipes.discriminative_param_groups(groups, cfg.lr, cfg.weight_decay, discriminative)
        unfreeze = (lambda step: recipes.gradual_unfreezing(groups, step // per_epoch)) if gradual_unfreezing else None
        trainer = Trainer(model, run, cfg, batches, select=select, started=started, progress=progress,
                          param_groups=rates if discriminative != 1 else None, before_step=unfreeze,
                          evaluate=evaluate_dev)
        metrics = trainer.fit(resume=resume)
        if "null_threshold" in metrics and rank == 0:  # SQuAD 2.0: the no-answer threshold tuned on dev
            config["task_options"]["null_threshold"] = metrics["null_threshold"]
            write_config(run, config)
        return {**metrics, **coverage, "trainable_parameters": trainable,
                "parameters": sum(p.numel() for p in model.parameters())}


# -- using a run -----------------------------------------------------------------------------------

class Predictor:
    """A fine-tuned run (or a transformers sequence classifier, see :func:`sesame.interop.resolve`)
    loaded for prediction and evaluation. ``options`` override the task options the run was trained
    with (other column names, say)."""

    def __init__(self, run: str | Path, options: dict | None = None):
        self.run = Path(run)
        with resolve(run, "--model", classifier=True) as path:
            self.config = read_config(path, "--model", ("finetuned",))
            given = {k: v for k, v in (options or {}).items() if v is not None}
            self.task = make_task(self.config["task"], {**self.config["task_options"], **given})
            self.labels: list[str] = read_json(path / "labels.json") if self.task.has_labels else []
            self.tokenizer = load_tokenizer(path, "--model")
            self.model = self.task.build(build_backbone(self.config), len(self.labels), self.config["pooling"], 0.0)
            self.model.load_state_dict(load_weights(path / "model.safetensors"))
        self.model.eval()

    def _outputs(self, examples: list[dict]) -> tuple[list[dict], torch.Tensor]:
        features = self.task.features(examples, self.tokenizer, self.config["max_length"], self.labels,
                                      self.config["model"]["causal"])
        return features, infer(self.model, self.task, features, self.tokenizer.specials.pad)

    def predict(self, inputs: Sequence[str | dict]) -> list[dict]:
        """One prediction per input: a text, or an example dict as the task reads them (``{"text": ...,
        "pair": ...}`` for pairs). Classifiers give ``{"label": ..., "probabilities": {label: p}}``."""
        examples = [self.task.example(x) if isinstance(x, str) else x for x in inputs]
        if not examples:
            return []
        return self.task.predictions(examples, *self._outputs(examples), self.labels)

    def read(self, path: str, labeled: bool = False) -> list[dict]:
        return self.task.read(path, labeled)

    def evaluate(self, data: str) -> dict:
        """The task's full report on a labeled file."""
        examples = self.task.read(data)
        self.task.check(examples, self.labels, data)
        return self.task.score(examples, *self._outputs(examples), self.labels)


def load(run: str | Path, **options) -> Predictor:
    """Load a fine-tuned run (or a transformers sequence classifier directory) for prediction:
    ``sesame.load(run).predict(["text", ...])``; keyword arguments override its task options
    (``text_column="tweet"``)."""
    return Predictor(run, options)


def predict(model: str, texts: Sequence[str | dict]) -> list[dict]:
    return load(model).predict(texts)


def evaluate(model: str, data: Sequence[str] | str, text_column: str | None = None, label_column: str | None = None,
             text_field: str = "text", seq_len: int | None = None) -> dict:
    """Fine-tuned run: its task's metrics on a labeled file (classifiers: accuracy, macro-F1, MCC,
    per-class P/R/F1); ``text_column``/``label_column`` override the run's. Language model: loss,
    perplexity (and bits per byte for causal models) on text files, folders or a shard directory.
    ``model`` may also be a transformers directory: a sequence classifier, or a model with its pre-training
    head (``*ForMaskedLM``, ``GPT2LMHeadModel``, ...; :func:`sesame.interop.resolve`)."""
    with resolve(model, "--model") as run:
        return _evaluate_run(run, model, data, text_column, label_column, text_field, seq_len)


def _evaluate_run(run: Path, model: str, data: Sequence[str] | str, text_column: str | None,
                  label_column: str | None, text_field: str, seq_len: int | None) -> dict:
    config = read_config(run, "--model", ("pretrained", "finetuned"))
    if config["kind"] == "finetuned":
        if not isinstance(data, str):
            if len(data) != 1:
                raise SesameError("--data: give one labeled file for a fine-tuned model")
            data = data[0]
        return load(run, text_column=text_column, label_column=label_column).evaluate(data)
    if config["objective"] == "translation":
        raise SesameError(f"--model {model}: a CoVe MT-LSTM; score its translations with `sesame translate --model "
                          f"{model} --input SRC --reference TGT`")
    if config["objective"] is None:
        raise SesameError(f"--model {model}: converted from {config['hf']['model_type']} without its pre-training "
                          "heads, so it has no language-model loss to evaluate; fine-tune it, then evaluate that")
    paths = [data] if isinstance(data, str) else list(data)
    tok = load_tokenizer(run, "--model")
    obj = build_objective(config["objective"], build_backbone(config), tok, config.get("objective_options"))
    obj.load_state_dict(load_weights(run / "model.safetensors"))
    obj.eval()
    seq_len = seq_len or config["seq_len"]
    with tempfile.TemporaryDirectory() as tmp:
        shards = _prepared(paths, tok, Path(tmp) / "shards", "--data", text_field, progress=False)
        windows = shards.windows(obj.window_length(seq_len))
        if not windows:
            raise SesameError(f"--data: too little text for one window of {seq_len} tokens")
        return lm_metrics(obj, shards, windows, seq_len, text=text_size(paths, "--data", text_field))
