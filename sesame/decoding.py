"""Decoding over any autoregressive decoder, given as a step function: greedy decoding, sampling and beam search,
with the settings (:class:`GenerationConfig`) and the logits' transformations they share.

A decoder is a *step*: ``step(previous, state) → (log_probs, state)``, the log-probabilities (N, V) of
each row's next token given its previous token (N,) and the state the step left (the MT-LSTM's
LSTM states and attention memory, a language model's tokens and KV cache, an encoder-decoder's
:class:`~sesame.seq2seq.Seq2SeqState`). The state's
``select(index)`` keeps rows ``index``, in that order and repeated as often as listed: beam search
makes ``beam`` rows per sentence, then follows its surviving hypotheses with it. The tensors of a search live
on the device of ``start`` (the model's); its bookkeeping is Python lists, copied off the device once a step.

Sampling (:func:`next_tokens`) is inverse-CDF sampling after a temperature, top-k (Fan et al. 2018) and nucleus /
top-p (Holtzman et al. 2020) filtering: a row's next token is the first whose cumulative probability exceeds one
uniform number, drawn on a CPU generator seeded by (seed, the row's prompt or input index, the step)
(:func:`uniform_draws`), so the draws are the same on every device and whatever the batch.

Beam search (Sutskever et al. 2014, §3.2): keep the ``beams`` most likely partial hypotheses of each
sentence; a finished one is ranked by Σ log p / length^α (α: ``length_penalty``), the length penalty of Wu et
al. 2016 (§7) without its smoothing, where length counts every scored token, the end token included (α = 1: the
mean log-probability per token; α = 0: the sum). Each step looks at the best 2 × ``beams`` candidates;
only those ranked among the best ``beams`` may finish, and the best ``beams`` of the others stay live.
This is transformers' beam search (5.x ``_update_finished_beams``: the score divides by the new tokens,
end token included). Its callers differ in when a sentence is done, a setting of :class:`GenerationConfig`:

* ``early_stopping`` (Hugging Face's name): True stops a sentence as soon as ``beams`` hypotheses have
  finished (CoVe's translation); False, the default, only once no live hypothesis, ranked at the current
  length, could still beat the worst of the ``beams`` best finished ones (Hugging Face's default criterion).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Self, Sequence, TypeVar

import torch

from .errors import SesameError
from .seeding import example_seed

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
def greedy(step: Step[StateT], state: StateT, start: torch.Tensor, *, eos: int | None, max_len: int,
           choose: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
           stopped: Callable[[list[int]], bool] | None = None) -> list[Hypothesis]:
    """One token per row and step, from the tokens ``start`` (N,), until ``eos``, ``stopped(tokens)`` (a stop
    string: the tokens are kept) or ``max_len`` tokens. The token is the most likely one, or ``choose(log_probs,
    t)``'s at step ``t`` (sampling: :func:`next_tokens`); a hypothesis's ``log_prob`` sums the step's log-probabilities
    of its tokens. Finished rows go on being fed (their tokens ignored), so the state keeps its rows."""
    previous = start
    hyps = [Hypothesis([], 0.0, 0, "length") for _ in range(len(start))]
    live = set(range(len(start)))
    for t in range(max_len):
        log_probs, state = step(previous, state)
        previous = log_probs.argmax(-1) if choose is None else choose(log_probs, t)
        scores = log_probs.gather(1, previous[:, None])[:, 0].tolist()  # one copy off the model's device per step
        tokens = previous.tolist()
        for r in list(live):
            hyps[r].log_prob += scores[r]
            hyps[r].length += 1
            if tokens[r] == eos:
                hyps[r].finish = "end"
                live.discard(r)
                continue
            hyps[r].tokens.append(tokens[r])
            if stopped is not None and stopped(hyps[r].tokens):
                hyps[r].finish = "stop"
                live.discard(r)
        if not live:
            break
    return hyps


@torch.no_grad()
def beam_search(step: Step[StateT], state: StateT, start: torch.Tensor, config: GenerationConfig, *,
                eos: int | None, stopped: Callable[[list[int]], bool] | None = None) -> list[Hypothesis]:
    """The best hypothesis of each sentence, from its first token ``start`` (sentences,) and ``state`` (one row
    per sentence), with ``config.beams`` beams, by :attr:`Hypothesis.score` with α = ``config.length_penalty``. A
    candidate finishes with the token ``eos``, or when ``stopped(tokens)`` says so (a stop string: the tokens are
    kept); at ``config.max_new_tokens`` steps the live hypotheses compete too. See the module docstring for
    ``config.early_stopping``; one beam is greedy decoding. The config's sampling settings are not read here (the
    repetition penalty is the step's)."""
    rows, k, device = len(start), config.beams, start.device  # the model's device, as start's
    max_len, length_penalty, early_stopping = config.max_new_tokens, config.length_penalty, config.early_stopping
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


