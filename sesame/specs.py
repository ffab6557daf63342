"""Typed specs: what the command line, ``compare``, ``ulmfit`` and the Python API hand to a pipeline (the schema
of a run's ``config.json`` is :mod:`sesame.run`'s).

A spec is built once (from flags, from an approach string, or from keywords), validated before anything
is written, and is the only thing that passes into :mod:`sesame.pipelines`. Every default is written
once: here, in :class:`sesame.train.TrainConfig`, in :class:`sesame.train.recipes.Recipe`, or in the
family's row (:mod:`sesame.families`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from .data.shards import is_shard_dir
from .errors import SesameError
from .families import FAMILIES, SIZES, Family, finetune_rate, get_family, get_size, recurrent_dropouts
from .models import ARCHITECTURES, model_config, position_limit
from .objectives import OBJECTIVES
from .objectives.distillation import LOSSES, Distillation
from .objectives.seq2seq import require_sentinels
from .options import RATE, check_ranges, defaults, option, split_known, typed_value
from .runtime import Runtime, given_runtime
from .tasks import BATCHINGS, POOLINGS, TASKS
from .tasks.mixing import MIXING_CAP, check_spec
from .tokenizer import SENTINEL_SHARE, sentinel_count
from .train import TrainConfig
from .train.recipes import Recipe

# Pre-training's rates for budgets of minutes to hours: a peak of 1e-3 after 10% warmup trained post-LN BERT and
# GPT stably in 20 minutes where 5e-4 underfit (docs/results/foundation.md; Geiping & Goldstein 2022 likewise push the
# rate up for short budgets), under a family's own recipe (AWD-LSTM, ELMo, RoBERTa's batches)
PRETRAIN_TRAINING = {"lr": 1e-3, "warmup": 0.1}
# A token table that starts from counts (--embedding-init ppmi, COUNTED_FAMILIES' default) keeps more of them at a
# third of that peak: 60 minutes of BERT-mini at 3e-4 fine-tuned 0.9 (airline) and 3.1 (SST-2) points above the same
# minutes at 1e-3, with 1,000 labels (docs/results/time_to_quality.md, issue 36). A family's recipe and --lr win
COUNTED_TRAINING = {"lr": 3e-4}
# the families whose new runs start from the counts (their rows' pretrain_embedding_init)
COUNTED_FAMILIES = [f.name for f in FAMILIES.values() if f.pretrain_embedding_init == "ppmi"]
# BERT's fine-tuning settings (Devlin et al. 2019, §4 and A.3), under the size's rate and a family's own; and under
# --max-minutes, dev read at half the time too (an epoch may outlast the budget). Not more often: each reading of
# CoNLL-2003's dev took a minute of a busy machine's 5-minute budget (docs/results/foundation.md)
FINETUNE_TRAINING = {"lr": 5e-5, "warmup": 0.1, "batch_size": 32, "eval_points": 2}
# A model from scratch learns its weights, not an adaptation of them: it takes pre-training's rates. At a fine-tuning
# rate (bert mini's 1e-4, tiny's 2e-4) a CoNLL-2003 tagger from scratch called every word O after the 100-400 steps a
# 5-minute budget gives a busy machine; at 1e-3 it finds entities within 50 (docs/results/foundation.md, issue 37).
SCRATCH_TRAINING = PRETRAIN_TRAINING
# Epochs when --epochs is not given: enough for MIN_STEPS optimizer steps on a small training set, within
# EPOCHS (BERT's 3 for large ones; 20 at most); with --max-minutes, as many as the time allows (TIMED_EPOCHS).
MIN_STEPS, EPOCHS, TIMED_EPOCHS = 250, (3, 20), 1000
SEQ_LENGTHS = (8, 4096)  # the window lengths a spec accepts
EMBEDDING_INITS = ("random", "ppmi")  # pretrain --embedding-init: a new model's first token embeddings
AUTO = "auto"  # pretrain --size auto: the size a --max-minutes budget affords (sesame.budget)


def default_epochs(steps_per_epoch: int, *, timed: bool) -> int:
    """The epochs of a fine-tuning run whose epoch is ``steps_per_epoch`` optimizer steps (module constants)."""
    if timed:
        return TIMED_EPOCHS
    low, high = EPOCHS
    return max(low, min(high, math.ceil(MIN_STEPS / max(1, steps_per_epoch))))


def check_length(flag: str, value: int) -> None:
    low, high = SEQ_LENGTHS
    if not low <= value <= high:
        raise SesameError(f"{flag} {value}: use a length between {low} and {high}")


def training(defaults: dict, overrides: dict) -> TrainConfig:
    """The validated TrainConfig of ``overrides`` over ``defaults`` (a family's recipe) over TrainConfig's own. A
    time budget given without a step budget is the budget: ``max_minutes`` alone lifts the default step cap."""
    split_known(overrides, TrainConfig)  # a misspelt name is a TypeError naming the known ones
    given = {k: v for k, v in overrides.items() if v is not None}
    if "max_minutes" in given and "max_steps" not in given:
        given["max_steps"] = None
    cfg = TrainConfig(**{**defaults, **given})
    cfg.validate()
    return cfg


CASED_HELP = ("keep letter case in the tokenizer trained on the way (WordPiece lower-cases by default, as uncased "
              "BERT; capitals mark names, so NER wants it)")


@dataclass(kw_only=True)
class RecurrentDropouts:
    """fastai's single dropout multiplier (ULMFiT's code), a field of the specs that build a recurrent model."""
    drop_mult: float | None = option(None, metavar="M", help="recurrent models (AWD-LSTM): multiply all five dropouts "
                                                             "of the family's row (output, between layers, input, "
                                                             "embedding, DropConnect; the output's is --dropout when "
                                                             "given) by M, as fastai's drop_mult")

    def recurrent_dropouts(self, family: str, dropout: float | None, *, arch: str, what: str) -> dict[str, float]:
        """The backbone config fields ``drop_mult`` sets on a model of ``family`` and architecture ``arch``
        (:func:`sesame.families.recurrent_dropouts`; none without ``drop_mult``); a model that is not recurrent
        is refused, ``what`` naming it."""
        if self.drop_mult is None:
            return {}
        return recurrent_dropouts(family, dropout, self.drop_mult, arch=arch, what=what)


@dataclass(kw_only=True)
class StageSpec:
    """The fields of every training stage's spec (pre-training's and fine-tuning's), declared once."""
    training: dict = option(factory=dict, cli=False, help="TrainConfig fields over the stage's defaults (pre-training: "
                                                          "the family's recipe; fine-tuning: BERT's and the family's)")
    runtime: Runtime = option(factory=Runtime, cli=False, help="device, precision, TF32, compile (sesame.runtime)")
    resume: bool = option(False, help="continue the run in --out from its last checkpoint")
    explicit: frozenset[str] | None = option(None, cli=False, help="the fields (and recipe fields) the user set, "
                                                                  "which --resume checks against the run (None: those "
                                                                  "not at their default; sesame.resume)")
    progress: bool = option(True, cli=False, help="show progress bars")


