"""Greedy decoding and beam search over any autoregressive decoder, given as a step function.

A decoder is a *step*: ``step(previous, state) → (log_probs, state)``, the log-probabilities (N, V) of
each row's next token given its previous token (N,) and the state the step left (the MT-LSTM's
LSTM states and attention memory, a language model's tokens and KV cache). The state's
``select(index)`` keeps rows ``index``, in that order and repeated as often as listed: beam search
makes ``beam`` rows per sentence, then follows its surviving hypotheses with it. The tensors of a search live
on the device of ``start`` (the model's); its bookkeeping is Python lists, copied off the device once a step.

Beam search (Sutskever et al. 2014, §3.2): keep the ``beam`` most likely partial hypotheses of each
sentence; a finished one is ranked by Σ log p / length^α, the length penalty of Wu et al. 2016 (§7)
without its smoothing, where length counts every scored token, the end token included (α = 1: the
mean log-probability per token; α = 0: the sum). Each step looks at the best 2 × ``beam`` candidates;
only those ranked among the best ``beam`` may finish, and the best ``beam`` of the others stay live.
This is transformers' beam search (5.x ``_update_finished_beams``: the score divides by the new tokens,
end token included). Its callers differ in when a sentence is done, which is a parameter here:

* ``early_stopping`` (Hugging Face's name): True stops a sentence as soon as ``beam`` hypotheses have
  finished; False only once no live hypothesis, ranked at the current length, could still beat the
  worst of the ``beam`` best finished ones (Hugging Face's default criterion).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Self, TypeVar

import torch

INF = float("inf")


class State(Protocol):
    """A decoder's state for N rows."""

    def select(self, index: torch.Tensor) -> Self:
        """The state of rows ``index`` (each kept, reordered or repeated as listed); may invalidate this one."""


StateT = TypeVar("StateT", bound=State)
Step = Callable[[torch.Tensor, StateT], tuple[torch.Tensor, StateT]]


@dataclass
class Hypothesis:
    tokens: list[int]  # the generated tokens, without the end token
    log_prob: float  # Σ log p of the scored tokens
    length: int  # tokens scored: the tokens, plus the end token when it ended the hypothesis
    finish: str = "end"  # end (the end token), stop (``stopped``), length (the length limit)
    length_penalty: float = 1.0  # α of the ranking

    @property
    def score(self) -> float:
        """Σ log p / length^α: beam search's ranking (α = 1: mean log-probability per scored token)."""
        return self.log_prob / max(1, self.length) ** self.length_penalty


@torch.no_grad()
def greedy(step: Step[StateT], state: StateT, start: torch.Tensor, *, eos: int, max_len: int) -> list[Hypothesis]:
    """The most likely next token of each row, from the tokens ``start`` (N,), until ``eos`` or ``max_len``."""
    previous = start
    hyps = [Hypothesis([], 0.0, 0, "length") for _ in range(len(start))]
    live = set(range(len(start)))
    for _ in range(max_len):
        log_probs, state = step(previous, state)
        best, previous = log_probs.max(-1)
        scores, tokens = best.tolist(), previous.tolist()  # one copy off the model's device per step
        for r in list(live):
            hyps[r].log_prob += scores[r]
            hyps[r].length += 1
            if tokens[r] == eos:
                hyps[r].finish = "end"
                live.discard(r)
            else:
                hyps[r].tokens.append(tokens[r])
        if not live:
            break
    return hyps


@torch.no_grad()
def beam_search(step: Step[StateT], state: StateT, start: torch.Tensor, *, beam: int, eos: int, max_len: int,
                length_penalty: float = 1.0, early_stopping: bool = True,
                stopped: Callable[[list[int]], bool] | None = None) -> list[Hypothesis]:
    """The best hypothesis of each sentence, from its first token ``start`` (sentences,) and ``state`` (one row
    per sentence), by :attr:`Hypothesis.score` with α = ``length_penalty``. A candidate finishes with the
    token ``eos``, or when ``stopped(tokens)`` says so (a stop string: the tokens are kept); at ``max_len``
    steps the live hypotheses compete too. See the module docstring for ``early_stopping``; ``beam`` = 1 is
    greedy decoding."""
    rows, k, device = len(start), beam, start.device  # the model's device, as start's
    state = state.select(torch.arange(rows, device=device).repeat_interleave(k))
    previous = start.repeat_interleave(k)
    totals = torch.full((rows, k), -INF, device=device)
    totals[:, 0] = 0.0  # one live hypothesis per sentence at the start
    history: list[list[int]] = [[] for _ in range(rows * k)]
    finished: list[list[Hypothesis]] = [[] for _ in range(rows)]
    done = [False] * rows
    for t in range(1, max_len + 1):
        log_probs, state = step(previous, state)
        vocab = log_probs.shape[-1]
        candidates = (totals.reshape(-1, 1) + log_probs.float()).reshape(rows, k * vocab)
        values, indices = (t.tolist() for t in candidates.topk(min(2 * k, k * vocab), dim=1))  # one copy off the device
        picked: list[tuple[int, int, float]] = []  # (row, token, total) of each new live hypothesis
        for r in range(rows):
            live: list[tuple[int, int, float]] = []
            for rank, (total, index) in enumerate(zip(values[r], indices[r])):
                if done[r] or total == -INF or len(live) == k:
                    break
                row, token = r * k + index // vocab, index % vocab
                ended = token == eos
                if ended or stopped is not None and stopped(history[row] + [token]):
                    if rank < k:  # a finished candidate outside the beam is dropped
                        tokens = history[row] + ([] if ended else [token])
                        finished[r].append(Hypothesis(tokens, total, t, "end" if ended else "stop", length_penalty))
                else:
                    live.append((row, token, total))
            if not done[r]:
                finished[r] = sorted(finished[r], key=lambda h: -h.score)[:k]
                best_live = max((total / t ** length_penalty for _, _, total in live), default=-INF)
                done[r] = not live or len(finished[r]) == k and (early_stopping or best_live <= finished[r][-1].score)
            live = [] if done[r] else live
            picked += live + [(r * k, eos, -INF)] * (k - len(live))  # done or short: dead rows
        if all(done):
            break
        index = torch.tensor([row for row, _, _ in picked], device=device)
        state = state.select(index)
        previous = torch.tensor([token for _, token, _ in picked], device=device)
        totals = torch.tensor([total for _, _, total in picked], device=device).reshape(rows, k)
        history = [history[row] + [token] for row, token, _ in picked]
    for r in range(rows):  # the length limit: live hypotheses compete too
        if not done[r]:
            finished[r] += [Hypothesis(history[r * k + j], float(totals[r, j]), max_len, "length", length_penalty)
                            for j in range(k) if totals[r, j] > -INF]
    return [max(f, key=lambda h: h.score) for f in finished]
