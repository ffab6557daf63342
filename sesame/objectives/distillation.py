"""Distillation losses: a student's outputs against a teacher's, summed over examples (the trainer divides by
their count), for any model whose outputs are one row of logits (or scores) per example.

* ``kl``: Hinton, Vinyals & Dean 2015 ("Distilling the Knowledge in a Neural Network"), §2: the student's
  softmax at temperature T is trained towards the teacher's, q_i = exp(z_i/T) / Σ_j exp(z_j/T); as the
  gradients of these soft targets scale as 1/T², the loss is multiplied by T² (§2, last paragraph) so its
  weight against a hard-label loss does not change with T. Here the soft-target term is written as
  KL(teacher_T ‖ student_T), which differs from Hinton's cross-entropy by the teacher's entropy, a constant:
  the gradients are the same and a student that equals its teacher has loss 0.
* ``mse``: regression on the logits themselves, ‖z_teacher − z_student‖² per example (Ba & Caruana 2014, "Do
  Deep Nets Really Need to be Deep?", §2.2; Tang et al. 2019, "Distilling Task-Specific Knowledge from BERT
  into Simple Neural Networks", §3.2, eq. 2); Hinton's §2.1 shows it is the high-temperature limit of ``kl``
  for zero-mean logits. Deviation: Ba & Caruana's factor 1/2 is left out (Tang et al.'s form). It is the only
  choice for regression, whose single score has no softmax.

Intermediate-layer matching (:class:`LayerMatching`), beside either: Jiao et al. 2020 ("TinyBERT: Distilling BERT for
Natural Language Understanding"), §3.1: student layer m learns teacher layer g(m) (0: the embeddings, g(0) = 0) by
the mean squared error of its hidden states H^S W against the teacher's H^T, where W is a learned linear map from the
student's width to the teacher's (TinyBERT's W_h, and W_e for the embeddings); the default g is the uniform strategy
of its §4 study of mapping functions, g(m) = m·N/M (:func:`uniform_layer_map`). Deviations: TextBrewer's form (Yang et
al. 2020), one map W per matched pair, and none where the widths agree (TinyBERT's students are narrower than their
teachers); the mean runs over real tokens only (TinyBERT's code averages over padding too); TinyBERT's attention-matrix
loss is left out (it needs attention maps of equal head count, which an LSTM student has not).

Pre-training distillation (:class:`MaskedLMDistillation`, ``sesame pretrain --teacher``): DistilBERT, Sanh et al. 2019
("DistilBERT, a distilled version of BERT"). §3: the student has the teacher's architecture and width with half its
layers, initialised "by taking one layer out of two" (:func:`every_other_layer`; the released
``extract_distilbert.py`` takes layers 0, 2, 4, 7, 9, 11 of BERT-base's 12, which ``--student-layers`` gives), the
embeddings and the masked-LM head copied (:func:`student_weights`); it trains on the teacher's corpus with dynamic
masking and without next-sentence prediction. §2: the loss is a linear combination of the distillation loss
L_ce = Σ_i t_i · log(s_i) over the teacher's soft targets at temperature T, the masked-LM loss L_mlm and the cosine
loss L_cos between the student's and the teacher's last hidden states; the weights 5·L_ce + 2·L_mlm + 1·L_cos and
T = 2 are the released training command's (the paper names no values), and L_ce is multiplied by T² as in Hinton's §2
and the released ``distiller.py``. Each term is a mean: L_ce and L_mlm over the masked positions, L_cos = mean of
1 − cos(h^S, h^T) over every token. Two more parts of the released recipe (its ``train.py`` and training command) are
defaults here, recorded in config.json's ``setup`` (runs made before them resume without them): the student's position
embeddings stay the teacher's (``--freeze_pos_embs``; ``train_positions`` trains them), and the masked positions are
drawn in proportion to count^−0.7 of their tokens over the corpus (``--mlm_smoothing 0.7``;
:func:`.masking.smoothed_weights` and :func:`.masking.mask_weighted_rows`; ``mlm_smoothing`` 0: BERT's uniform
Bernoulli(0.15) choice), so rare tokens are predicted more often. Deviations: L_ce is written as KL(teacher_T ‖ student_T) (as ``kl`` above: the
same gradients, 0 when the student equals its teacher); it is taken at the masked positions only (the released code's
``--restrict_ce_to_mask``; its default takes every token), since sesame projects onto the vocabulary only where the
MLM predicts; the token-type embeddings are kept (DistilBERT drops them; sesame's pair tasks read segments); a teacher
without a masked-LM head (all-MiniLM-L6-v2 ships its encoder alone) gives no soft targets, so it distils with L_mlm
and L_cos alone (``--kl-weight 0``) and the student's head starts fresh.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SesameError
from ..models.padding import real_tokens
from ..options import option
from .masking import smoothed_weights
from .mlm import MaskedLM, masked_entries


def soft_target_loss(student: torch.Tensor, teacher: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """T² · Σ_examples KL(softmax(teacher / T) ‖ softmax(student / T)) over logits ``[N, k]`` (module
    docstring)."""
    log_student = F.log_softmax(student.float() / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher.float() / temperature, dim=-1)
    return temperature ** 2 * F.kl_div(log_student, log_teacher, log_target=True, reduction="sum")


def logit_loss(student: torch.Tensor, teacher: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """Σ_examples ‖teacher − student‖² over logits (or scores) ``[N, k]``; the temperature plays no part."""
    return F.mse_loss(student.float(), teacher.float(), reduction="sum")


LOSSES = {"kl": soft_target_loss, "mse": logit_loss}


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """TinyBERT's uniform mapping (§4, "Effects of Mapping Function"): student layer m of M ↦ teacher layer
    g(m) = m·N/M of N, rounded to the nearest (halves up), for m = 0 (the embeddings, g(0) = 0) to M (g(M) = N)."""
    return [(m, (2 * m * teacher_layers + student_layers) // (2 * student_layers)) for m in range(student_layers + 1)]


class LayerMatching(nn.Module):
    """The hidden-state loss of a student's layers against a teacher's (module docstring): for each pair (s, t) of
    ``pairs`` the student's layer s (``[B, T, student_widths[s]]``, 0: the embeddings) goes through its map W (a
    learned ``nn.Linear`` to ``teacher_widths[t]``, or the identity where the two agree) and is compared with the
    teacher's layer t at the same positions. ``teacher(batch)`` gives the teacher's layers for the student's batch
    (the same token ids); it is no submodule: the teacher is neither trained nor saved with the learner.
    ``weight`` is the loss's weight beside the others (:class:`sesame.pipelines.distil.Distilled`)."""

    def __init__(self, pairs: list[tuple[int, int]], student_widths: list[int], teacher_widths: list[int], *,
                 teacher: Callable[[dict[str, torch.Tensor]], list[torch.Tensor]], weight: float):
        super().__init__()
        self.pairs, self.teacher, self.weight = pairs, teacher, weight
        self.maps = nn.ModuleList(nn.Identity() if student_widths[s] == teacher_widths[t]
                                  else nn.Linear(student_widths[s], teacher_widths[t]) for s, t in pairs)

    def forward(self, student: list[torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Σ_pairs Σ_real tokens mean over the teacher's width of (h^S W − h^T)²: summed over the real tokens
        (``batch["padding"]``; every token where it is None), which the caller counts, so that the trainer's mean is
        TinyBERT's MSE per pair."""
        teacher, real = self.teacher(batch), real_tokens(batch["ids"], batch["padding"])
        total = torch.zeros((), device=real.device)
        for (s, t), projection in zip(self.pairs, self.maps):
            error = (projection(student[s]).float() - teacher[t].float()).pow(2).mean(-1)
            total = total + error[real].sum()
        return total


# -- pre-training distillation (DistilBERT) ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Distillation:
    """DistilBERT's options (module docstring), one typed part of ``sesame pretrain``'s spec, its ``distillation``
    (None without ``--teacher``); each field is a flag of the command and a keyword of ``sesame.pretrain``."""
    student_layers: list[int] | None = option(None, metavar="L", help="with --teacher: the teacher's layers the "
                                                                      "student's start from, bottom to top (0: the "
                                                                      "first layer; default: one out of two, 0 2 4 "
                                                                      "...; DistilBERT's code takes 0 2 4 7 9 11 of 12)")
    kl_weight: float = option(5.0, help="with --teacher: weight of T²·KL(teacher_T ‖ student_T) at the masked "
                                        "positions (DistilBERT: 5; 0 for a teacher without a masked-LM head)")
    mlm_weight: float = option(2.0, help="with --teacher: weight of the student's own masked-LM loss (DistilBERT: 2)")
    cosine_weight: float = option(1.0, help="with --teacher: weight of 1 − cos between the student's and the "
                                            "teacher's last hidden states (DistilBERT: 1)")
    temperature: float = option(2.0, help="with --teacher: T of the soft targets (DistilBERT: 2)")
    train_positions: bool = option(False, help="with --teacher: train the student's position embeddings (DistilBERT "
                                               "keeps the teacher's, frozen: its --freeze_pos_embs)")
    mlm_smoothing: float = option(0.7, help="with --teacher: mask a token in proportion to its corpus count^-S "
                                       "(DistilBERT: 0.7, rare tokens more often; 0: each token by a uniform 15%% "
                                       "draw, as BERT); token masking only")

    def check(self, teacher: str | None) -> None:
        """Refuse DistilBERT's options without a ``teacher``, or out of range."""
        defaults = {f.name: f.default for f in fields(Distillation)}
        if teacher is None:
            given = [f"--{name.replace('_', '-')}" for name in defaults if getattr(self, name) != defaults[name]]
            if given:
                raise SesameError(f"{', '.join(given)}: options of pre-training distillation; give --teacher too, or "
                                  "leave them out")
            return
        for name in ("kl_weight", "mlm_weight", "cosine_weight"):
            if getattr(self, name) < 0:
                raise SesameError(f"--{name.replace('_', '-')} {getattr(self, name)}: a weight is 0 (off) or more")
        if self.mlm_smoothing < 0:
            raise SesameError(f"--mlm-smoothing {self.mlm_smoothing}: use 0 (uniform masking) or more (DistilBERT: "
                              "0.7)")
        if self.temperature <= 0:
            raise SesameError(f"--temperature {self.temperature}: must be positive (2 in DistilBERT)")
        layers = self.student_layers
        if layers is not None and (not layers or min(layers) < 0 or len(set(layers)) < len(layers)):
            raise SesameError(f"--student-layers {' '.join(map(str, layers))}: give each teacher layer once, numbered "
                              "from 0, at least one")


def every_other_layer(layers: int) -> list[int]:
    """DistilBERT's student (§3): one layer out of two of a teacher of ``layers`` layers, from the first: 0, 2, 4, ..."""
    return list(range(0, layers, 2))


LAYER_KEY = re.compile(r"^(backbone\.(?:attention|feed_forward)\.)(\d+)(\..*)$")  # one layer's sublayers


def student_weights(teacher: dict[str, torch.Tensor], student: dict[str, torch.Tensor],
                    layers: list[int]) -> dict[str, torch.Tensor]:
    """The student's state (``student``: its own, fresh) initialised from the ``teacher``'s: student layer i is teacher
    layer ``layers[i]`` (attention and feed-forward, with their norms), every other tensor the teacher has under the
    same name (the embeddings, a pre-norm stack's final norm, the masked-LM head) is the teacher's, and the rest keep
    the student's own (a head the teacher lacks)."""
    def source(name: str) -> str:
        match = LAYER_KEY.match(name)
        return f"{match[1]}{layers[int(match[2])]}{match[3]}" if match else name

    return {name: teacher[source(name)].clone() if source(name) in teacher else value
            for name, value in student.items()}


class MaskedLMDistillation(nn.Module):
    """DistilBERT's pre-training loss around a ``student`` masked LM (module docstring): the summed parts ``mlm``
    (cross-entropy of the original tokens at the masked positions), ``kl`` (T²·KL(teacher_T ‖ student_T) there, when
    the teacher gives soft targets) and ``cosine`` (1 − cos of the last hidden states, at every token), which the
    trainer divides by their counts and weighs by ``weights``. ``teacher(batch)`` gives the teacher's last hidden
    states and its logits at the masked positions (None: it has no head) for the student's batch; it is no submodule:
    the teacher is neither trained nor saved. Batches are the student's (:meth:`make_batch`), validation scores all
    parts and reports the perplexity of the first, ``mlm``. The recipe's masking and frozen positions (module
    docstring): given the corpus's token ``counts`` and ``smoothing`` > 0, the student masks tokens in proportion to
    count^−smoothing; unless ``train_positions``, its position embeddings are frozen."""

    pairs = False
    classified: tuple[str, ...] = ()

    def __init__(self, student: MaskedLM, teacher: Callable[[dict], tuple[torch.Tensor, torch.Tensor | None]], *,
                 soft_targets: bool, weights: dict[str, float], temperature: float, counts: torch.Tensor | None,
                 smoothing: float, train_positions: bool):
        super().__init__()
        self.student, self.teacher, self.temperature = student, teacher, temperature
        if smoothing:
            student.token_weights = smoothed_weights(counts, smoothing, student.special_ids)
        student.backbone.embed.positions.weight.requires_grad_(train_positions)
        self.part_names = ("mlm", *(("kl",) if soft_targets else ()), "cosine")
        self.part_weights = {name: weights[name] for name in self.part_names}

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        batch = self.student.make_batch(windows, generators)
        return {**batch, "counts": {"mlm": batch["masked"], "kl": batch["masked"], "cosine": batch["ids"].numel()}}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.student.backbone(batch["ids"])
        taught, soft = self.teacher(batch)
        return distillation_parts(self.student, hidden, taught, soft, batch, self.temperature, self.part_names)

    def score(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return self(batch), {}


@torch.compiler.disable
def distillation_parts(student: MaskedLM, hidden: torch.Tensor, taught: torch.Tensor, soft: torch.Tensor | None,
                       batch: dict[str, torch.Tensor], temperature: float, names: tuple[str, ...]
                       ) -> dict[str, torch.Tensor]:
    """The summed parts of :class:`MaskedLMDistillation` from the student's and the teacher's last states and
    the teacher's logits at the masked positions; eager under ``--compile`` (the masked count varies, as in
    :func:`sesame.objectives.mlm.masked_loss`)."""
    logits = student.masked_logits(hidden, batch).float()
    parts = {"mlm": F.cross_entropy(logits, masked_entries(batch, "targets"), reduction="sum")}
    if "kl" in names:
        parts["kl"] = soft_target_loss(logits, soft, temperature=temperature)
    parts["cosine"] = (1 - F.cosine_similarity(hidden.float(), taught.float(), dim=-1)).sum()
    return parts


def frozen_teacher(model: nn.Module) -> Callable[[dict], tuple[torch.Tensor, torch.Tensor | None]]:
    """:class:`MaskedLMDistillation`'s ``teacher`` of ``model``, a masked LM (its backbone's last states and its
    logits at the batch's masked positions) or a bare backbone (its last states, no logits), frozen in eval mode; it
    follows the batch to its device (once: then it is there)."""
    model.eval().requires_grad_(False)

    def outputs(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.no_grad():
            placed = model.to(batch["ids"].device)
            if isinstance(placed, MaskedLM):
                hidden = placed.backbone(batch["ids"])
                return hidden, placed.masked_logits(hidden, batch)
            return placed(batch["ids"]), None

    return outputs