# -- the settings, and what sampling does to the logits ------------------------------------------------

@dataclass
class GenerationConfig:
    """How to decode; the defaults are greedy decoding of up to 50 new tokens with the KV cache."""

    max_new_tokens: int = 50
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off
    beams: int = 1
    length_penalty: float = 1.0  # α in Σ log p / length^α (beam search)
    early_stopping: bool = False  # beam search: done at ``beams`` finished hypotheses (module docstring)
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int = 0
    cache: bool = True

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise SesameError(f"--max-new-tokens {self.max_new_tokens}: must be at least 1")
        if self.temperature <= 0:
            raise SesameError(f"--temperature {self.temperature}: must be positive (greedy decoding is the default "
                              "without --sample)")
        if self.top_k < 0:
            raise SesameError(f"--top-k {self.top_k}: must be 0 (off) or positive")
        if not 0 < self.top_p <= 1:
            raise SesameError(f"--top-p {self.top_p}: must be in (0, 1]")
        if self.repetition_penalty < 1:
            raise SesameError(f"--repetition-penalty {self.repetition_penalty}: must be at least 1 (1 = off)")
        if self.beams < 1:
            raise SesameError(f"--beams {self.beams}: must be at least 1")
        if self.beams > 1 and self.sample:
            raise SesameError("--beams with --sample: beam search is deterministic; choose one")
        if any(not s for s in self.stop):
            raise SesameError("--stop: a stop string must not be empty")

    def check_room(self, positions: int, *, prompt: int = 0, which: str = "the prompt") -> None:
        """The one bound on a generation's length: the decoder's ``prompt`` tokens (a causal LM's prompt, named
        ``which``; an encoder-decoder's decoder reads none before its own) and ``max_new_tokens`` within the model's
        ``positions`` (its ``max_positions``). Learned positions end there; T5, whose relative positions do not, is
        held to it as well, so that no request decodes (and grows its caches) without end."""
        if prompt + self.max_new_tokens <= positions:
            return
        if prompt:
            raise SesameError(f"{which} has {prompt} tokens; with --max-new-tokens {self.max_new_tokens} it exceeds "
                              f"the model's {positions} positions: shorten it or lower --max-new-tokens")
        raise SesameError(f"--max-new-tokens {self.max_new_tokens} exceeds the model's {positions} positions: lower it")


def penalise_repetition(logits: torch.Tensor, context: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty on the tokens of ``context`` (batch, time) ids."""
    if penalty == 1.0:
        return logits
    seen = logits.gather(1, context)
    return logits.scatter(1, context, torch.where(seen > 0, seen / penalty, seen * penalty))


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (ties at the k-th all kept), the rest −inf; k = 0 keeps all."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability sums to at least
    ``p`` (always the most likely one), the rest −inf."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)  # mass of the more likely tokens
    drop = (before >= p).scatter(-1, order, before >= p)
    return logits.masked_fill(drop, float("-inf"))


def stop_strings(stop: Sequence[str], text: Callable[[list[int]], str]) -> Callable[[list[int]], bool] | None:
    """The ``stopped(tokens)`` of :func:`greedy` and :func:`beam_search` for stop strings: whether ``text(tokens)``
    (the tokenizer's decoding) holds one of ``stop``; None without stop strings."""
    if not stop:
        return None
    return lambda tokens: any(s in text(tokens) for s in stop)


def uniform_draws(seed: int, prompts: Sequence[int], step: int) -> torch.Tensor:
    """One uniform number in [0, 1) for each of ``prompts`` (their indices among all prompts) at decoding step
    ``step``, each from a CPU generator seeded by (seed, prompt, step) alone."""
    return torch.tensor([float(torch.rand((), generator=torch.Generator().manual_seed(
        example_seed(example_seed(seed, prompt), step)), device="cpu")) for prompt in prompts], device="cpu")


def next_tokens(logits: torch.Tensor, cfg: GenerationConfig, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row: the argmax, or a sample after temperature, top-k and top-p: the first token whose
    cumulative probability exceeds the row's number of ``uniforms`` (:func:`uniform_draws`, moved to the logits'
    device), never one of probability 0."""
    if not cfg.sample:
        return logits.argmax(-1)
    probs = top_p_filter(top_k_filter(logits / cfg.temperature, cfg.top_k), cfg.top_p).softmax(-1)
    cdf = probs.cumsum(-1)
    drawn = uniforms.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    last = (probs > 0).long().cumsum(-1).argmax(-1, keepdim=True)  # rounding can never reach past it
    return torch.searchsorted(cdf, drawn, right=True).minimum(last)[:, 0]
