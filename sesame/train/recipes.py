"""Fine-tuning recipes: which parameters move and how fast.

:class:`Recipe` holds the settings (a fine-tuned run's config.json ``recipe``) and builds the
:class:`Technique` objects the fine-tuning pipeline drives without knowing which they are: ULMFiT's
discriminative rates and gradual unfreezing (Howard & Ruder 2018, §3.2) over a model's layer groups;
training only adapters (Houlsby et al. 2019, §2.1) or only a scalar mix over frozen features (Peters et
al. 2018, eq. 1), modules the technique inserts into the built backbone (:mod:`sesame.models.additions`, recorded
as config.json's ``additions``, not in the backbone's configuration); GPT's auxiliary LM loss (Radford et al. 2018,
eq. 5, :mod:`sesame.train.auxiliary_lm`); re-initialising the top layers and the pooler before fine-tuning on few
labels (Zhang et al. 2021, §5).
Slanted triangular rates live with the other schedules, in :mod:`sesame.train.optim`.

Layer groups run bottom to top: the backbone's embeddings, one group per Transformer or recurrent
layer, then the task head. Frozen parameters stay in the optimizer's groups; AdamW skips a parameter whose ``.grad``
is None, so it neither moves nor decays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..errors import SesameError
from ..models import ModelConfig, build_model
from ..models.additions import Adapter, Additions, ScalarMix, takes_additions
from ..options import check_ranges, option
from .auxiliary_lm import add_auxiliary_lm, check_auxiliary_lm, next_tokens
from .trainer import Batch, loss_counts


@dataclass(kw_only=True)
class Recipe:
    """Which parameters move and how fast when fine-tuning; written to a fine-tuned run's config.json."""
    discriminative: float = option(1.0, metavar="FACTOR",
                                   help="ULMFiT's discriminative rates: each layer's lr is the next one up's / FACTOR "
                                        "(2.6 in the paper; the head gets --lr); default 1: one rate for all")
    gradual_unfreezing: bool = option(False, help="ULMFiT: train only the head in epoch 1, then unfreeze one more "
                                                  "layer group per epoch")
    adapters: int | None = option(None, metavar="M", help="train only bottleneck adapters of width M (e.g. 64), "
                                                          "LayerNorms and the head (Houlsby)")
    features: bool = option(False, help="freeze the backbone; train a scalar mix of its layers and the head (ELMo)")
    # None: the family's (Family.finetune_recipe): 0.5 for gpt, as Radford et al. (2018, §3.2 eq. 5; §4.1)
    # fine-tune; off for the others (GPT-2, 2019, was evaluated zero-shot and defines no λ)
    lm_weight: float | None = option(None, metavar="LAMBDA", help="add GPT's auxiliary LM loss on the task's inputs, "
                                                                  "weighted LAMBDA (causal backbones); default: the "
                                                                  "family's, 0.5 for gpt as in the paper, else 0 (off)")
    vectors: str | None = option(None, metavar="FILE", help="GloVe/word2vec text file: the word embedding of a new "
                                                            "recurrent task model starts from it")
    reinit_layers: int = option(0, metavar="N", help="the top N layers and the [CLS] pooler start as a new model's "
                                                     "instead of from the pretrained weights (Zhang et al. 2021, "
                                                     "few-sample fine-tuning); default 0: every layer pretrained")
    embedding_rate: float = option(1.0, within=(0.0, math.inf), metavar="SHARE",
                                   help="the token embeddings' share of the fine-tuning rate: 0 keeps the table as "
                                        "the starting model has it (default 1: one rate for every weight)")

    def validate(self, *, processes: int = 1) -> None:
        """Refuse settings that contradict each other (before anything is written)."""
        check_ranges(self)
        if self.discriminative < 1:
            raise SesameError(f"--discriminative {self.discriminative}: use 1 (one rate) or more (2.6 in ULMFiT)")
        if self.gradual_unfreezing and processes > 1:
            raise SesameError("--gradual-unfreezing: not supported under torchrun (DistributedDataParallel fixes "
                              "the trainable parameters when it starts); run it in one process")
        if self.adapters is not None and self.adapters <= 0:
            raise SesameError(f"--adapters {self.adapters}: give the bottleneck width, e.g. 64")
        if self.adapters and self.features:
            raise SesameError("--adapters and --features: choose one (adapters tune inside the network, features "
                              "freeze it)")
        if (self.adapters or self.features) and (self.gradual_unfreezing or self.discriminative != 1):
            raise SesameError("--adapters/--features fix what trains; drop --gradual-unfreezing and --discriminative")
        if self.reinit_layers < 0:
            raise SesameError(f"--reinit-layers {self.reinit_layers}: give how many top layers start anew (0: none)")
        if self.reinit_layers and (self.adapters or self.features):
            raise SesameError("--reinit-layers with --adapters/--features: those keep the backbone frozen, so new "
                              "layers would never train; drop one")
        if self.embedding_rate != 1 and (self.adapters or self.features or self.discriminative != 1):
            raise SesameError("--embedding-rate with --adapters/--features/--discriminative: those set the rates "
                              "already; drop one")
        if self.lm_weight is not None and self.lm_weight < 0:
            raise SesameError(f"--lm-weight {self.lm_weight}: must be 0 (off) or positive (0.5 in GPT)")

    def with_defaults(self, defaults: dict) -> Recipe:
        """The recipe with the family's fine-tuning defaults (:attr:`sesame.families.Family.finetune_recipe`) for
        fields left at None; λ stays off with ``features``, whose frozen backbone the LM loss could not move."""
        lm_weight = self.lm_weight
        if lm_weight is None:
            lm_weight = 0.0 if self.features else defaults.get("lm_weight", 0.0)
        return replace(self, lm_weight=lm_weight)

    def techniques(self) -> Techniques:
        """The techniques these settings switch on, driven as one. ``vectors`` is none: it chooses where the
        word embedding starts, not what trains, and stays with the pipeline's starting point."""
        parts: list[Technique] = []
        if self.discriminative != 1:
            parts.append(Discriminative(factor=self.discriminative))
        if self.gradual_unfreezing:
            parts.append(GradualUnfreezing())
        if self.adapters:
            parts.append(Adapters(size=self.adapters))
        if self.features:
            parts.append(Features())
        if self.lm_weight:
            parts.append(AuxiliaryLM(weight=self.lm_weight))
        if self.reinit_layers:
            parts.append(Reinitialised(layers=self.reinit_layers))
        if self.embedding_rate != 1:
            parts.append(TableRate(share=self.embedding_rate))
        return Techniques(parts)


