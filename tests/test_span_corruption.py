"""T5's span corruption (Raffel et al. 2020, §3.1.4), checked as properties over many draws."""
import pytest
import torch

from sesame.errors import SesameError
from sesame.objectives.span_corruption import (SpanCorruptionOptions, corrupt_spans, noise_spans, raw_length,
                                               sentinel_ids)

VOCAB, EOS = 1000, 1
SENTINELS = sentinel_ids(VOCAB)  # 999, 998, ..., 900


def generators(n, offset=0):
    return [torch.Generator().manual_seed(offset + i) for i in range(n)]


def windows(n_rows, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 900, (n_rows, length), generator=g)


def corrupt(rows, offset=0, **options):
    return corrupt_spans(rows, generators(len(rows), offset), sentinels=SENTINELS, eos=EOS,
                         options=SpanCorruptionOptions(**options))


def split(row):
    """A row without its </s>, cut before each sentinel: the pieces (sentinel or None, tokens after it)."""
    assert row[-1] == EOS
    pieces = [(None, [])]
    for t in row[:-1].tolist():
        if t >= 900:
            pieces.append((t, []))
        else:
            pieces[-1][1].append(t)
    return pieces


def test_sentinels_count_down_from_the_top_of_the_vocabulary():
    assert sentinel_ids(32128, 3).tolist() == [32127, 32126, 32125]


@pytest.mark.parametrize("length", [2, 3, 7, 20, 33, 100, 568])
def test_exactly_round_fifteen_percent_noise_in_round_third_as_many_spans(length):
    rows = windows(50, length)
    inputs, targets = corrupt(rows)
    noise = min(max(round(0.15 * length), 1), length - 1)
    spans = max(round(noise / 3), 1)
    assert inputs.shape == (50, length - noise + spans + 1) and targets.shape == (50, noise + spans + 1)
    for source, target in zip(inputs, targets):
        kept, noisy = split(source), split(target)
        assert [s for s, _ in kept[1:]] == [s for s, _ in noisy[1:]] == SENTINELS[:spans].tolist()
        assert noisy[0][1] == [] and all(tokens for _, tokens in noisy[1:])  # non-empty noise spans
        assert kept[0][1] and all(tokens for _, tokens in kept[1:-1])  # non-empty kept spans, the first one first
        assert kept[-1][1] == []  # the inputs end on a sentinel (the last span is noise), then </s>
        assert sum(len(tokens) for _, tokens in noisy) == noise


def test_putting_every_span_back_in_place_of_its_sentinel_rebuilds_the_window():
    rows = windows(200, 97)
    inputs, targets = corrupt(rows)
    for row, source, target in zip(rows, inputs, targets):
        spans = dict(split(target)[1:])
        rebuilt = []
        for sentinel, tokens in split(source):
            rebuilt += spans.pop(sentinel, []) + tokens
        assert rebuilt == row.tolist() and not spans


def test_every_inner_position_may_be_noise_the_first_never_the_last_always():
    rows = torch.arange(2, 102).repeat(500, 1)  # token t at position t − 2
    _, targets = corrupt(rows)
    tokens = targets[:, :-1][targets[:, :-1] < 900]  # without sentinels and </s>
    hits = torch.bincount(tokens - 2, minlength=100).float() / len(rows)
    assert abs(hits.mean() - 0.15) < 1e-6  # exactly 15 of every 100
    assert hits[0] == 0 and hits[-1] == 1  # T5 (without random_roll): kept tokens first, a noise span last
    assert ((hits[1:-1] > 0) & (hits[1:-1] < 1)).all()


def test_same_seed_same_corruption_other_examples_other_corruptions():
    rows = windows(1, 300).expand(20, 300)
    first, again = corrupt(rows), corrupt(rows)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    others = corrupt(rows, offset=100)
    assert len({tuple(r.tolist()) for r in torch.cat([first[0], others[0]])}) == 40


def old_noise_spans(length, options, generator):
    """The per-row algorithm before the batch was vectorised (issue 35), kept as the reference its draws must match,
    so that a run made before resumes bit-identically."""
    def segment(items, segments):
        cuts = torch.randperm(items - 1, generator=generator)[:segments - 1] + 1
        return torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values, torch.tensor([items])]).diff()

    noise, spans = options.counts(length)
    kept, noisy = segment(length - noise, spans), segment(noise, spans)
    starts = torch.stack([kept, noisy], 1).flatten().cumsum(0)[:-1]
    return torch.zeros(length, dtype=torch.long).index_fill_(0, starts, 1).cumsum(0)


@pytest.mark.parametrize("options", [{}, {"noise_density": 0.5, "mean_span": 1}, {"noise_density": 0.05}])
@pytest.mark.parametrize("length", [2, 3, 20, 151, 568])
def test_the_batch_draws_what_each_row_drew_alone_before(length, options):
    options = SpanCorruptionOptions(**options)
    batch = noise_spans(length, options, generators(9, offset=length))
    assert torch.equal(batch, torch.stack([old_noise_spans(length, options, g) for g in generators(9, offset=length)]))


def test_raw_length_fills_the_inputs_without_padding():
    assert raw_length(512) == (568, 114)  # T5's random_spans_helper
    assert SpanCorruptionOptions().lengths(568) == (512, 114)
    for inputs_length in (3, 10, 64, 129, 512):
        length, targets_length = raw_length(inputs_length)
        inputs, targets = corrupt(windows(4, length))
        assert inputs.shape[1] <= inputs_length < SpanCorruptionOptions().lengths(length + 1)[0]
        assert targets.shape[1] == targets_length


def test_separators_is_true_or_false():
    with pytest.raises(SesameError, match=r"separators=no: give true .* or false"):
        SpanCorruptionOptions(separators="no")


def test_mistakes_are_named():
    with pytest.raises(SesameError, match="noise_density"):
        SpanCorruptionOptions(noise_density=1.0)
    with pytest.raises(SesameError, match="mean_span"):
        SpanCorruptionOptions(mean_span=0.5)
    with pytest.raises(SesameError, match="sentinels"):
        corrupt_spans(windows(1, 3000), generators(1), sentinels=SENTINELS, eos=EOS)
    with pytest.raises(SesameError, match="longer sequence"):
        raw_length(2)
