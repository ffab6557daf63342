"""BERT's next-sentence and ALBERT's sentence-order prediction: how pairs are drawn, and the loss."""
import functools

import pytest
import torch
import torch.nn.functional as F

from sesame.models import Transformer, TransformerConfig
from sesame.train import mean_loss
from sesame.objectives.mlm import masked_entries
from sesame.objectives.pairs import AlbertPretraining, BertPretraining, document_parts, sentence_end_ids
from sesame.tasks.classify import SequenceModel
from sesame.tokenizer import SpecialIds, train_tokenizer

from .conftest import sentences

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB, SEQ_LEN = 2000, 64
LENGTH = SEQ_LEN - 3
ENDS = torch.arange(14, VOCAB, 7)  # every seventh id ends a sentence


def objective(cls, vocab_size=VOCAB, seed=0):
    torch.manual_seed(seed)
    backbone = Transformer(TransformerConfig(vocab_size=vocab_size, hidden=32, layers=2, heads=2, intermediate=64,
                                             dropout=0.0))
    return cls(backbone, SPECIALS)


def generated(n, seed=0):
    """Windows of consecutive ids below 1000, partners of ids from 1000; half of each cross a document
    boundary (a partner may even begin with one)."""
    g = torch.Generator().manual_seed(seed)
    windows = 10 + torch.randint(0, 800, (n, 1), generator=g) + torch.arange(LENGTH)
    partners = 1000 + torch.randint(0, 900, (n, 1), generator=g) + torch.arange(LENGTH)
    for rows, low in ((windows, 20), (partners, 0)):
        crossing = (torch.rand(n, generator=g) < 0.5).nonzero()[:, 0]
        rows[crossing, torch.randint(low, 40, (len(crossing),), generator=g)] = SPECIALS.sep
    return windows, partners


@functools.cache
def draw(cls, n=2000, seed=0):
    """(objective, windows, partners, batch); shared between tests, which only read them."""
    obj = objective(cls)
    obj.sentence_ends = ENDS
    windows, partners = generated(n, seed)
    generators = [torch.Generator().manual_seed(seed * n + i) for i in range(n)]
    return obj, windows, partners, obj.make_batch(windows, generators, partners)


def clean(batch):
    """The uncorrupted inputs: targets put back at the masked positions."""
    ids = batch["ids"].flatten().clone()
    ids[masked_entries(batch, "positions")] = masked_entries(batch, "targets")
    return ids.view(batch["ids"].shape)


def segments(row):
    """(A, B) of ``[CLS] A [SEP] B [SEP] pad…``."""
    first, second = (row == SPECIALS.sep).nonzero()[:2, 0].tolist()
    return row[1:first], row[first + 1: second]


def slice_of(seq, row):
    """Whether ``seq`` occurs contiguously in ``row`` (ids within a row are unique here)."""
    starts = (row == seq[0]).nonzero()[:, 0].tolist()
    return any(torch.equal(row[s: s + len(seq)], seq) for s in starts)


@pytest.mark.parametrize("cls", [BertPretraining, AlbertPretraining])
def test_layout_segments_and_padding(cls):
    _, _, _, batch = draw(cls, n=300)
    ids = clean(batch)
    assert ids.shape == batch["types"].shape == batch["padding"].shape == (300, SEQ_LEN)
    for row, types, real in zip(ids, batch["types"], batch["padding"]):
        n_real = int(real.sum())
        assert real[:n_real].all() and (row[n_real:] == SPECIALS.pad).all()
        seps = (row[:n_real] == SPECIALS.sep).nonzero()[:, 0].tolist()
        assert row[0] == SPECIALS.cls and len(seps) == 2 and seps[1] == n_real - 1  # no separator inside A or B
        a, b = segments(row)
        assert len(a) >= 1 and len(b) >= 1 and not torch.isin(torch.cat([a, b]), torch.tensor(SPECIALS.all)).any()
        expected = torch.zeros(SEQ_LEN, dtype=torch.long)
        expected[seps[0] + 1: n_real] = 1  # 0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding
        assert torch.equal(types, expected)