class Technique:
    """One technique of a fine-tuning recipe. The fine-tuning pipeline calls every hook of every technique at
    its moment, knowing none by name; a hook a technique does not need does nothing."""

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        """Before the task model is built: check its backbone configuration ``model`` (config.json's ``model``) and
        return it as the technique needs it (changed with ``dataclasses.replace``); ``source`` names the starting
        model in errors."""
        return model

    def insert(self, additions: Additions) -> Additions:
        """What the backbone gets inserted once built (config.json's ``additions``, :mod:`sesame.models.additions`),
        ``additions`` being the other techniques'."""
        return additions

    def fresh(self, model: nn.Module) -> list[nn.Module]:
        """The modules of the task model, as built, that keep their new initialisation when pretrained weights load."""
        return []

    def prepare(self, model: nn.Module) -> None:
        """After the task model's weights load: choose which of its parameters train; add losses."""

    def param_groups(self, model: nn.Module, *, lr: float, weight_decay: float) -> list[dict] | None:
        """AdamW's parameter groups, or None for its default two (:func:`sesame.train.optim.adamw`)."""
        return None

    def before_step(self, *, step: int, epoch: int) -> None:
        """Before optimizer step ``step``, in epoch ``epoch`` (both from 0)."""

    def count(self, batch: Batch) -> None:
        """Count the terms of the losses this technique adds in ``batch["counts"]``."""


