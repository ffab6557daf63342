"""GPT's auxiliary language-model loss while fine-tuning (Radford et al. 2018, §3.2, eq. 5):
L₃(C) = L₂(C) + λ·L₁(C), the task loss plus λ times the next-token loss on the task's own inputs.

It is a recipe, not a task: any task model over a causal backbone whose LM head is its tied token
embedding can carry it, and the task computes only its own loss. The LM term reads the hidden states of
the same forward pass through hooks on the model, so no task changes its ``forward``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import SesameError
from ..models.padding import real_tokens
from ..objectives.projection import linear_cross_entropy


def add_auxiliary_lm(model: nn.Module, weight: float) -> None:
    """Add GPT's auxiliary objective (Radford et al. 2018, §3.2, eq. 5) to a task model: L = L_task + λ·L_LM,
    with L_LM the next-token loss on the task's own inputs through the backbone's tied embeddings (its
    LM head), computed from the same forward pass as the task loss. The model's training forward then
    returns ``{"loss": task, "lm": lm}``; each batch must count the LM's terms in ``counts["lm"]``
    (the :func:`next_tokens` positions). The LM reads the first backbone call of a forward and the batch's ``ids``
    and ``padding``, which every task model passes to it first."""
    check_auxiliary_lm(model.backbone.config)
    first: list[torch.Tensor] = []

    def keep_hidden(backbone: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if backbone.training and not first:
            first.append(output)

    def forget(module: nn.Module, args: tuple) -> None:
        first.clear()

    def add_lm(module: nn.Module, args: tuple, task_loss: torch.Tensor) -> torch.Tensor | dict:
        if not module.training:
            return task_loss
        batch, hidden = args[0], first.pop()
        real = next_tokens(real_tokens(batch["ids"], batch["padding"]))
        lm = linear_cross_entropy(hidden[:, :-1][real], model.backbone.embed.tokens.weight, batch["ids"][:, 1:][real])
        return {"loss": task_loss, "lm": lm}

    model.backbone.register_forward_hook(keep_hidden)
    model.register_forward_pre_hook(forget)
    model.register_forward_hook(add_lm)
    model.part_names, model.part_weights = ("loss", "lm"), {"lm": weight}


def check_auxiliary_lm(config: object) -> None:
    """Fail unless a backbone (its config object) can carry GPT's auxiliary LM: causal, its output as wide as
    its embedding, which is the LM head."""
    if not config.causal:
        raise SesameError("--lm-weight: the auxiliary LM needs a causal backbone whose LM head is its tied "
                          "embedding (gpt, gpt2, ulmfit)")
    if config.embedding_width != config.hidden:
        raise SesameError("--lm-weight: the backbone's embedding width differs from its hidden size (an untied "
                          "model has no LM head)")


def next_tokens(padding: torch.Tensor) -> torch.Tensor:
    """Where a padded batch predicts a next token: positions t < W − 1 whose token and successor are real."""
    return padding[:, 1:] & padding[:, :-1]