@dataclass(kw_only=True)
class PretrainSpec(StageSpec, RecurrentDropouts):
    """``sesame pretrain``: a family and size pre-trained on a corpus (or a pretrained run continued on one, or a
    student distilled from a ``teacher``: DistilBERT, :mod:`sesame.pipelines.distilbert`, with the options of its
    ``distillation``, a :class:`~sesame.objectives.distillation.Distillation` there is one of with a teacher)."""
    corpus: list[str] = option(help="text files, folders, .jsonl, .csv or .tsv (their --text-field), or one shard "
                                    "directory")
    out: str = option(help="run directory")
    family: str = option("bert", choices=FAMILIES, help="the model family (sesame.families)")
    size: str = option("mini", choices=(*SIZES, AUTO),
                       help="tiny, mini, small, medium or base; auto: with --max-minutes, the largest size whose "
                            "parameters x 20 (Hoffmann et al. 2022) fit the tokens this machine's measured throughput "
                            "gives in the budget, and a batch to match (docs/pretraining.md)")
    valid: list[str] | None = option(None, help="validation text (default: the corpus's last 1%%)")
    tokenizer: str | None = option(None, help="tokenizer.json to use (default: train one on the corpus)")
    vocab_size: int = option(16000, help="size of the tokenizer trained on the way")
    cased: bool = option(False, help=CASED_HELP)
    seq_len: int = option(128, help="tokens per training window")
    dropout: float | None = option(None, within=RATE, help="dropout rate (default: the family's pre-training "
                                                           "dropout: 0 for Transformers, AWD-LSTM's and ELMo's own)")
    attention_window: int | None = option(None, metavar="W", help="GPT-3's locally banded attention: every second "
                                                                  "layer sees only the W nearest positions")
    model_options: dict = option(factory=dict, cli=False,
                                 help="a new model's configuration over its family and size's (--model-option): e.g. "
                                      "norm=pre, bias=false, activation=gelu_tanh, layers=2")
    text_field: str = option("text", help="the text field of JSON Lines records (.jsonl, .jsonl.gz, .jsonl.zst), "
                                          "the text column of Parquet, .csv and .tsv files (a task's training file: "
                                          "its other columns, the labels among them, are never read)")
    mixing_temperature: float | None = option(None, metavar="T", help="draw each training window from one --corpus "
                                              "argument (a file or folder: a source) at a rate ∝ its windows^(1/T) "
                                              "(T5's temperature-scaled mixing, Raffel et al. 2020, §3.5.2): 1 keeps "
                                              "the sources' shares, larger upsamples the small ones, such as the "
                                              "task's own texts (default: the windows as they come, shuffled)")
    embedding_init: str | None = option(None, choices=EMBEDDING_INITS,
                                        help="a new model's first token embeddings: random (the family's "
                                             "initialisation), or ppmi: the truncated SVD of the corpus's positive "
                                             "PMI (Levy et al. 2015), computed within the budget, then a peak rate "
                                             f"of {COUNTED_TRAINING['lr']:g} unless --lr is given (default: the "
                                             f"family's: ppmi for {', '.join(COUNTED_FAMILIES)}, random for the "
                                             "others; docs/pretraining.md)")
    embedding_rate: float = option(1.0, within=(0.0, math.inf), metavar="SHARE",
                                   help="the token embeddings' learning rate as a share of the peak rate: 0 keeps "
                                        "the table as it started (with --embedding-init ppmi, the counted vectors) "
                                        "while the layers learn over it (default 1: one rate for every weight; "
                                        "docs/pretraining.md)")
    objective: str | None = option(None, help="override the family's objective, e.g. mlm for BERT without NSP")
    objective_options: dict = option(factory=dict, cli=False,
                                     help="the objective's options over the family's (--masking, --objective-option)")
    static_masks: int = option(0, help="k fixed masks per sequence, as original BERT (default 0: fresh masks every "
                                       "time)")
    final_seq_len: int | None = option(None, help="BERT's second phase: sequences this long for the last 10%% of "
                                                  "the budget")
    base: str | None = option(None, flag="--from", metavar="RUN",
                              help="continue a pretrained run on --corpus: its family, shape, tokenizer and weights "
                                   "(continued or domain-adaptive pre-training: ULMFiT's target-task LM, Gururangan "
                                   "et al. 2020's DAPT)")
    teacher: str | None = option(None, metavar="MODEL", help="distil a student of half its layers from this masked "
                                                            "LM (DistilBERT): a pretrained run, a transformers BERT-"
                                                            "like directory, or minilm; the family, size, tokenizer "
                                                            "and width are its")
    discriminative: float = option(1.0, cli=False, help="divide the rate by this per layer down from the top")
    distillation: Distillation | None = option(None, cli=False, help="DistilBERT's options with --teacher (their "
                                                                     "flags are Distillation's fields)")

    def __post_init__(self) -> None:
        self.corpus = [str(p) for p in ([self.corpus] if isinstance(self.corpus, (str, Path)) else self.corpus)]
        self.valid = [str(p) for p in ([self.valid] if isinstance(self.valid, (str, Path)) else self.valid)] \
            if self.valid else None
        self.out = str(self.out)
        if self.teacher is not None and self.distillation is None:
            self.distillation = Distillation()  # DistilBERT's own
        elif self.teacher is None and self.distillation == Distillation():
            self.distillation = None  # none given: no teacher, nothing to distil

    @classmethod
    def of(cls, corpus: list[str] | str, out: str, **options: Any) -> PretrainSpec:
        """The spec of the Python API's keywords: spec fields, DistilBERT's (``kl_weight=...``) as ``distillation``,
        and TrainConfig fields (``lr=...``) as ``training``."""
        spec, taught, train, runtime = split_known(options, cls, Distillation, TrainConfig, Runtime)
        training, runtime = {**spec.pop("training", {}), **train}, given_runtime(spec, runtime)
        if taught:
            spec["distillation"] = replace(spec.get("distillation") or Distillation(), **taught)
        return cls(corpus=corpus, out=out, **spec, training=training, runtime=runtime,
                   explicit=frozenset({"corpus", "out", *spec, *taught}))

    @property
    def fam(self) -> Family:
        return get_family(self.family)

    @property
    def objective_name(self) -> str:
        return self.objective or self.fam.objective

    @property
    def embedding_start(self) -> str:
        """``--embedding-init``, else the family's for a new model (``--from`` and ``--teacher`` bring theirs)."""
        if self.embedding_init is not None:
            return self.embedding_init
        return "random" if self.base or self.teacher else self.fam.pretrain_embedding_init

    def given_fields(self) -> set[str]:
        """The fields the user set: ``explicit``, else those not at their default."""
        if self.explicit is not None:
            return set(self.explicit)
        unset = defaults(PretrainSpec)
        return {name for name, value in unset.items() if getattr(self, name) != value}

    def train_config(self) -> TrainConfig:
        """Pre-training's TrainConfig: the short-budget rates < a counted table's < the family's recipe < given."""
        counted = COUNTED_TRAINING if self.embedding_start == "ppmi" else {}
        return training({**PRETRAIN_TRAINING, **counted, **self.fam.recipe}, self.training)

    def longest_examples(self) -> tuple[int, str]:
        """The length of the longest examples, and its flag: ``--final-seq-len`` when given, else ``--seq-len``."""
        return (self.final_seq_len, "--final-seq-len") if self.final_seq_len else (self.seq_len, "--seq-len")

    def window_length(self) -> int:
        """The corpus tokens of one training example of the objective, with its options, at ``--seq-len``."""
        return OBJECTIVES[self.objective_name].window_length(self.seq_len, **self.objective_settings())

    def objective_settings(self) -> dict:
        """The objective's options: the family's (for its own objective), then the spec's."""
        fam = self.fam
        return {**(fam.objective_options if self.objective_name == fam.objective else {}), **self.objective_options}

    def _check_auto(self) -> None:
        """``--size auto`` sizes a new model for a time budget."""
        if self.train_config().max_minutes is None:
            raise SesameError("--size auto: sizes the model for a time budget; give --max-minutes N, or a size ("
                              f"{', '.join(SIZES)})")
        if self.base:
            raise SesameError(f"--size auto: --from {self.base} brings its own shape; drop --size")

    def validate(self) -> None:
        """Every check that reads no file: the family, size, objective, budget and lengths fit together, and a
        tokenizer trained on the way has the sentinels the objective's longest examples need."""
        fam = self.fam
        if self.size == AUTO:
            self._check_auto()
        else:
            get_size(self.size)
        check_ranges(self)
        if self.distillation is not None:
            self.distillation.check(self.teacher)
        if self.objective_name is None:
            how = f"is trained by `sesame {fam.command}`" if fam.command else \
                f"is a baseline trained from scratch: `sesame finetune --from scratch:{fam.name}:SIZE`"
            raise SesameError(f"--family {fam.name}: has no pre-training objective; it {how}")
        if self.objective_name not in OBJECTIVES:
            raise SesameError(f"--objective {self.objective_name!r} is unknown; choose one of: {', '.join(OBJECTIVES)}")
        if not OBJECTIVES[self.objective_name].trains(fam.arch):
            fits = [name for name, o in OBJECTIVES.items() if o.trains(fam.arch)]
            raise SesameError(f"--objective {self.objective_name}: does not train a {fam.arch} model (--family "
                              f"{fam.name}); choose one of: {', '.join(fits)}")
        known = set(OBJECTIVES[self.objective_name].options)
        unknown = set(self.objective_settings()) - known
        if unknown:
            raise SesameError(f"--objective-option {', '.join(sorted(unknown))}: not an option of the "
                              f"{self.objective_name} objective; it takes {', '.join(sorted(known)) or 'none'}")
        for key, value in self.objective_settings().items():
            OBJECTIVES[self.objective_name].check_option(key, value)
        # one made of windows of a corpus? (and span corruption's options: room for text at this length?)
        self.window_length()
        self.train_config()
        self.recurrent_dropouts(self.family, self.dropout, arch=fam.arch, what=f"--family {fam.name}")
        if self.discriminative < 1:
            raise SesameError(f"--discriminative {self.discriminative}: use 1 (one rate) or more (2.6 in ULMFiT)")
        check_length("--seq-len", self.seq_len)
        if self.final_seq_len is not None:
            check_length("--final-seq-len", self.final_seq_len)
            # the positions pre-training gives a new model, max(context, --seq-len), where they are a learned table
            # (not T5's relative position bias, nor a recurrent model's)
            model = model_config({"arch": fam.arch, "vocab_size": self.vocab_size, **fam.model_options})
            positions = max(fam.context, self.seq_len) if position_limit(model) is not None else None
            most = f" and be at most {positions} (the model's positions)" if positions else ""
            if self.final_seq_len <= self.seq_len or positions and self.final_seq_len > positions:
                raise SesameError(f"--final-seq-len {self.final_seq_len}: must exceed --seq-len {self.seq_len}{most}")
        trained = not (self.tokenizer or self.base or (len(self.corpus) == 1 and is_shard_dir(Path(self.corpus[0]))))
        if trained:  # (a tokenizer read from a file is checked once read, before the run is written)
            larger = f"a larger --vocab-size (one id in {SENTINEL_SHARE} becomes a sentinel, up to {fam.sentinels})"
            with_them = ", ".join(f.name for f in FAMILIES.values() if f.sentinels)
            require_sentinels(OBJECTIVES[self.objective_name], *self.longest_examples(), self.objective_settings(),
                              have=sentinel_count(self.vocab_size, fam.sentinels), fix=f", or {larger}",
                              source=f"the tokenizer trained with --vocab-size {self.vocab_size}" if fam.sentinels
                              else f"the tokenizer --family {fam.name} trains", none=larger if fam.sentinels else
                              f"give --tokenizer one that has them (`sesame tokenizer train --kind {fam.tokenizer} "
                              f"--sentinels 100`), or pre-train a family whose tokenizer does ({with_them})")
        if self.attention_window is not None:
            banded = any(f.name == "attention_window" for f in fields(ARCHITECTURES[fam.arch][0]))
            if not banded:
                raise SesameError(f"--attention-window: banded attention is for Transformers; {fam.name} is {fam.arch}")
            if self.attention_window < 1:
                raise SesameError(f"--attention-window {self.attention_window}: give the band width in positions, "
                                  "e.g. 64")
        if self.static_masks < 0:
            raise SesameError(f"--static-masks {self.static_masks}: use 0 (fresh masks each time) or a positive count")
        if self.embedding_init not in (None, "random"):
            self._check_token_table(f"--embedding-init {self.embedding_init}", new_model=True)
        if self.embedding_rate != 1:
            self._check_token_table(f"--embedding-rate {self.embedding_rate:g}", new_model=False)
        if self.model_options:
            self._check_model_options()
        if self.mixing_temperature is not None:
            self._check_mixing()

    def _check_mixing(self) -> None:
        """``--mixing-temperature`` mixes two or more --corpus arguments of text, each window drawn anew."""
        flag = f"--mixing-temperature {self.mixing_temperature:g}"
        if not (self.mixing_temperature > 0 and math.isfinite(self.mixing_temperature)):
            raise SesameError(f"{flag}: a number above 0 (1: each source at its share of the windows)")
        if len(self.corpus) < 2 or self.base:
            what = f"--from {self.base} continues on --corpus alone" if self.base else "one --corpus is one source"
            raise SesameError(f"{flag}: mixes two or more --corpus arguments, and {what}; give each source as a "
                              "--corpus argument of its own, or drop the flag")
        if self.static_masks:
            raise SesameError(f"{flag}: draws each window afresh, where --static-masks {self.static_masks} fixes a "
                              "window's masks per pass over the corpus; drop one of them")

    def _check_token_table(self, flag: str, *, new_model: bool) -> None:
        """``--embedding-init ppmi`` starts a new model's table of token embeddings (``new_model``);
        ``--embedding-rate`` sets any model's rate for its table."""
        if new_model and (self.base or self.teacher):
            source = f"--from {self.base}" if self.base else f"--teacher {self.teacher}"
            raise SesameError(f"{flag}: {source} brings its own embeddings; drop {flag}")
        if not self.fam.token_table:
            raise SesameError(f"{flag}: {self.fam.name} spells its tokens from characters and has no table of token "
                              "embeddings; drop the flag")

    def _check_model_options(self) -> None:
        """``--model-option KEY=VALUE``: fields of a new model's configuration that neither the tokenizer, the
        objective nor a flag of their own decides, each with a value the configuration accepts."""
        given = set(self.model_options)
        if self.base or self.teacher:
            source = f"--from {self.base}" if self.base else f"--teacher {self.teacher}"
            raise SesameError(f"--model-option {', '.join(sorted(given))}: {source} brings its own model; drop "
                              "--model-option")
        for key, flag in MODEL_FLAGS.items():
            if key in given:
                raise SesameError(f"--model-option {key}: set it with {flag}")
        settable = {f.name: f for f in fields(ARCHITECTURES[self.fam.arch][0]) if f.name not in MODEL_FIXED}
        unknown = given - set(settable)
        if unknown:
            raise SesameError(f"--model-option {', '.join(sorted(unknown))}: not a setting of a {self.fam.arch} "
                              f"model; it takes {', '.join(sorted(settable))}")
        for key, value in self.model_options.items():
            typed_value(settable[key], value, where=f"--model-option {key}")
        if self.size == AUTO and given & MODEL_SHAPE:
            raise SesameError(f"--model-option {', '.join(sorted(given & MODEL_SHAPE))}: --size auto picks the shape; "
                              "give a size, or drop the shape's options")
        try:
            model_config({"arch": self.fam.arch, "vocab_size": self.vocab_size, **self.fam.model_options,
                          **self.model_options})
        except (TypeError, ValueError) as error:
            raise SesameError(f"--model-option: {error}") from None


