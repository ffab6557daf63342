"""ELMo's bidirectional language model objective (Peters et al. 2018, §3.1): jointly
maximise Σ_k [log p(t_k | t_1..t_{k−1}; Θ_x, Θ→_LSTM, Θ_s) + log p(t_k | t_{k+1}..t_N; Θ_x, Θ←_LSTM, Θ_s)].

A window holds ``seq_len + 2`` tokens of the packed stream; the model reads the middle ``seq_len``;
at each of them the forward LM predicts the next token and the backward LM the previous one, so every
input position has both targets. Both directions share the token representation Θ_x (the
backbone's character CNN) and one softmax Θ_s: an output matrix (vocabulary × projection) and a bias,
separate from the character CNN. The two losses are reported as the parts ``forward`` and
``backward``; the trainer minimises the sum of their means and validation reports both (perplexity
is the forward LM's; the backward LM's is exp(``backward_loss``)).

The paper trained on the 1B Word Benchmark's 793k-word vocabulary with a sampled softmax (Jean et
al. 2015), as does its released code. ``samples`` = S > 0 does so while training: each step draws S
negative word ids (with replacement, shared by all positions and both directions) from the
log-uniform (Zipfian) distribution Q(k) = log((k + 2)/(k + 1)) / log(V + 1), which suits the word
tokenizer's ids, sorted by frequency; every logit is corrected by −log(S·Q(k)), and a sample that
is the position's own target is left out. Evaluation (and ``samples`` = 0, or S ≥ V, where
sampling saves nothing) uses the full softmax, so validation perplexities are exact; the training
loss logged with sampling is the sampled one, lower than the full loss. The draws use torch's
default generator, which the trainer seeds per step like dropout, so a resumed run draws alike.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import SesameError
from ..models.elmo import Elmo
from ..tokenizer import SpecialIds, TextTokenizer
from .base import Objective
from .projection import Workspace, linear_cross_entropy


class BiLM(Objective):
    name = "bilm"
    options = ("samples",)
    part_names = ("forward", "backward")

    def __init__(self, backbone: Elmo, specials: SpecialIds, samples: int = 0) -> None:
        super().__init__(backbone, specials)
        if not isinstance(backbone, Elmo):
            raise ValueError(f"the bilm objective needs an ELMo backbone (arch 'elmo'), not {type(backbone).__name__}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise SesameError(f"--objective-option samples={samples}: give a number of sampled words, or 0 for "
                              "the full softmax")
        cfg = backbone.config
        self.samples = samples if samples < cfg.vocab_size else 0
        self.softmax = nn.Linear(cfg.projection, cfg.vocab_size)
        nn.init.normal_(self.softmax.weight, std=cfg.projection ** -0.5)
        nn.init.zeros_(self.softmax.bias)
        self.workspace = Workspace()

    @classmethod
    def build(cls, backbone: Elmo, tokenizer: TextTokenizer, **options) -> "BiLM":
        """The objective, with the backbone's character table filled from ``tokenizer``'s vocabulary."""
        if isinstance(backbone, Elmo):
            words = [tokenizer.backend.id_to_token(i) for i in range(tokenizer.vocab_size)]
            backbone.set_vocabulary(words, tokenizer.specials.all)
        return cls(backbone, tokenizer.specials, **options)

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        return seq_len + 2  # one token of context on each side of the inputs, as the two directions' targets

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        n = windows[:, 1:-1].numel()
        return {"ids": windows[:, 1:-1], "targets": windows[:, 2:], "previous": windows[:, :-2],
                "counts": {"forward": n, "backward": n}}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        states = dict(zip(self.part_names, self.backbone.directions(batch["ids"], batch.get("padding"))))
        targets = {"forward": batch["targets"], "backward": batch["previous"]}
        weight, bias = self.softmax.weight, self.softmax.bias
        if self.training and self.samples:
            negatives = log_uniform_sample(self.samples, weight.shape[0], weight.device)
            return {name: sampled_cross_entropy(states[name].flatten(0, 1), weight, bias, targets[name].flatten(),
                                                negatives, self.samples) for name in self.part_names}
        return {name: linear_cross_entropy(states[name].flatten(0, 1), weight, targets[name].flatten(), bias,
                                           workspace=self.workspace) for name in self.part_names}


def log_q(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """log Q(k) of the log-uniform distribution over ids 0..V−1: Q(k) = log((k + 2)/(k + 1)) / log(V + 1)."""
    k = ids.double()
    return (torch.log1p(1 / (k + 1)) / math.log(vocab_size + 1)).log().float()


def log_uniform_sample(n: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """``n`` ids drawn from Q with replacement: ⌊exp(u·log(V + 1))⌋ − 1 for u ~ U[0, 1)."""
    u = torch.rand(n, dtype=torch.float64, device=device)
    return ((u * math.log(vocab_size + 1)).exp().floor().long() - 1).clamp_(0, vocab_size - 1)


def sampled_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor,
                          negatives: torch.Tensor, samples: int) -> torch.Tensor:
    """The sampled softmax loss (Jean et al. 2015), summed: at each position a softmax over its target
    and the ``negatives``, every logit less log(S·Q(k)), the samples equal to the target left out."""
    vocab_size = weight.shape[0]
    correction = math.log(samples)
    true = (hidden * weight[targets]).sum(-1) + bias[targets] - log_q(targets, vocab_size) - correction
    sampled = hidden @ weight[negatives].t() + (bias[negatives] - log_q(negatives, vocab_size) - correction)
    sampled = sampled.masked_fill(negatives[None, :] == targets[:, None], float("-inf"))
    return (torch.logaddexp(true, sampled.logsumexp(-1)) - true).sum()
