"""BART's denoising (Lewis et al. 2020, §2.2), checked as properties over many draws."""
import math

import pytest
import torch

from sesame.errors import SesameError
from sesame.objectives.denoising import DenoisingOptions, denoise, infill_draws, row_of_items
from sesame.objectives.masking import budget
from sesame.objectives.masking import word_index
from sesame.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=1, unk=3, cls=0, sep=2, mask=4)  # fairseq's <s> 0, <pad> 1, </s> 2, <unk> 3
VOCAB = 1000
STARTS = torch.arange(VOCAB) < 600  # ids 600..799 continue a word; the windows use ids 5..799
POOL = torch.arange(800, VOCAB)  # random replacements, told apart from the windows' tokens
SPECIAL_IDS = torch.tensor(SPECIALS.all)


def generators(n, offset=0):
    return [torch.Generator().manual_seed(offset + i) for i in range(n)]


def windows(n_rows=300, length=120, seed=0):
    """Rows of distinct tokens (each token says where it came from), a document separator at 60."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randperm(795, generator=g)[:length] + 5 for _ in range(n_rows)])
    rows[:, 60] = SPECIALS.sep
    return rows


def run(rows, sentence_ends=None, offset=0, **options):
    inputs, targets = denoise(rows, generators(len(rows), offset), sentence_ends=sentence_ends, specials=SPECIALS,
                              word_starts=STARTS, pool=POOL, options=DenoisingOptions(**options))
    assert torch.equal(targets[:, 1:-1], rows)  # the targets are the clean text, as BART's: <s> window </s>
    assert (targets[:, 0] == SPECIALS.cls).all() and (targets[:, -1] == SPECIALS.sep).all()
    sources = []
    for row in inputs:
        row = row[row != SPECIALS.pad]
        assert row[0] == SPECIALS.cls and row[-1] == SPECIALS.sep
        sources.append(row[1:-1])
    return sources


def subsequence(part, whole):
    it = iter(whole)
    return all(t in it for t in part)


def test_defaults_are_the_papers_best():
    o = DenoisingOptions()
    assert (o.mask_ratio, o.poisson_lambda, o.random_ratio, o.permute_ratio) == (0.3, 3.0, 0.1, 1.0)
    assert o.token_mask_ratio == o.delete_ratio == o.rotate_ratio == 0  # infilling + sentence permutation only


def test_infilling_masks_thirty_percent_of_whole_words_and_keeps_the_rest_in_order():
    rows = windows()
    fractions = []
    for row, source in zip(rows, run(rows, permute_ratio=0, random_ratio=0)):
        kept = source[source != SPECIALS.mask]
        assert subsequence(kept.tolist(), row.tolist())
        assert SPECIALS.sep in kept  # the document separator is never masked
        word = word_index(row, SPECIAL_IDS, STARTS)
        inside = word >= 0
        present = torch.bincount(word[inside & torch.isin(row, kept)], minlength=int(word.max()) + 1)
        size = torch.bincount(word[inside])
        assert ((present == 0) | (present == size)).all()  # no word is split
        gone = int((present == 0).sum())
        assert gone == round(0.3 * len(size))
        fractions.append(gone / len(size))
    assert abs(sum(fractions) / len(fractions) - 0.3) < 0.005  # only rounding moves it


def test_each_span_collapses_to_one_token_a_tenth_of_them_random():
    rows = windows()
    masks = randoms = 0
    for row, source in zip(rows, run(rows, permute_ratio=0)):
        replaced = (source == SPECIALS.mask) | (source >= 800)  # the windows hold no token of the pool
        masks += int((source == SPECIALS.mask).sum())
        randoms += int((source >= 800).sum())
        position = {t: p for p, t in enumerate(row.tolist())}
        kept = [-1] + [position[t] for t in source[~replaced].tolist()] + [len(row)]
        between = torch.cat([torch.zeros(1, dtype=torch.long), (~replaced).long().cumsum(0)])[
            torch.cat([replaced.nonzero().squeeze(1), torch.tensor([len(source)])])]  # kept tokens before each
        tokens_for_gap = torch.bincount(between[:-1], minlength=len(kept) - 1)
        for gap, (a, b) in enumerate(zip(kept, kept[1:])):
            assert b - a == 1 or tokens_for_gap[gap] >= 1  # removed text always leaves a token in its place
    assert abs(randoms / (masks + randoms) - 0.1) < 0.015  # ~4000 spans: std ≈ 0.005


def test_zero_length_spans_insert_a_mask():
    rows = windows()
    inserts = 0
    for row, source in zip(rows, run(rows, permute_ratio=0, random_ratio=0)):
        s = source.tolist()
        following = dict(zip(row.tolist(), row.tolist()[1:]))
        for p, t in enumerate(s):  # a mask between two kept tokens that follow each other in the text
            if t == SPECIALS.mask and 0 < p < len(s) - 1 and SPECIALS.mask not in (s[p - 1], s[p + 1]):
                inserts += following.get(s[p - 1]) == s[p + 1]
    assert inserts > 20  # e^-3 ≈ 5% of ~4000 spans have length 0, most between kept words


def test_span_lengths_are_poisson_cut_to_cover_the_budget_exactly():
    words = [1, 2, 0, 7, 36, 100_000]  # budgets 1, 1, none, 2, 11, 30,000
    sizes, span, row, token = infill_draws(words, DenoisingOptions(), mask=SPECIALS.mask, pool=POOL,
                                           generators=generators(len(words)))
    for i, n in enumerate(words):
        assert sizes[row == i].sum() == n and sizes[(row == i) & (span >= 0)].sum() == budget(n, 0.3)
        assert (sizes[(row == i) & (span < 0)] == 1).all()  # each unmasked word an item of its own
    assert torch.equal(span[span >= 0].sort().values, torch.arange(len(token)))  # each span once, numbered in turn
    lengths = sizes[(row == 5) & (span >= 0)]
    lengths = lengths[span[(row == 5) & (span >= 0)].argsort()][:-1]  # in drawn order, the cut last one left out
    assert abs(lengths.float().mean() - 3) < 0.05 and abs((lengths == 0).float().mean() - math.exp(-3)) < 0.005


def test_sentence_permutation_keeps_each_sentence_intact():
    rows = windows(200)
    ends = [[15, 40, 61, 90]] * len(rows)  # five sentences, the last one running to the window's end
    moved = 0
    for row, source in zip(rows, run(rows, ends, mask_ratio=0)):
        sentences = [row[a:b].tolist() for a, b in zip([0, 15, 40, 61, 90], [15, 40, 61, 90, 120])]
        pieces, rest = [], source.tolist()
        while rest:
            piece = next(s for s in sentences if rest[:len(s)] == s)
            pieces.append(piece)
            rest = rest[len(piece):]
        assert sorted(pieces) == sorted(sentences)
        moved += pieces != sentences
    assert moved > 190  # all five shuffled: the order is unchanged with chance 1/120


def test_a_permute_ratio_moves_that_share_of_the_sentences_at_most():
    rows = windows(200)
    ends = [list(range(10, 120, 10))] * len(rows)  # twelve sentences of ten tokens
    for row, source in zip(rows, run(rows, ends, mask_ratio=0, permute_ratio=0.25)):
        assert sorted(source.tolist()) == sorted(row.tolist())
        assert sum(source[i] != row[i] for i in range(0, 120, 10)) <= 3


def rotation_start(source, row):
    """Where in ``row`` the rotated ``source`` begins, once it is checked to be a rotation of it."""
    start = row.tolist().index(int(source[0]))
    assert torch.equal(source, row.roll(-start))
    return start


def test_rotation_preserves_the_tokens_and_starts_anywhere():
    rows = windows(1).expand(400, 120)
    starts = {rotation_start(source, row) for row, source in zip(rows, run(rows, mask_ratio=0, permute_ratio=0,
                                                                             rotate_ratio=1.0))}
    assert len(starts) > 90  # 400 draws over 120 starts cover ~96 of them


@pytest.mark.parametrize("n_rows", [1, 12])
def test_a_rotate_ratio_rotates_that_share_of_the_windows(n_rows):
    rows, rotated = windows(1).expand(n_rows, 120), 0
    for offset in range(0, 400, n_rows):  # a batch of one row draws as each row of a larger batch
        sources = run(rows, offset=offset, mask_ratio=0, permute_ratio=0, rotate_ratio=0.3)
        rotated += sum(rotation_start(source, row) > 0 for row, source in zip(rows, sources))
    share = rotated / (400 // n_rows * n_rows)
    assert abs(share - 0.3 * 119 / 120) < 4 * (0.25 / 400) ** 0.5  # a rotation may start at 0: 1/120 of them


@pytest.mark.parametrize("n_rows", [1, 50])
def test_token_masking_and_deletion_take_exact_counts_of_ordinary_tokens(n_rows):
    rows = windows(n_rows)
    for row, source in zip(rows, run(rows, mask_ratio=0, permute_ratio=0, token_mask_ratio=0.15)):
        masked = source == SPECIALS.mask
        assert int(masked.sum()) == round(0.15 * 119)  # the separator is never masked
        assert torch.equal(source[~masked], row[~masked])
    for row, source in zip(rows, run(rows, mask_ratio=0, permute_ratio=0, delete_ratio=0.2)):
        assert len(source) == 120 - round(0.2 * 119) and subsequence(source.tolist(), row.tolist())
        assert SPECIALS.sep in source.tolist()


@pytest.mark.parametrize("n_rows", [1, 30])
def test_all_noising_composes_on_rows_of_their_own_lengths(n_rows):
    """Infilling (rows of several lengths), then token masking (only of the tokens left, never a <mask> again), then
    deletion (of ordinary tokens only: every <mask> and separator stays), then rotation, on one batch."""
    rows = windows(n_rows)
    options = dict(permute_ratio=0, token_mask_ratio=0.1, delete_ratio=0.1)
    infilled = run(rows, permute_ratio=0)  # the same draws first
    noised = run(rows, **options)
    for before, after in zip(infilled, noised):
        n = int((before > 4).sum())
        masked, kept = budget(n, 0.1), n - budget(n, 0.1)
        assert int((after == SPECIALS.mask).sum()) == int((before == SPECIALS.mask).sum()) + masked
        assert len(after) == len(before) - budget(kept, 0.1) and int((after == SPECIALS.sep).sum()) == 1
    if n_rows > 1:
        assert len({len(s) for s in noised}) > 1
    rotated = run(rows, **options, rotate_ratio=1.0)
    for source, row in zip(rotated, noised):
        assert sorted(source.tolist()) == sorted(row.tolist())


def test_same_seed_same_noise_other_examples_other_noise():
    rows = windows(1).expand(20, 120)
    ends = [[30, 70]] * 20
    first, again, other = run(rows, ends), run(rows, ends), run(rows, ends, offset=50)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert len({tuple(s.tolist()) for s in first + other}) == 40


def test_mistakes_are_named():
    with pytest.raises(SesameError, match="mask_ratio"):
        DenoisingOptions(mask_ratio=1.5)
    with pytest.raises(SesameError, match="poisson_lambda"):
        DenoisingOptions(poisson_lambda=0)
    with pytest.raises(ValueError, match="sentence ends"):
        run(windows(1))  # permutation is on by default and needs the sentence ends
    with pytest.raises(ValueError, match="not increasing"):
        run(windows(1), [[30, 20]])


# -- the per-row algorithm (issue 35), kept as the reference the batched one must draw as -----------------------------

def old_span_lengths(total, lam, generator):
    lengths = torch.zeros(0, dtype=torch.long)
    while lengths.sum() < total:
        lengths = torch.cat([lengths, torch.poisson(torch.full((total,), lam), generator=generator).long()])
    covered = lengths.cumsum(0)
    last = int(torch.searchsorted(covered, total))  # the first span reaching the total
    lengths = lengths[:last + 1].clone()
    lengths[last] -= covered[last] - total
    return lengths


def old_infill(ids, word, options, *, mask, pool, generator):
    n_words = int(word.max()) + 1
    if n_words <= 0:
        return ids
    masked = budget(n_words, options.mask_ratio)
    lengths = old_span_lengths(masked, options.poisson_lambda, generator)
    spans = len(lengths)
    sizes = torch.cat([lengths, torch.ones(n_words - masked, dtype=torch.long)])  # spans, then unmasked words
    order = torch.randperm(len(sizes), generator=generator)
    sizes, owner = sizes[order], torch.where(order < spans, order, -1)  # the span of each item (−1: a kept word)
    ends = sizes.cumsum(0)
    span_of_word = owner[torch.searchsorted(ends, torch.arange(n_words), right=True)]
    random = torch.rand(spans, generator=generator) < options.random_ratio
    picks = pool[torch.randint(len(pool), (spans,), generator=generator)]
    token = torch.where(random, picks, mask).to(ids.dtype)  # what each span collapses to

    inside = word >= 0
    span = torch.where(inside, span_of_word[word.clamp(min=0)], -1)
    first = (span >= 0) & (span != torch.cat([span.new_full((1,), -1), span[:-1]]))
    keep = (span < 0) | first
    positions = torch.arange(len(ids))
    # a zero-length span before word w goes before w's first token; before word n_words, after the last word
    begins = torch.full((n_words + 1,), int(positions[inside].max()) + 1)
    begins[:n_words] = begins[:n_words].scatter_reduce(0, word[inside], positions[inside], "amin")
    inserts = (sizes == 0) & (owner >= 0)
    merged = torch.cat([torch.where(first, token[span.clamp(min=0)], ids)[keep], token[owner[inserts]]])
    keys = torch.cat([2 * positions[keep] + 1, 2 * begins[(ends - sizes)[inserts]]])  # an insert goes first
    return merged[keys.sort(stable=True).indices]


def some(ids, special_ids, ratio, generator):
    candidates = (~torch.isin(ids, special_ids)).nonzero().squeeze(1)
    picked = candidates[torch.randperm(len(candidates), generator=generator)[:budget(len(candidates), ratio)]]
    return torch.zeros(len(ids), dtype=torch.bool).index_fill_(0, picked, True)


def old_row_noise(ids, word, options, *, specials, special_ids, pool, generator):
    if options.mask_ratio:
        ids = old_infill(ids, word, options, mask=specials.mask, pool=pool, generator=generator)
    if options.token_mask_ratio:
        ids = ids.masked_fill(some(ids, special_ids, options.token_mask_ratio, generator), specials.mask)
    if options.delete_ratio:
        ids = ids[~some(ids, special_ids, options.delete_ratio, generator)]
    if options.rotate_ratio and float(torch.rand(1, generator=generator)) < options.rotate_ratio:
        ids = ids.roll(-int(torch.randint(len(ids), (1,), generator=generator)))
    return ids


def old_noise(ids, ends, options, g):
    """The per-row algorithm before sentence permutation, words and infilling were worked out for the whole batch
    (issue 35), kept as the reference its draws must match: the permutation and the words of one row, then its
    noising."""
    if options.permute_ratio:
        length = len(ids)
        ends = [e for e in ends if e != length] + [length]
        n = len(ends)
        chosen = torch.randperm(n, generator=g)[:math.ceil(n * options.permute_ratio)]
        place = torch.arange(n)
        place[chosen[torch.randperm(len(chosen), generator=g)]] = chosen
        sentence = torch.zeros(length, dtype=torch.long).index_fill_(0, torch.tensor(ends[:-1], dtype=torch.long), 1)
        ids = ids[(place[sentence.cumsum(0)] * length + torch.arange(length)).argsort()]
    return old_row_noise(ids, word_index(ids, SPECIAL_IDS, STARTS), options, specials=SPECIALS,
                         special_ids=SPECIAL_IDS, pool=POOL, generator=g)


@pytest.mark.parametrize("options", [{}, {"permute_ratio": 0.5, "token_mask_ratio": 0.1, "delete_ratio": 0.1,
                                          "rotate_ratio": 0.5}, {"permute_ratio": 0.0},
                                     {"poisson_lambda": 0.3, "mask_ratio": 0.5, "random_ratio": 0.5},
                                     {"poisson_lambda": 8.0, "mask_ratio": 1.0}])
@pytest.mark.parametrize("n_rows", [1, 40])
def test_a_batch_draws_what_each_row_drew_alone_before(options, n_rows):
    rows = windows(n_rows=40)
    rows[3] = SPECIALS.sep  # a row without words
    rows[5, 1:] = SPECIALS.sep  # a row of one word
    rows[7, ::2] = SPECIALS.sep  # words between separators
    rows = rows[:n_rows]  # and a batch of one ordinary row
    ends = [sorted({10 + i % 7, 30, 61, 90 + i % 5}) for i in range(len(rows))]
    sources = run(rows, ends, **options)
    for row, row_ends, source, g in zip(rows, ends, sources, generators(len(rows))):
        assert source.tolist() == old_noise(row, row_ends, DenoisingOptions(**options), g).tolist()


@pytest.mark.parametrize("counts", [[3], [1, 2], [2, 1, 4]])
def test_row_of_items_repeats_each_row_its_count_of_times_one_row_included(counts):
    expected = [row for row, count in enumerate(counts) for _ in range(count)]
    assert row_of_items(counts).tolist() == expected and row_of_items(counts).dtype == torch.long
