"""How pre-training examples are drawn: static masks, two phases (partners from other documents: test_documents.py)."""
import pytest

from sesame.data.windows import TWO_PHASE_SWITCH, window_batches as _window_batches
from sesame.data.corpus import resolve_sources
from sesame.data.shards import prepare_corpus
from sesame.models import Transformer, TransformerConfig
from sesame.objectives import MaskedLM
from sesame.tokenizer import train_tokenizer
from sesame.train import TrainConfig

from .conftest import sentences


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(300), "wordpiece", vocab_size=200)


@pytest.fixture
def setting(tok, corpus, tmp_path):
    shards = prepare_corpus(resolve_sources([corpus]), tok, tmp_path / "shards", progress=False)
    backbone = Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=16, layers=1, heads=2,
                                             intermediate=32, max_positions=64))
    return shards, MaskedLM(backbone, tok.specials)


def test_shards_know_the_document_of_a_window(setting):
    shards, _ = setting
    windows = shards.windows(16)
    docs = shards.documents(windows)
    first_of_second = windows[list(docs).index(1)]
    assert list(docs) == sorted(docs) and set(docs) == {0, 1}
    assert all(w.start < shards.doc_ends[0] for w, d in zip(windows, docs) if d == 0)
    assert first_of_second.start >= shards.doc_ends[0] > first_of_second.start - 16


def record_seeds(obj):
    """Wrap make_batch to record, per row, (clean window, the seed of its generator)."""
    seen = []
    make_batch = obj.make_batch

    def recording(windows, generators, partners=None):
        seen.extend((tuple(w.tolist()), g.initial_seed()) for w, g in zip(windows, generators))
        return make_batch(windows, generators, partners)

    obj.make_batch = recording
    return seen


def test_static_masks_repeat_every_k_epochs_and_dynamic_masks_do_not(setting):
    shards, obj = setting
    windows = shards.windows(obj.window_length(16))
    cfg = TrainConfig(batch_size=len(windows), max_steps=10)  # one step = one epoch, in a fresh order each time

    def seeds_per_epoch(static: int) -> list[dict]:
        seen = record_seeds(obj)
        batches = _window_batches(obj, shards, [(obj.window_length(16), windows)], cfg, static_masks=static)
        epochs = []
        for epoch in range(4):
            seen.clear()
            batches(epoch, 0.0)
            epochs.append(dict(seen))
        return epochs

    static = seeds_per_epoch(2)
    assert static[0] == static[2] and static[1] == static[3]  # the same corruption every k = 2 epochs
    assert all(static[0][w] != static[1][w] for w in static[0])  # and k different ones
    dynamic = seeds_per_epoch(0)
    assert all(dynamic[0][w] != dynamic[2][w] for w in dynamic[0])


def test_two_phases_switch_to_long_sequences_at_ninety_percent(setting):
    shards, obj = setting
    phases = [(n, shards.windows(n)) for n in (obj.window_length(16), obj.window_length(48))]
    batches = _window_batches(obj, shards, phases, TrainConfig(batch_size=4, max_steps=10))
    assert batches(0, 0.0)[0]["ids"].shape == (4, 16)
    assert batches(8, TWO_PHASE_SWITCH - 1e-6)[0]["ids"].shape == (4, 16)
    assert batches(9, TWO_PHASE_SWITCH)[0]["ids"].shape == (4, 48)


def test_a_validation_perplexity_on_a_few_tokens_is_warned_of(tmp_path, capsys):
    from sesame.cli import main

    (tmp_path / "tiny.txt").write_text(" ".join(sentences(20))[:300] + "\n")  # 300 bytes
    assert main(["--no-progress", "pretrain", "--corpus", str(tmp_path / "tiny.txt"), "--family", "gpt", "--size",
                 "tiny", "--vocab-size", "100", "--seq-len", "8", "--max-steps", "1",
                 "--out", str(tmp_path / "run")]) == 0
    assert "sesame: warning: the corpus's last 1% (the validation split without --valid) holds only 9 tokens " \
           "(1 window of 9); a perplexity on fewer than 1000 means little" in capsys.readouterr().err
    assert main(["--no-progress", "evaluate", "--model", str(tmp_path / "run"), "--data", str(tmp_path / "tiny.txt"),
                 "--seq-len", "16"]) == 0
    assert "sesame: warning: --data holds only " in capsys.readouterr().err
