"""Batches built on the whole batch at once (issue 35) are those of the per-row algorithm they replaced, draw for
draw: each row still draws from its own generator, in the same order, so every mask, replacement, pair and cut is
unchanged and a run begun before the change resumes bit-identically. The per-row algorithm is kept here, as it was
in sesame/objectives/masking.py and pairs.py, as the reference."""
import pytest
import torch

from sesame.models import Transformer, TransformerConfig
from sesame.objectives.electra import Electra
from sesame.objectives.masking import replacement_pool, smoothed_weights
from sesame.objectives.mlm import MaskedLM, masked_entries
from sesame.objectives.pairs import AlbertPretraining, BertPretraining
from sesame.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
SPECIAL_IDS = torch.tensor(SPECIALS.all)
VOCAB, WIDTH, ROWS = 300, 29, 300
ENDS = torch.arange(12, VOCAB, 7)  # every seventh id ends a sentence
POOL = replacement_pool(VOCAB, SPECIAL_IDS)


# -- the per-row reference -------------------------------------------------------------------------------------------

def reference_replace(ids, selected, action, g, mask_frac=0.8, random_frac=0.1):
    corrupted = ids.clone()
    corrupted[selected & (action < mask_frac)] = SPECIALS.mask
    randomize = selected & (action >= mask_frac) & (action < mask_frac + random_frac)
    corrupted[randomize] = POOL[torch.randint(len(POOL), (int(randomize.sum()),), generator=g)]
    return corrupted


def reference_mask(ids, g, mask_frac=0.8, random_frac=0.1):
    selected = (torch.rand(ids.shape, generator=g) < 0.15) & ~torch.isin(ids, SPECIAL_IDS)
    action = torch.rand(ids.shape, generator=g)
    return reference_replace(ids, selected, action, g, mask_frac, random_frac), selected


def reference_weighted(ids, weights, g):
    weight = weights[ids]
    selected = torch.zeros(ids.shape, dtype=torch.bool)
    n = int((weight > 0).sum())
    if n:
        selected[torch.multinomial(weight, max(1, round(0.15 * n)), replacement=False, generator=g)] = True
    return reference_replace(ids, selected, torch.rand(ids.shape, generator=g), g), selected


def parts(row):
    edges = torch.nn.functional.pad((row != SPECIALS.sep).int(), (1, 1)).diff()
    return torch.stack([(edges == 1).nonzero()[:, 0], (edges == -1).nonzero()[:, 0]], 1)


def reference_split(window, g):
    found = parts(window)
    lengths = found[:, 1] - found[:, 0]
    roomy = lengths >= 8
    weights = lengths * roomy if roomy.any() else (lengths == lengths.max())
    lo, hi = found[int(torch.multinomial(weights.float(), 1, generator=g))].tolist()
    margin = min(4, (hi - lo) // 2)
    first, last = lo + margin, hi - margin
    cut = int(torch.randint(first, last + 1, (), generator=g))
    ends = torch.isin(window, ENDS).nonzero()[:, 0] + 1
    ends = ends[(ends >= first) & (ends <= last)]
    if len(ends):
        cut = int(ends[(ends - cut).abs().argmin()])
    return lo, cut, hi


def reference_random_next(partner, n):
    lo, hi = parts(partner)[0].tolist()
    starts = torch.isin(partner[lo:hi], ENDS).nonzero()[:, 0] + lo + 1
    starts = starts[starts + n <= hi]
    start = int(starts[0]) if len(starts) else lo
    return partner[start: min(start + n, hi)]


def reference_pair(kind, window, partner, g):
    flip = bool(torch.rand((), generator=g) < 0.5)
    lo, cut, hi = reference_split(window, g)
    a, b = window[lo:cut], window[cut:hi]
    if kind is BertPretraining:
        return (a, reference_random_next(partner, hi - cut), 1) if flip else (a, b, 0)
    return (b, a, 1) if flip else (a, b, 0)


def reference_pairs_batch(kind, windows, partners, gs):
    rows, types, padding, labels = [], [], [], []
    for window, partner, g in zip(windows, partners, gs):
        a, b, label = reference_pair(kind, window, partner, g)
        row = torch.cat([torch.tensor([SPECIALS.cls]), a, torch.tensor([SPECIALS.sep]), b,
                         torch.tensor([SPECIALS.sep])])
        rows.append(torch.cat([row, torch.full((WIDTH + 3 - len(row),), SPECIALS.pad)]))
        types.append((torch.arange(WIDTH + 3) >= len(a) + 2) & (torch.arange(WIDTH + 3) < len(row)))
        padding.append(torch.arange(WIDTH + 3) < len(row))
        labels.append(label)
    masked = [reference_mask(row, g) for row, g in zip(rows, gs)]
    return {"ids": torch.stack([m[0] for m in masked]), "selected": torch.stack([m[1] for m in masked]),
            "types": torch.stack(types).long(), "padding": torch.stack(padding), "labels": torch.tensor(labels)}


# -- the batches compared --------------------------------------------------------------------------------------------

def backbone():
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=VOCAB, hidden=16, layers=1, heads=2, intermediate=32,
                                         dropout=0.0))


