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
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


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
        (``batch["padding"]``), which the caller counts, so that the trainer's mean is TinyBERT's MSE per pair."""
        teacher, real = self.teacher(batch), batch["padding"]
        total = torch.zeros((), device=real.device)
        for (s, t), projection in zip(self.pairs, self.maps):
            error = (projection(student[s]).float() - teacher[t].float()).pow(2).mean(-1)
            total = total + error[real].sum()
        return total