def test_next_sentence_half_true_continuations_half_from_the_partner():
    _, windows, partners, batch = draw(BertPretraining)
    labels = batch["labels"]
    assert abs(labels.float().mean().item() - 0.5) < 0.045  # 2000 draws: std ≈ 0.011
    for row, window, partner, label in zip(clean(batch), windows, partners, labels.tolist()):
        a, b = segments(row)
        assert slice_of(a, window) and a[-1] in ENDS  # A ends a sentence (every range here holds one)
        if label == 0:
            assert slice_of(torch.cat([a, b]), window)  # B follows A in the window
        else:
            lo, hi = document_parts(partner, SPECIALS.sep)[0].tolist()
            assert (b >= 1000).all() and slice_of(b, partner[lo:hi])  # from the partner's first document
            start = int((partner == b[0]).nonzero())
            assert start == lo or partner[start - 1] in ENDS  # and begins a sentence when it can


def test_random_next_segment_keeps_the_length_of_the_true_one():
    _, windows, partners, batch = draw(BertPretraining, n=400)
    lengths = batch["padding"].sum(1)
    whole = (windows != SPECIALS.sep).all(1) & (partners != SPECIALS.sep).all(1)
    assert (lengths[whole] == SEQ_LEN).all()  # no boundary, no padding, whatever the label


def test_sentence_order_negatives_are_the_positives_swapped():
    obj, windows, _, batch = draw(AlbertPretraining)
    labels = batch["labels"]
    assert abs(labels.float().mean().item() - 0.5) < 0.045
    for row, window, label in zip(clean(batch), windows, labels.tolist()):
        first, second = segments(row)
        a, b = (first, second) if label == 0 else (second, first)
        assert slice_of(torch.cat([a, b]), window) and a[-1] in ENDS  # B then A when swapped
    # partners are not read
    again = obj.make_batch(windows[:8], [torch.Generator().manual_seed(i) for i in range(8)])
    assert again["ids"].shape == (8, SEQ_LEN)


def one_pair(obj, window, partner, seed):
    """(A, B) of one example."""
    a, b, _ = obj.pair(window[None], partner[None], [torch.Generator().manual_seed(seed)])
    return [segment.tokens[0, segment.start[0]: segment.end[0]] for segment in (a, b)]


def test_short_document_parts():
    obj = objective(BertPretraining)
    window = torch.arange(10, 10 + LENGTH)
    window[2] = SPECIALS.sep  # a 2-token part, then a long one: A and B come from the long one
    for seed in range(20):
        a, b = one_pair(obj, window, torch.arange(1000, 1000 + LENGTH), seed)
        assert (a > 12).all() and len(a) >= 4 and len(b) >= 4
    window = torch.arange(10, 23)
    window[6] = SPECIALS.sep  # two 6-token parts: one of them, cut in its middle
    a, b = one_pair(obj, window, torch.arange(1000, 1013), 0)
    assert len(a) == 3 and len(torch.cat([a, b])) <= 6


def test_masking_statistics_hold():
    _, _, _, batch = draw(BertPretraining)
    ids = clean(batch)
    ordinary = ~torch.isin(ids, torch.tensor(SPECIALS.all))
    selected = torch.zeros(ids.numel(), dtype=torch.bool)
    selected[masked_entries(batch, "positions")] = True
    assert not selected[~ordinary.flatten()].any()  # never [CLS], [SEP] or padding
    assert abs(selected.sum().item() / ordinary.sum().item() - 0.15) < 0.01


@pytest.mark.parametrize("cls", [BertPretraining, AlbertPretraining])
def test_each_row_is_drawn_from_its_own_generator(cls):
    obj, windows, partners, batch = draw(cls, n=6)
    alone = obj.make_batch(windows[3:4], [torch.Generator().manual_seed(3)], partners[3:4])
    for key in ("ids", "types", "padding", "labels"):
        assert torch.equal(alone[key][0], batch[key][3])


@pytest.mark.parametrize("cls, head", [(BertPretraining, "nsp"), (AlbertPretraining, "sop")])
def test_pooler_and_head_shapes(cls, head):
    obj = objective(cls)
    assert obj.pooler[0].weight.shape == (32, 32) and isinstance(obj.pooler[1], torch.nn.Tanh)
    assert getattr(obj, head).weight.shape == (2, 32)
    classifier = SequenceModel(obj.backbone, n_out=3, pooling="cls")
    classifier.pooler.load_state_dict(obj.pooler.state_dict())  # fine-tuning can start from it