def generators(salt=0):
    return [torch.Generator().manual_seed(1000 * salt + i) for i in range(ROWS)]


def windows(seed, first=5):
    """Rows of ordinary ids with separators anywhere: none, one, several, adjacent, first, last; parts long and short
    (fewer than the 8 tokens a roomy one holds); about one id in seven ends a sentence."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(first, VOCAB, (ROWS, WIDTH), generator=g)
    separators = torch.rand(ROWS, WIDTH, generator=g) < torch.rand(ROWS, 1, generator=g) * 0.4
    rows[separators & (torch.arange(ROWS) % 5 != 0)[:, None]] = SPECIALS.sep  # a fifth of the rows hold none
    every = (rows == SPECIALS.sep).all(1)
    rows[every, WIDTH // 2] = first  # each row keeps an ordinary token, as a window of a corpus does
    return rows


def same_states(a, b):
    return all(torch.equal(x.get_state(), y.get_state()) for x, y in zip(a, b))


def selected_of(batch):
    selected = torch.zeros(batch["ids"].numel(), dtype=torch.bool)
    selected[masked_entries(batch, "positions")] = True
    return selected.view(batch["ids"].shape)


def test_token_masking_is_the_per_row_algorithm():
    obj = MaskedLM(backbone(), SPECIALS)
    new, old = generators(), generators()
    batch = obj.make_batch(windows(0), new)
    ids = torch.cat([torch.full((ROWS, 1), SPECIALS.cls), windows(0), torch.full((ROWS, 1), SPECIALS.sep)], 1)
    want = [reference_mask(row, g) for row, g in zip(ids, old)]
    assert torch.equal(batch["ids"], torch.stack([w[0] for w in want]))
    assert torch.equal(selected_of(batch), torch.stack([w[1] for w in want]))
    assert same_states(new, old)  # and every later draw of a row is unchanged too


def test_distilbert_weighted_masking_is_the_per_row_algorithm():
    obj = MaskedLM(backbone(), SPECIALS)
    counts = torch.randint(0, 5000, (VOCAB,), generator=torch.Generator().manual_seed(3))
    obj.token_weights = smoothed_weights(counts, 0.7, SPECIAL_IDS)
    new, old = generators(1), generators(1)
    batch = obj.make_batch(windows(1), new)
    ids = torch.cat([torch.full((ROWS, 1), SPECIALS.cls), windows(1), torch.full((ROWS, 1), SPECIALS.sep)], 1)
    want = [reference_weighted(row, obj.token_weights, g) for row, g in zip(ids, old)]
    assert torch.equal(batch["ids"], torch.stack([w[0] for w in want]))
    assert torch.equal(selected_of(batch), torch.stack([w[1] for w in want]))
    assert same_states(new, old)


def reference_electra_samples(obj, predicted, batch, seeds):
    """G's samples as the per-row sampler drew them: a generator per example, seeded by its row's draw, and
    ``torch.multinomial`` on that example's masked positions alone."""
    weight = obj.backbone.embed.tokens.weight
    rows = masked_entries(batch, "positions") // batch["ids"].shape[1]
    per_example = torch.bincount(rows, minlength=len(seeds))
    return torch.cat([
        torch.multinomial(torch.softmax(torch.addmm(obj.generator_bias, h, weight.t()), 1), 1,
                          generator=torch.Generator(h.device).manual_seed(int(seed))).squeeze(1)
        for h, seed in zip(predicted.split(per_example.tolist()), seeds)])


