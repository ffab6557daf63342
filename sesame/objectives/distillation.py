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
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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