@dataclass
class Techniques(Technique):
    """A recipe's techniques as one: each hook calls theirs in order; the first parameter groups given win
    (:meth:`Recipe.validate` lets at most one technique give them)."""
    parts: list[Technique] = field(default_factory=list)

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        for part in self.parts:
            model = part.configure(model, source=source)
        return model

    def insert(self, additions: Additions) -> Additions:
        for part in self.parts:
            additions = part.insert(additions)
        return additions

    def fresh(self, model: nn.Module) -> list[nn.Module]:
        return [module for part in self.parts for module in part.fresh(model)]

    def prepare(self, model: nn.Module) -> None:
        for part in self.parts:
            part.prepare(model)

    def param_groups(self, model: nn.Module, *, lr: float, weight_decay: float) -> list[dict] | None:
        given = (part.param_groups(model, lr=lr, weight_decay=weight_decay) for part in self.parts)
        return next((groups for groups in given if groups is not None), None)

    def before_step(self, *, step: int, epoch: int) -> None:
        for part in self.parts:
            part.before_step(step=step, epoch=epoch)

    def count(self, batch: Batch) -> None:
        for part in self.parts:
            part.count(batch)


def _check_additions(model: ModelConfig, source: str) -> None:
    """Refuse inserting adapters or a scalar mix into a backbone of configuration ``model`` that is no Transformer
    stack."""
    if not takes_additions(model):
        raise SesameError(f"--adapters/--features: recipes for Transformer backbones, and {source} (ELMo and "
                          "CoVe runs are read as frozen features already)")


@dataclass(kw_only=True)
class Discriminative(Technique):
    """ULMFiT's discriminative fine-tuning (Howard & Ruder 2018, §3.2, eq. 2): each layer group trains at the
    rate of the group above divided by ``factor``."""
    factor: float

    def param_groups(self, model: nn.Module, *, lr: float, weight_decay: float) -> list[dict]:
        return discriminative_param_groups(layer_groups(model, model.backbone), lr, weight_decay, self.factor)


@dataclass
class GradualUnfreezing(Technique):
    """ULMFiT's gradual unfreezing (Howard & Ruder 2018, §3.2): the head alone in the first epoch, then one
    more layer group each epoch."""
    groups: list[list[nn.Parameter]] = field(default_factory=list, repr=False)

    def prepare(self, model: nn.Module) -> None:
        self.groups = layer_groups(model, model.backbone)

    def before_step(self, *, step: int, epoch: int) -> None:
        gradual_unfreezing(self.groups, epoch)


@dataclass(kw_only=True)
class Adapters(Technique):
    """Houlsby et al. (2019, §2.1): a bottleneck adapter of width ``size`` after every attention and
    feed-forward sublayer; only the adapters, the LayerNorms and the task head train."""
    size: int

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        _check_additions(model, source)
        return model

    def insert(self, additions: Additions) -> Additions:
        return replace(additions, adapter_size=self.size)

    def prepare(self, model: nn.Module) -> None:
        train_only(model, model.backbone, "adapters")


class Features(Technique):
    """ELMo-style frozen features (Peters et al. 2018, §3.3, eq. 1): the backbone frozen and run without
    dropout, as at inference; only a scalar mix of its layers and the task head train."""

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        _check_additions(model, source)
        return replace(model, dropout=0.0)

    def insert(self, additions: Additions) -> Additions:
        return replace(additions, scalar_mix=True)

    def prepare(self, model: nn.Module) -> None:
        train_only(model, model.backbone, "features")


@dataclass(kw_only=True)
class AuxiliaryLM(Technique):
    """GPT's auxiliary LM loss, weighted ``weight`` (λ; Radford et al. 2018, §3.2, eq. 5)."""
    weight: float

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        check_auxiliary_lm(model)
        return model

    def prepare(self, model: nn.Module) -> None:
        add_auxiliary_lm(model, self.weight)

    def count(self, batch: Batch) -> None:
        batch["counts"] = {**loss_counts(batch), "lm": int(next_tokens(batch["padding"]).sum())}


