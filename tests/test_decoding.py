"""Greedy decoding and beam search over a step function (sesame.decoding)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from sesame.decoding import GenerationConfig, Hypothesis, beam_search, greedy


@dataclass
class Last:
    """A toy decoder's state: the previous token per row."""

    token: torch.Tensor

    def select(self, index: torch.Tensor) -> "Last":
        return Last(self.token[index])


# tokens: 0 <s>, 1 </s>, 2 A, 3 B. Greedy takes A (0.6), after which nothing is likely; B (0.4) is then
# surely followed by </s>, so "B" has the better mean log-probability: (ln .4)/2 > (ln .6 + ln .34)/2.
TABLE = torch.tensor([[0.0, 0.0, 0.6, 0.4], [0.0, 1.0, 0.0, 0.0], [0.0, 0.34, 0.33, 0.33], [0.0, 1.0, 0.0, 0.0]])


def toy_step(previous: torch.Tensor, state: Last) -> tuple[torch.Tensor, Last]:
    return TABLE[previous].clamp_min(1e-9).log(), Last(previous)


def test_beam_finds_a_likelier_translation_than_greedy():
    start = Last(torch.zeros(1, dtype=torch.long))
    g = greedy(toy_step, start, torch.zeros(1, dtype=torch.long), eos=1, max_len=5)[0]
    b = beam_search(toy_step, start, torch.zeros(1, dtype=torch.long), GenerationConfig(max_new_tokens=5, beams=2),
                    eos=1)[0]
    assert g.tokens == [2] and b.tokens == [3]
    assert math.isclose(b.score, math.log(0.4) / 2, rel_tol=1e-5)
    assert b.score > g.score == pytest.approx((math.log(0.6) + math.log(0.34)) / 2)
    assert Hypothesis([2], -1.0, 2).score == -0.5


# tokens as above, 4 C. After <s>: A .5, B .4; after A or B: </s> .55, C .45; after C: </s>. At step 2 the
# candidates rank A</s>, AC, B</s>, BC: B</s> finishes at rank 2, outside a beam of 2.
RANKS = torch.tensor([[0.0, 0.0, 0.5, 0.4, 0.1], [0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.55, 0.0, 0.0, 0.45],
                      [0.0, 0.55, 0.0, 0.0, 0.45], [0.0, 1.0, 0.0, 0.0, 0.0]])


def ranks_step(previous: torch.Tensor, state: Last) -> tuple[torch.Tensor, Last]:
    return RANKS[previous].clamp_min(1e-9).log(), Last(previous)


@pytest.mark.parametrize("early_stopping", [True, False])
def test_a_finished_candidate_outside_the_beam_is_dropped(early_stopping):
    """B</s> is not admitted, so the search goes on to find AC</s> (with B</s>, two finished would stop it
    at A</s>); transformers' rule."""
    start = torch.zeros(1, dtype=torch.long)
    cfg = GenerationConfig(max_new_tokens=5, beams=2, early_stopping=early_stopping)
    best = beam_search(ranks_step, Last(start), start, cfg, eos=1)[0]
    assert best.tokens == [2, 4] and best.finish == "end"


# tokens as above. After <s>: </s> .3, A .7; after A: </s> .6, C .4; after C: </s>. Step 1 finishes "" (mean
# ln .3 = -1.20), step 2 finishes "A" (-0.434), so two beams' worth have finished; the live AC, at -0.637 per
# token, could still beat "", and ends at step 3 as "AC" with -0.424.
EARLY = torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.6, 0.0, 0.0, 0.4],
                      [0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])


def early_step(previous: torch.Tensor, state: Last) -> tuple[torch.Tensor, Last]:
    return EARLY[previous].clamp_min(1e-9).log(), Last(previous)


@pytest.mark.parametrize("early_stopping, tokens", [(True, [2]), (False, [2, 4])])
def test_early_stopping_ends_a_sentence_at_beams_finished_hypotheses(early_stopping, tokens):
    """GenerationConfig.early_stopping: True stops once ``beams`` hypotheses have finished; False (transformers'
    default) goes on while a live hypothesis could still beat the worst finished one."""
    start = torch.zeros(1, dtype=torch.long)
    cfg = GenerationConfig(max_new_tokens=5, beams=2, early_stopping=early_stopping)
    best = beam_search(early_step, Last(start), start, cfg, eos=1)[0]
    assert best.tokens == tokens and best.finish == "end"
    assert best.score == pytest.approx((math.log(0.7) + math.log(0.6 if early_stopping else 0.4)) / (len(tokens) + 1))