MODEL_FIXED = {"vocab_size", "pad_id", "causal", "decoder_start_id"}  # the tokenizer's and the objective's
MODEL_FLAGS = {"dropout": "--dropout", "attention_window": "--attention-window"}  # options with a flag of their own
MODEL_SHAPE = {"hidden", "layers", "heads", "intermediate", "embedding_size"}  # what --size sets


@dataclass(kw_only=True)
class FinetuneSpec(StageSpec, RecurrentDropouts):
    """``sesame finetune``: a model (a run, a transformers directory, ``minilm``, ``scratch:FAMILY:SIZE``, or a run's
    twin ``scratch:RUN`` or ``counts:RUN``: sesame.sources) fine-tuned on a labeled task; ``task_options`` are the
    task's (its columns, ...), ``recipe`` says which parameters move and how fast, ``training`` holds TrainConfig
    fields over the fine-tuning defaults."""
    base: str = option(flag="--from", help="run directory, transformers model directory, minilm (the installed "
                                           "all-MiniLM-L6-v2), scratch:FAMILY:SIZE, scratch:RUN (a pretrained run's "
                                           "family, shape and tokenizer with new weights), or counts:RUN (that twin "
                                           "with the token table the run's counts give)")
    train: str | None = option(None, help="CSV, TSV or JSONL; CoNLL columns for tag; SQuAD JSON for span_qa")
    dev: str | None = option(None, help="the dev file: evaluated after every epoch (or every --eval-every steps), "
                                              "picks the kept weights")
    mixture: str | None = option(None, help="text2text over several tasks at once, instead of --train and --dev: a "
                                            'JSON file {"NAME": {"train": FILE, "dev": FILE, "prefix": ..., "cast": '
                                            '...}, ...} (docs/text2text.md)')
    mixing_cap: int = option(MIXING_CAP, within=(1, math.inf),
                             help="--mixture: T5's examples-proportional mixing caps each task's size at K "
                                  "(Raffel et al. 2020, §3.5.2; 2^19)")
    mixing_temperature: float = option(1.0, help="--mixture: the mixing temperature T; rates ∝ min(size, K)^(1/T) "
                                                 "(1: examples-proportional; larger: towards equal mixing)")
    out: str = option(help="run directory")
    task: str = option("classify", choices=TASKS,
                       help="classify: text → label; pair: two texts → label; regress: text(s) → number; tag: a label "
                            "per word (CoNLL columns); span_qa: extractive QA (SQuAD JSON); multiple_choice: context + "
                            "candidates → the right one (JSONL); text2text: text → text (T5, "
                            "docs/text2text.md)")
    task_options: dict = option(factory=dict, cli=False, help="the task's options (--text-column, --task-option)")
    select: str | None = option(None, help="dev metric that picks the kept epoch (default: the task's: accuracy; "
                                           "pearson for regress; f1 for tag and span_qa; also macro_f1, mcc, "
                                           "spearman, exact)")
    tokenizer: str | None = option(None, help="for scratch models: tokenizer.json or a run (default: train one)")
    cased: bool = option(False, help=CASED_HELP)
    max_length: int = option(128, help="tokens per input")
    epochs: int | None = option(None, help="passes over the training set, each ending with a dev evaluation unless "
                                           f"--eval-every is given (default: enough for {MIN_STEPS} steps, {EPOCHS[0]} "
                                           f"to {EPOCHS[1]}; with --max-minutes, until the time is up)")
    dropout: float = option(0.1, within=RATE, help="dropout rate of the model and head (a recurrent model's output "
                                                   "dropout; --drop-mult scales AWD-LSTM's others)")
    pooling: str | None = option(None, choices=POOLINGS,
                                 help="what a sequence head reads: the first token through a tanh pooler, the last real "
                                      "token, the mean or max over real tokens, or ULMFiT's concat pooling (default: "
                                      "the family's)")
    batching: str = option("bucketed", choices=tuple(BATCHINGS),
                           help="bucketed: batches of similar lengths (less padding, faster); shuffled: plain random "
                                "batches, whose label mix does not follow text length")
    recipe: Recipe = option(factory=Recipe, cli=False, help="which parameters move and how fast")

    def __post_init__(self) -> None:
        self.base, self.out = str(self.base), str(self.out)
        self.train, self.dev, self.mixture = (None if p is None else str(p)
                                              for p in (self.train, self.dev, self.mixture))

    @classmethod
    def of(cls, base: str, train: str | None, dev: str | None, out: str, **options: Any) -> FinetuneSpec:
        """The spec of the Python API's keywords: spec fields, recipe fields (``lm_weight=0.5``), TrainConfig
        fields (``lr=...``), and ``text_column``/``label_column`` as task options."""
        columns = {k: options.pop(k) for k in ("text_column", "label_column") if k in options}
        spec, recipe, train_options, runtime = split_known(options, cls, Recipe, TrainConfig, Runtime)
        runtime = given_runtime(spec, runtime)
        explicit = frozenset({"base", "train", "dev", "out", *spec, *recipe})
        task_options = {**(spec.pop("task_options", None) or {}), **columns}
        recipe = spec.pop("recipe", None) or Recipe(**recipe)
        training = {**spec.pop("training", {}), **train_options}
        return cls(base=base, train=train, dev=dev, out=out, **spec, task_options=task_options, recipe=recipe,
                   training=training, runtime=runtime, explicit=explicit)

    @property
    def head_dropout(self) -> float:
        """The task head's dropout: ``dropout`` times ``drop_mult`` (fastai's classifier head takes the encoder's
        output dropout, scaled)."""
        return self.dropout * (self.drop_mult if self.drop_mult is not None else 1.0)

    def train_config(self, family: Family, *, size: str | None, scratch: bool) -> TrainConfig:
        """Fine-tuning's TrainConfig: BERT's defaults < the rate of pre-trained weights of the size
        (:func:`sesame.families.finetune_rate`; ``size`` None for imported weights), or of a model from ``scratch``
        (:data:`SCRATCH_TRAINING`) < the family's < given."""
        rates = SCRATCH_TRAINING if scratch else finetune_rate(size)
        return training({**FINETUNE_TRAINING, **rates, **family.finetune}, self.training)

    def validate(self, *, processes: int = 1) -> None:
        check_ranges(self)
        if self.epochs is not None and self.epochs <= 0:
            raise SesameError(f"--epochs {self.epochs}: must be positive")
        self.recipe.validate(processes=processes)
        check_length("--max-length", self.max_length)
        self._validate_files()

    def _validate_files(self) -> None:
        """Labeled files: --train and --dev, or a --mixture of text2text tasks (sesame.tasks.mixing.check_spec)."""
        if self.mixture is None and (self.train is None or self.dev is None):
            raise SesameError("--train and --dev: give both labeled files (or --mixture FILE for several text2text "
                              "tasks at once)")
        if self.mixture is not None and (self.train is not None or self.dev is not None):
            raise SesameError(f"--mixture {self.mixture} names each task's train and dev files: leave out --train and "
                              "--dev")
        check_spec(mixture=self.mixture, task=self.task, cap=self.mixing_cap, temperature=self.mixing_temperature,
                   task_options=self.task_options)