@dataclass(kw_only=True)
class Reinitialised(Technique):
    """Zhang et al. (2021, §5, "Re-initializing Pre-trained Layers"): the top ``layers`` layer groups of the backbone
    (:meth:`layer_modules`, so ALBERT's shared stack is one group and an encoder-decoder counts down from the
    decoder's top) and the task head's pooler (BERT's, which NSP trained) keep the initialisation the task model was
    built with, as the scratch twin of the same seed starts them; the layers below and the embeddings load the
    pretrained weights. Every parameter then trains."""
    layers: int

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        with torch.device("meta"):  # built to count its layer groups: no weights, no time
            depth = len(build_model(model).layer_modules()) - 1
        if self.layers > depth:
            raise SesameError(f"--reinit-layers {self.layers}: {source} with {depth} layers; give at most {depth}")
        return model

    def fresh(self, model: nn.Module) -> list[nn.Module]:
        groups = model.backbone.layer_modules()[1:]  # (the embeddings never start anew)
        pooler = getattr(model, "pooler", None)
        top = [module for group in groups[-self.layers:] for module in group if module is not None]
        return top + ([pooler] if pooler is not None else [])


@dataclass(kw_only=True)
class TableRate(Technique):
    """The token table (``embed.tokens``) at ``share`` × the rate of the weights around it, 0 freezing it as the
    starting model has it (pre-training's ``--embedding-rate`` for fine-tuning). Not a default: keeping BERT's
    counted table fixed cost its counted twin 1.2 points on airline with 1,000 labels, and its scratch twin 4.7
    (docs/results/time_to_quality.md)."""
    share: float

    def configure(self, model: ModelConfig, *, source: str) -> ModelConfig:
        with torch.device("meta"):  # built to find its table: no weights, no time
            embed = getattr(build_model(model), "embed", None)
        if not isinstance(getattr(embed, "tokens", None), nn.Embedding):
            raise SesameError(f"--embedding-rate: {source} reads no table of token embeddings")
        return model

    def prepare(self, model: nn.Module) -> None:
        if self.share == 0:
            model.backbone.embed.tokens.weight.requires_grad_(False)

    def param_groups(self, model: nn.Module, *, lr: float, weight_decay: float) -> list[dict] | None:
        if self.share == 0:
            return None  # AdamW's default groups take only what trains
        groups = discriminative_param_groups(layer_groups(model, model.backbone), lr, weight_decay, 1.0)
        return table_share(groups, model.backbone.embed.tokens.weight, self.share)


def layer_groups(model: nn.Module, backbone: nn.Module) -> list[list[nn.Parameter]]:
    """``model``'s trainable parameters in layer groups, bottom to top: the backbone's
    ``layer_modules()`` (its embeddings, then one group per layer: for a Transformer ``attention[l - 1]``
    and ``feed_forward[l - 1]``, the top layer also ``final_norm`` and ELMo's ``mix``; for a recurrent
    stack one LSTM layer each), then everything outside the backbone (the task head: pooler, classifier...).

    Each parameter is listed once, in the first group that names it. A sublayer that ALBERT shares across
    layers (Lan et al. 2020, §3.1) belongs to the top layer's group alone, so with ``sharing="all"`` the
    lower layers' groups are empty; they keep their place, so group l is always depth l. Parameters
    frozen before the recipe starts (a frozen feature extractor such as ELMo's biLM) belong to no group.

    A model with no parameters outside the backbone (a causal LM objective, whose softmax is the tied word
    embedding ``embed.tokens``) has that embedding as its head: it moves to the top group, as fastai's
    ``awd_lstm_lm_split`` puts the tied encoder and decoder together in the last group, so the target-task
    LM (ULMFiT §3.2) trains its output layer, and the task's new words, at the peak rate; the bottom group
    keeps the rest of the embeddings (a Transformer's positions) or is left empty."""
    depth: dict[int, int] = {}  # id(parameter) → its group
    modules = backbone.layer_modules()
    for g, group in enumerate(modules):
        for module in group:
            if module is not None:
                for p in module.parameters():
                    depth.setdefault(id(p), g)
    missing = [name for name, p in backbone.named_parameters() if id(p) not in depth and p.requires_grad]
    if missing:
        raise ValueError(f"layer_groups: no layer for the backbone's {', '.join(missing)}")
    groups: list[list[nn.Parameter]] = [[] for _ in range(len(modules) + 1)]
    for p in model.parameters():
        if p.requires_grad:
            groups[depth.get(id(p), len(modules))].append(p)
    if not groups[-1]:  # head-less: the tied word embedding is the output layer
        tied = backbone.embed.tokens.weight
        if tied.requires_grad:
            groups[depth[id(tied)]].remove(tied)
            groups[-1].append(tied)
    return groups