def test_electra_masking_is_the_per_row_algorithm():
    obj = Electra(backbone(), SPECIALS, generator_fraction=0.5)
    new, old = generators(2), generators(2)
    batch = obj.make_batch(windows(2), new)
    ids = torch.cat([torch.full((ROWS, 1), SPECIALS.cls), windows(2), torch.full((ROWS, 1), SPECIALS.sep)], 1)
    want = [reference_mask(row, g, mask_frac=1.0, random_frac=0.0) for row, g in zip(ids, old)]
    assert torch.equal(batch["ids"], torch.stack([w[0] for w in want]))
    assert torch.equal(selected_of(batch), torch.stack([w[1] for w in want]))
    # the samples' uniforms are the rows' next draws, where the per-row code drew its seeds
    assert torch.equal(batch["draws"], torch.stack([torch.rand(WIDTH + 2, generator=g) for g in old]))


def test_electra_samples_follow_the_softmax_as_the_per_row_sampler_did():
    """The batched sampler draws other tokens than the per-row one (no batched operation reproduces a generator per
    example; docs/run_formats.md), from the same distribution: every masked position here has the same softmax,
    spread over ten tokens, and each sampler's frequencies are within sampling noise of it."""
    obj = Electra(backbone(), SPECIALS, generator_fraction=0.5)
    with torch.no_grad():
        obj.generator_bias.copy_(torch.full((VOCAB,), -1e4))
        obj.generator_bias[10:20] = torch.linspace(0.0, 2.0, 10)
    new, old = generators(6), generators(6)
    batch = obj.make_batch(windows(6), new)
    ids = torch.cat([torch.full((ROWS, 1), SPECIALS.cls), windows(6), torch.full((ROWS, 1), SPECIALS.sep)], 1)
    for row, g in zip(ids, old):  # the masks' draws, then the per-row code's seed
        reference_mask(row, g, mask_frac=1.0, random_frac=0.0)
    seeds = torch.stack([torch.randint(2 ** 31, (), generator=g) for g in old])
    predicted = torch.zeros(batch["masked"], obj.backbone.config.embedding_width)
    p = torch.softmax(obj.generator_bias, 0)
    n = batch["masked"]
    for samples in (obj.sample(predicted, batch), reference_electra_samples(obj, predicted, batch, seeds)):
        frequencies = torch.bincount(samples, minlength=VOCAB).double() / n
        chi_square = (n * (frequencies - p) ** 2 / p)[10:20].sum().item()
        assert ((samples >= 10) & (samples < 20)).all() and chi_square < 27.9  # 9 degrees of freedom, p = 0.001


@pytest.mark.parametrize("kind", [BertPretraining, AlbertPretraining])
def test_sentence_pairs_are_the_per_row_algorithm(kind):
    obj = kind(backbone(), SPECIALS)
    obj.sentence_ends = ENDS
    clean, partners = windows(4), windows(5, first=SPECIALS.mask + 1)
    partners[::3, 0] = SPECIALS.sep  # partners beginning with a separator
    new, old = generators(4), generators(4)
    batch = obj.make_batch(clean, new, partners)
    want = reference_pairs_batch(kind, clean, partners, old)
    assert want["labels"].float().mean().item() == pytest.approx(0.5, abs=0.1)
    assert (want["padding"].sum(1) < WIDTH + 3).any() and (want["padding"].sum(1) == WIDTH + 3).any()
    for key in ("ids", "types", "padding", "labels"):
        assert torch.equal(batch[key], want[key]), key
    assert torch.equal(selected_of(batch), want["selected"])
    assert same_states(new, old)