@dataclass(kw_only=True)
class DistilSpec(FinetuneSpec):
    """``sesame distil``: a student (``base``: a run, a transformers directory or ``scratch:FAMILY:SIZE``) trained
    to match a fine-tuned teacher's outputs on ``unlabeled`` text (and on the text of ``train``, whose gold labels
    add ``alpha`` × the task loss), with every fine-tuning option; ``task`` and its options default to the
    teacher's. The loss: :mod:`sesame.objectives.distillation`."""
    base: str = option(flag="--student", metavar="MODEL", help="the student: a run, a transformers model directory, "
                                                               "minilm, or scratch:FAMILY:SIZE (any family, an LSTM "
                                                               "included)")
    teacher: str = option(help="a fine-tuned run, or a transformers sequence classifier directory")
    teacher_outputs: str | None = option(None, metavar="RUN", help="an earlier distil run of this teacher on the "
                                                                   "same transfer set: its outputs, not scored again")
    unlabeled: list[str] = option(help="CSV, TSV or JSONL files whose text (the task's text columns) the teacher "
                                       "labels")
    train: str | None = option(None, help="labeled examples: the teacher labels their text too, and with --alpha "
                                          "their gold labels add to the loss")
    task: str | None = option(None, choices=[name for name, task in TASKS.items() if task.distils],
                              help="the teacher's task, which is the default")
    loss: str | None = option(None, choices=LOSSES, help="kl: T²·KL(teacher_T ‖ student_T) (Hinton et al. 2015; "
                                                         "default for classifiers); mse: squared error of the logits "
                                                         "(the only one for regress)")
    temperature: float = option(2.0, help="T of the kl loss (Hinton et al. 2015; 2 in DistilBERT)")
    alpha: float = option(0.0, help="weight of the task loss on --train's gold labels (0: off)")
    hidden_weight: float = option(0.0, help="weight of intermediate-layer matching, the hidden states' squared error "
                                            "through a learned map where widths differ (TinyBERT; 0: off); the student "
                                            "must read the teacher's token ids (a scratch student: --tokenizer "
                                            "TEACHER)")
    layer_map: list[str] | None = option(None, metavar="S:T", help="--hidden-weight's pairs of student:teacher layers "
                                                                   "(0: the embeddings), e.g. 0:0 1:3 2:6 (default: "
                                                                   "every student layer, spread evenly over the "
                                                                   "teacher's)")

    no_flags: ClassVar[tuple[str, ...]] = ("mixture", "mixing_cap", "mixing_temperature")  # text2text's

    def __post_init__(self) -> None:
        super().__post_init__()
        self.unlabeled = [str(p) for p in ([self.unlabeled] if isinstance(self.unlabeled, (str, Path))
                                           else self.unlabeled)]
        self.teacher = str(self.teacher)
        if self.recipe.lm_weight is None:  # not GPT's default auxiliary LM: the student learns the teacher alone
            self.recipe = replace(self.recipe, lm_weight=0.0)

    def _validate_files(self) -> None:
        """--dev (--train is optional); no --mixture: a teacher's outputs are one row per example of one task."""
        if self.mixture is not None:
            raise SesameError(f"mixture={self.mixture!r}: distil learns one teacher's task on --unlabeled text; "
                              "leave out the mixture")
        if self.dev is None:
            raise SesameError("--dev: give the labeled dev file that picks the kept epoch")

    def validate(self, *, processes: int = 1) -> None:
        super().validate(processes=processes)
        if self.temperature <= 0:
            raise SesameError(f"--temperature {self.temperature}: must be positive (2 in DistilBERT)")
        if self.alpha < 0 or self.alpha and self.train is None:
            raise SesameError(f"--alpha {self.alpha}: weighs the loss on --train's gold labels; give a --train file "
                              "and an --alpha of 0 or more")
        if self.recipe.lm_weight:
            raise SesameError(f"--lm-weight {self.recipe.lm_weight}: the student learns the teacher's outputs alone; "
                              "drop --lm-weight")
        if self.hidden_weight < 0 or self.layer_map is not None and not self.hidden_weight:
            raise SesameError(f"--hidden-weight {self.hidden_weight}: weighs intermediate-layer matching (which "
                              "--layer-map maps); give a positive weight, or 0 and no --layer-map")
        self.layer_pairs()

    def layer_pairs(self) -> list[tuple[int, int]] | None:
        """--layer-map as (student layer, teacher layer) pairs; None: the default map (or no matching)."""
        return None if self.layer_map is None else layer_pairs(self.layer_map)


def layer_pairs(items: list[str]) -> list[tuple[int, int]]:
    """``--layer-map``'s items (``S:T``, separated by spaces or commas) as (student layer, teacher layer) pairs."""
    pairs = []
    for item in (piece.strip() for text in items for piece in text.split(",")):
        student, sep, teacher = item.partition(":")
        if not item:
            continue
        if not (sep and student.isdigit() and teacher.isdigit()):
            raise SesameError(f"--layer-map {item}: write STUDENT:TEACHER layer numbers, e.g. 1:3 (0: the "
                              "embeddings)")
        pairs.append((int(student), int(teacher)))
    if not pairs or len(set(pairs)) < len(pairs):
        raise SesameError(f"--layer-map {' '.join(items)}: give each pair once, at least one")
    return pairs
