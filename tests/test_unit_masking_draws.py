"""Units of words (whole words, n-grams, phrases) chosen and corrupted for a whole batch at once draw exactly what
each row drew alone before (issue 35), so a run made before resumes bit-identically: pinned against a reference copy
of the old per-row algorithm. (SpanBERT's spans draw otherwise since: tests/test_span_masking.py.)"""
import pytest
import torch

from sesame.models import Transformer, TransformerConfig
from sesame.objectives.masking import budget, phrase_units, word_index
from sesame.objectives.mlm import MaskedLM
from sesame.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1000
STARTS = torch.arange(VOCAB) < 600


# ---- the old per-row algorithm (sesame before issue 35), the reference --------------------------------------

def old_after_special(word):
    begins = (word >= 0) & torch.cat([word.new_ones(1, dtype=torch.bool), word[:-1] < 0])
    fresh = torch.zeros(int(word.max()) + 1, dtype=torch.bool)
    fresh[word[begins]] = True
    return fresh


def old_ngram_units(word, ngram, g):
    begins = old_after_special(word)
    weights = 1.0 / torch.arange(1, ngram + 1, dtype=torch.float)
    ends = (torch.multinomial(weights, max(len(begins), 1), replacement=True, generator=g) + 1).cumsum(0)
    begins[ends[ends < len(begins)]] = True
    return begins.long().cumsum(0) - 1


def old_select_words(word, unit_of_word, rate, g):
    eligible = word >= 0
    if not eligible.any():
        return torch.full_like(word, -1), 0
    n_units = int(unit_of_word[-1]) + 1
    unit = unit_of_word[word.clamp(min=0)]
    sizes = torch.bincount(unit[eligible], minlength=n_units).tolist()
    chosen, covered, target = torch.zeros(n_units, dtype=torch.bool), 0, budget(int(eligible.sum()), rate)
    for u in torch.randperm(n_units, generator=g).tolist():
        if covered >= target:
            break
        if covered + sizes[u] <= target:
            chosen[u], covered = True, covered + sizes[u]
    return torch.where(eligible & chosen[unit], unit, -1), n_units


def old_mask_units(ids, unit, n_units, pool, g):
    selected = unit >= 0
    action = torch.ones(ids.shape)
    action[selected] = torch.rand(n_units, generator=g)[unit[selected]]
    corrupted = ids.clone()
    corrupted[selected & (action < 0.8)] = SPECIALS.mask
    randomize = selected & (action >= 0.8) & (action < 0.9)
    corrupted[randomize] = pool[torch.randint(len(pool), (int(randomize.sum()),), generator=g)]
    return corrupted


def old_corrupt(model, ids, g):
    word = word_index(ids, model.special_ids, model.word_starts)
    if model.masking == "whole_word":
        unit_of_word = torch.arange(int(word.max()) + 1)
    elif model.phrases:
        unit_of_word = phrase_units(ids, word, model.phrases)
    else:
        unit_of_word = old_ngram_units(word, model.ngram, g)
    unit, n_units = old_select_words(word, unit_of_word, model.rate, g)
    return old_mask_units(ids, unit, n_units, model.pool, g), unit >= 0


# ---- the batch against it --------------------------------------------------------------------------------------

def backbone():
    return Transformer(TransformerConfig(vocab_size=VOCAB, hidden=32, layers=1, heads=2, intermediate=64, dropout=0.0))


def generators(n):
    return [torch.Generator().manual_seed(1000 + i) for i in range(n)]


MODELS = {
    "whole_word": lambda: MaskedLM(backbone(), SPECIALS, masking="whole_word", word_starts=STARTS),
    "ngram": lambda: MaskedLM(backbone(), SPECIALS, masking="phrase", word_starts=STARTS, ngram=3),
    "phrase": lambda: MaskedLM(backbone(), SPECIALS, masking="phrase", word_starts=STARTS,
                               phrase_ids=[[10, 11, 620], [20, 700]]),
}


@pytest.mark.parametrize("name", MODELS)
def test_a_batch_draws_what_each_row_drew_alone_before(name):
    model = MODELS[name]()
    rows = torch.randint(5, VOCAB, (40, 90), generator=torch.Generator().manual_seed(0))
    rows[:, 30] = SPECIALS.sep  # a document boundary inside the window
    rows[::3, 10:13] = torch.tensor([10, 11, 620])  # a phrase
    rows[1::7, 40:] = SPECIALS.sep  # rows with few words, and one with none
    rows[5] = SPECIALS.sep
    batch = model.make_batch(rows, generators(len(rows)))
    ids = torch.cat([torch.full((len(rows), 1), SPECIALS.cls), rows, torch.full((len(rows), 1), SPECIALS.sep)], 1)
    old = [old_corrupt(model, row, g) for row, g in zip(ids, generators(len(rows)))]
    selected = torch.stack([s for _, s in old])
    assert torch.equal(batch["ids"], torch.stack([c for c, _ in old]))
    assert batch["positions"][:batch["masked"]].tolist() == selected.flatten().nonzero().squeeze(1).tolist()
    assert selected[:5].sum() > 20 and not selected[5].any()
