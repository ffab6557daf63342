import os

import pytest

from sesame.errors import SesameError
from sesame.tokenizer import KINDS, SPECIAL_TOKENS, TextTokenizer, train_tokenizer

from .conftest import sentences

UNICODE = "Crème brûlée in Zürich, naïve café — 東京タワー and 😀🚀!"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return sentences(400) + [UNICODE] * 5 + ["dog. dog! dog? dogs, dog's"] * 20


@pytest.mark.parametrize("kind", KINDS)
def test_specials_come_first_and_wrap_texts(kind, texts):
    tok = train_tokenizer(texts, kind, vocab_size=300)
    specials = SPECIAL_TOKENS[kind]
    assert [tok.backend.id_to_token(i) for i in range(5)] == [specials[r] for r in ("pad", "unk", "cls", "sep", "mask")]
    ids = tok.encode(["the cat"])[0]
    assert ids[0] == tok.specials.cls and ids[-1] == tok.specials.sep
    a, b = tok.backend.encode("the cat", "a dog").type_ids[0], tok.backend.encode("the cat", "a dog").type_ids[-1]
    assert (a, b) == (0, 1)


def test_byte_level_bpe_keeps_words_apart_from_punctuation(texts):
    tok = train_tokenizer(texts, "bpe", vocab_size=400)
    pieces = [tok.backend.encode(w, add_special_tokens=False).tokens for w in ("dog.", "dog!", "dog?")]
    assert all(p[0] == "dog" for p in pieces), pieces
    assert {p[-1] for p in pieces} == {".", "!", "?"}


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_unicode_round_trip(kind, texts, tmp_path):
    tok = train_tokenizer(texts, kind, vocab_size=400, lowercase=False)
    tok.save(tmp_path / "tokenizer.json")
    loaded = TextTokenizer.load(tmp_path / "tokenizer.json")
    ids = loaded.encode([UNICODE])[0]
    assert ids == tok.encode([UNICODE])[0]
    decoded = loaded.decode(ids)
    if kind == "bpe":  # byte-level: exact
        assert decoded == UNICODE
    else:  # characters seen in training survive; spacing around punctuation may differ
        assert decoded.replace(" ", "") == UNICODE.replace(" ", "")


def test_wordpiece_is_uncased_by_default(texts):
    tok = train_tokenizer(texts, "wordpiece", vocab_size=300)
    assert tok.encode(["The CAT"]) == tok.encode(["the cat"])


def test_bad_requests_name_the_flag(texts, tmp_path):
    with pytest.raises(SesameError, match="--kind"):
        train_tokenizer(texts, "sentencepiece")
    with pytest.raises(SesameError, match="empty"):
        train_tokenizer([], "wordpiece", vocab_size=300)
    with pytest.raises(SesameError, match="no tokenizer.json"):
        TextTokenizer.load(tmp_path / "missing.json")


def test_cased_runs_keep_the_capitals_that_mark_names(corpus, labeled, tmp_path):
    """WordPiece lower-cases by default (uncased BERT); ``--cased`` keeps case in the tokenizer pretrain trains,
    and in the one a scratch model trains for fine-tuning; a tokenizer given or brought is not re-cased."""
    import sesame
    from sesame.run import load_tokenizer

    common = dict(family="bert", size="tiny", vocab_size=300, seq_len=16, max_steps=1, batch_size=4, progress=False)
    for cased in (False, True):
        sesame.pretrain([str(corpus)], str(tmp_path / f"run-{cased}"), cased=cased, **common)
        tok = load_tokenizer(tmp_path / f"run-{cased}")
        assert (tok.backend.encode("The").ids != tok.backend.encode("the").ids) == cased
    train, dev = labeled
    sesame.finetune("scratch:bert:tiny", str(train), str(dev), str(tmp_path / "tuned"), cased=True, max_steps=1,
                    progress=False)
    tok = load_tokenizer(tmp_path / "tuned")
    assert tok.backend.encode("The").ids != tok.backend.encode("the").ids
    for call in (lambda: sesame.pretrain([str(corpus)], str(tmp_path / "x"), cased=True,
                                         tokenizer=str(tmp_path / "run-True" / "tokenizer.json"), **common),
                 lambda: sesame.finetune(str(tmp_path / "run-True"), str(train), str(dev), str(tmp_path / "y"),
                                         cased=True, progress=False)):
        with pytest.raises(SesameError, match="drop --cased"):
            call()
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


TRAIN_ALL_KINDS = """
import sys
from tests.conftest import sentences
from tests.test_tokenizer import UNICODE
from sesame.tokenizer import KINDS, train_tokenizer
texts = sentences(2000) + [UNICODE] * 5
for kind in KINDS:
    train_tokenizer(iter(texts), kind, vocab_size=300).save(f"{sys.argv[1]}/{kind}.json")
"""


def test_training_is_repeatable_across_processes(tmp_path):
    """`tokenizers` iterates hash maps seeded per process (WordPiece gave its ## pieces ids in that order, Unigram
    summed its scores in it), so the same corpus gave a different tokenizer.json each time; now it gives one."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        subprocess.run([sys.executable, "-c", TRAIN_ALL_KINDS, str(tmp_path / name)], cwd=root, check=True,
                       env={**os.environ, "PYTHONPATH": str(root)})
    for kind in KINDS:
        a, b = (tmp_path / name / f"{kind}.json" for name in ("a", "b"))
        assert a.read_bytes() == b.read_bytes(), kind
        assert TextTokenizer.load(a).vocab_size > 50  # a trained vocabulary, not the specials alone


def test_unigram_characters_added_back_get_one_order_whatever_the_hash_order():
    """Two processes' UnigramTrainer tails on the same text (300 kB of WikiText-2, vocabulary 2000): EM dropped
    different ones of the tied rare characters, added them back at the lowest score plus k steps in hash order, and
    left its own lowest scores differing by up to 4e-11. Both give the same vocabulary; matching the steps exactly
    gave two."""
    from tokenizers import Tokenizer, models

    from sesame.tokenizer import _deterministic

    low = -12.206543606862803
    tied = {c: low for c in "攻殻隊'ê*á€íαö動機ōüYqQZ"}
    first = {**tied, "ō": -12.206543606822855, "ü": -12.206543606862793, "Y": -12.206043606862803,
             "q": -12.206143606862803, "Q": -12.206243606862804, "Z": -12.206343606862804, "ö": -12.206443606862804}
    second = {**tied, "攻": -12.206543606862791, "殻": -12.206543606862791, "Q": -12.206043606862801,
              "Y": -12.2061436068628, "Z": -12.206243606862802, "q": -12.206343606862802, "'": -12.206443606862802}
    specials = [(t, 0.0) for t in SPECIAL_TOKENS["unigram"].values()]
    vocabs = []
    for tail in (first, second):
        pieces = specials + [("▁the", -3.1), ("E", -12.049674198895518)] + list(tail.items())
        vocabs.append(_deterministic(Tokenizer(models.Unigram(pieces, unk_id=1)), "unigram").get_vocab())
    assert vocabs[0] == vocabs[1]
    by_id = [t for t, _ in sorted(vocabs[0].items(), key=lambda ti: ti[1])]
    assert by_id[-len(tied):] == sorted(tied, reverse=True)  # every one on a step, the first character lowest