def test_sentence_ends_come_from_the_tokenizer():
    tok = train_tokenizer(sentences(200) + ["Is it? Yes! No."], "wordpiece", vocab_size=150)
    ends = sentence_end_ids(tok)
    assert sorted(tok.backend.decode([i]) for i in ends.tolist()) == ["!", ".", "?"]
    backbone = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=32, layers=2, heads=2,
                                             intermediate=64))
    assert torch.equal(BertPretraining.build(backbone, tok).sentence_ends, ends)


def test_masked_lm_options_pass_through():
    """ALBERT masks n-grams (Lan et al. 2020, §4.1): MaskedLM's options reach its corruption."""
    tok = train_tokenizer(sentences(200), "unigram", vocab_size=150)
    backbone = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=32, layers=2, heads=2,
                                             intermediate=64))
    obj = AlbertPretraining.build(backbone, tok, masking="phrase", ngram=3)
    assert obj.masking == "phrase" and obj.ngram == 3
    windows = torch.tensor(tok.encode([" ".join(sentences(20))], special=False)[0][:LENGTH]).repeat(4, 1)
    batch = obj.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(4)])
    assert batch["targets"].numel() > 0 and torch.isfinite(mean_loss(obj, batch))


def test_loss_is_mean_mlm_plus_mean_next_sentence():
    obj = objective(BertPretraining).eval()
    windows, partners = generated(8)
    batch = obj.make_batch(windows, [torch.Generator().manual_seed(i) for i in range(8)], partners)
    with torch.no_grad():
        n = batch["masked"]
        hidden = obj.backbone(batch["ids"], batch["types"], batch["padding"])
        logits = obj.transform(hidden) @ obj.backbone.embed.tokens.weight.t() + obj.bias
        mlm = F.cross_entropy(logits.flatten(0, 1)[batch["positions"]], batch["targets"])
        nsp = F.cross_entropy(obj.nsp(obj.pooler(hidden[:, 0])), batch["labels"])
        assert batch["counts"] == {"mlm": n, "nsp": 8}
        assert torch.allclose(mean_loss(obj, batch), mlm + nsp, rtol=1e-4)


def packed_corpus(n_docs=12):
    """A wordpiece tokenizer and the token stream of ``n_docs`` generated documents, separator-delimited."""
    docs = [" ".join(sentences(12, seed=d)) for d in range(n_docs)]
    tok = train_tokenizer(docs, "wordpiece", vocab_size=150)
    stream, owner = [], []
    for d, ids in enumerate(tok.encode(docs, special=False)):
        stream += ids + [tok.specials.sep]
        owner += [d] * (len(ids) + 1)
    return tok, torch.tensor(stream), torch.tensor(owner)


@pytest.mark.parametrize("cls", [BertPretraining, AlbertPretraining])
def test_loss_goes_down_on_tiny_data(cls, one_thread):
    tok, stream, owner = packed_corpus()
    length = cls.window_length(32)
    starts = torch.arange(0, len(stream) - length, length)
    windows = torch.stack([stream[s: s + length] for s in starts])
    g = torch.Generator().manual_seed(0)
    # each partner: a window starting in another document
    partners = torch.stack([windows[int(torch.multinomial((owner[starts] != owner[s]).float(), 1, generator=g))]
                            for s in starts])
    torch.manual_seed(0)
    backbone = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=32, layers=2, heads=2,
                                             intermediate=64, max_positions=32, dropout=0.0))
    obj = cls.build(backbone, tok)
    optimizer = torch.optim.AdamW(obj.parameters(), lr=3e-3)

    def loss(step, rows):
        batch = obj.make_batch(windows[rows], [torch.Generator().manual_seed(step * 1000 + int(r)) for r in rows],
                               partners[rows])
        return mean_loss(obj, batch)

    held = torch.arange(16)
    with torch.no_grad():
        before = loss(-1, held).item()
    for step in range(40):
        rows = torch.randint(len(windows), (16,), generator=g)
        optimizer.zero_grad()
        loss(step, rows).backward()
        optimizer.step()
    with torch.no_grad():
        after = loss(-1, held).item()
    assert after < before - 1.0, (before, after)