def discriminative_param_groups(groups: list[list[nn.Parameter]], lr: float, weight_decay: float,
                                factor: float = 2.6) -> list[dict]:
    """AdamW parameter groups with discriminative fine-tuning (ULMFiT §3.2, eq. 2: η^{l−1} = η^l / 2.6):
    layer group g of G trains at ``lr / factor**(G − 1 − g)``, so the top group (the head) at ``lr``;
    ``factor`` = 1 gives every group ``lr``. This is also the layer-wise decay η·decay^(L−l) of ELECTRA
    (Clark et al. 2020) with decay = 1/factor, whose released code sets its head two steps above the top
    layer where ULMFiT and this function set it one.

    Each layer group is split as :func:`~sesame.train.optim.adamw` splits a model: tensors with ndim ≥ 2
    decay, the rest (biases, norms) do not. Every dict carries its ``lr`` and the same value as
    ``base_lr``, which the schedule multiplies; empty groups are left out."""
    top = len(groups) - 1
    param_groups = []
    for g, params in enumerate(groups):
        rate = lr / factor ** (top - g)
        for decay, chosen in ((weight_decay, [p for p in params if p.ndim >= 2]),
                              (0.0, [p for p in params if p.ndim < 2])):
            if chosen:
                param_groups.append({"params": chosen, "lr": rate, "base_lr": rate, "weight_decay": decay})
    return param_groups


def table_share(groups: list[dict], table: nn.Parameter, share: float) -> list[dict]:
    """``groups`` with the token embedding ``table`` moved to a group of its own at ``share`` × the rate (and the
    decay) of the group it was in (``pretrain --embedding-rate``); that group comes last, so the first group's rate,
    the one the log shows, stays the peak's."""
    kept, own = [], []
    for group in groups:
        rest = [p for p in group["params"] if p is not table]
        if len(rest) < len(group["params"]):
            own.append({**group, "params": [table], "lr": group["lr"] * share, "base_lr": group["base_lr"] * share})
        if rest:
            kept.append({**group, "params": rest})
    return kept + own


def gradual_unfreezing(groups: list[list[nn.Parameter]], epoch: int) -> int:
    """Gradual unfreezing (ULMFiT §3.2): in epoch ``epoch`` (from 0) the top ``epoch + 1`` layer groups
    train and the others are frozen (``requires_grad`` False), so the head trains alone first and one
    more group joins each epoch until all train. Returns the number of trainable parameter elements.

    With ALBERT's sharing some groups are empty (see :func:`layer_groups`): their epochs unfreeze
    nothing new, and the schedule stays that of the unshared model."""
    first = len(groups) - 1 - epoch
    for g, params in enumerate(groups):
        for p in params:
            p.requires_grad_(g >= first)
    return sum(p.numel() for params in groups[max(0, first):] for p in params)


def train_only(model: nn.Module, backbone: nn.Module, recipe: str) -> int:
    """Freeze all of ``model`` but what ``recipe`` trains; returns the trainable parameter elements.

    * ``adapters`` (Houlsby et al. 2019, §2.1): the backbone's adapters and LayerNorms, and everything
      outside the backbone (the task head);
    * ``features`` (ELMo, Peters et al. 2018, §3.3): the backbone's scalar mix and the task head; the
      pre-trained network is a frozen feature extractor."""
    kinds = {"adapters": (Adapter, nn.LayerNorm), "features": (ScalarMix,)}[recipe]
    trainable = {id(p) for m in backbone.modules() if isinstance(m, kinds) for p in m.parameters()}
    inside = {id(p) for p in backbone.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable or id(p) not in inside)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def freeze_features(backbone: nn.Module) -> None:
    """Freeze a task model's feature extractor (ELMo's biLM, CoVe's MT-LSTM; Peters et al. 2018, §3.3: "freeze
    the weights of the biLM"), all but its scalar mix, which the task learns."""
    features = getattr(backbone, "features", None)
    if features is not None:
        mixes = {id(p) for m in features.modules() if isinstance(m, ScalarMix) for p in m.parameters()}
        for p in features.parameters():
            p.requires_grad_(id(p) in mixes)
