"""Documents inside files: boundaries recovered from each format, remembered with their source file by
the shards, and what NSP and SOP draw from them (negatives from other documents of the same file, both
SOP segments in one document)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import sesame
from sesame.data.corpus import BLANK_LINES, JSONL_RECORDS, boundary_rule, fingerprint, iter_pieces
from sesame.data.shards import _tokenizer_hash, prepare_corpus
from sesame.data.windows import Corpus, partners
from sesame.errors import SesameError
from sesame.models import Transformer, TransformerConfig
from sesame.objectives import AlbertPretraining, BertPretraining, MaskedLM
from sesame.pipelines.pretrain import lm_metrics
from sesame.tokenizer import train_tokenizer

from .conftest import load_script, sentences

NSP_TOPICS = Path(__file__).resolve().parents[1] / "benchmarks" / "nsp_topics.py"  # the corpus, and its seed sweep

WIKITEXT = """ 
 = Alpha Article = 
 
 Alpha opens here . 
 Alpha goes on . 
 
 = = Alpha history = = 
 
 The history of alpha . 
 
 = = = Early years = = = 
 
 Early alpha . 
 
 = Beta Article = 
 
 Beta is short . 
"""

BOOK = """THE BOOK

By Someone

CONTENTS

CHAPTER I. The Start
CHAPTER II. The End


CHAPTER I. The Start

It began. Chapter and verse were quoted.

More of it.

CHAPTER II. The End

It ended.
"""


def documents(files, **kwargs):
    """``{(source, document): text}`` as the corpus reader cuts ``files``."""
    docs = {}
    for source, doc, text in iter_pieces(files, **kwargs):
        docs[source, doc] = docs.get((source, doc), "") + text
    return docs


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(sentences(300) + WIKITEXT.splitlines() + BOOK.splitlines(), "wordpiece", vocab_size=300)


def test_wikitext_titles_begin_documents_and_sections_do_not(tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text(WIKITEXT)
    assert boundary_rule(path) == "wikitext titles"
    docs = documents([path])
    assert list(docs) == [(0, 0), (0, 1)]  # blank lines, sections and subsections stay in their article
    assert " = Alpha Article = " in docs[0, 0] and "Early alpha" in docs[0, 0] and "Beta" not in docs[0, 0]
    assert docs[0, 1].startswith(" = Beta Article = ")


def test_blank_lines_separate_documents_in_plain_text(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("\nOne, first line.\nOne, second line.\n\nTwo.\n   \n\nThree.\n")
    assert boundary_rule(path) == BLANK_LINES
    assert [text.split() for text in documents([path]).values()] == [
        ["One,", "first", "line.", "One,", "second", "line."], ["Two."], ["Three."]]


def test_chapter_headings_begin_documents(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(BOOK)
    assert boundary_rule(path) == "chapter headings"
    title_page, first, second = documents([path]).values()  # blank lines between paragraphs do not cut
    assert title_page.split() == ["THE", "BOOK", "By", "Someone", "CONTENTS"]
    assert "CHAPTER II. The End" in first and "More of it." in first  # the contents stay with chapter I
    assert second.split() == ["CHAPTER", "II.", "The", "End", "It", "ended."]


def test_jsonl_records_and_files_are_sources(tmp_path):
    records, plain = tmp_path / "c.jsonl", tmp_path / "d.txt"
    records.write_text("\n".join(json.dumps({"text": f"Record {i}.\n\nWith a blank line."}) for i in range(3)) + "\n")
    plain.write_text("A.\n\nB.\n")
    assert boundary_rule(records) == JSONL_RECORDS
    assert list(documents([records, plain])) == [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4)]


def test_shards_remember_documents_and_their_sources(tok, tmp_path):
    files = [tmp_path / "wiki.txt", tmp_path / "book.txt", tmp_path / "r.jsonl"]
    files[0].write_text(WIKITEXT)
    files[1].write_text(BOOK)
    files[2].write_text("\n".join(json.dumps({"text": t}) for t in ("One record.", "", "Another one.")) + "\n")
    shards = prepare_corpus(files, tok, tmp_path / "s", progress=False)
    assert shards.meta["boundaries"] == ["wikitext titles", "chapter headings", JSONL_RECORDS]
    assert shards.doc_sources.tolist() == [0, 0, 1, 1, 1, 2, 2]  # the empty record is no document
    tokens = np.concatenate(shards.arrays)
    starts = [0, *shards.doc_ends[:-1]]
    texts = [tok.backend.decode(tokens[a: b - 1].tolist()) for a, b in zip(starts, shards.doc_ends)]
    assert texts[1].startswith("= beta") and texts[-1] == "another one."


def test_format_one_shards_still_load_and_are_not_reused_by_prepare(tok, corpus, tmp_path):
    """Shards written before documents were cut inside files: read as they were (every document its own
    source), and not reused by `sesame prepare`, whose rules changed; nor replaced (a run may train on them):
    prepare writes the new format into a new folder."""
    files = sorted(corpus.glob("*.txt"))
    prepare_corpus(files, tok, tmp_path / "s", progress=False)
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    del meta["boundaries"]
    meta.update(format="sesame-shards/1", fingerprint=fingerprint(files, _tokenizer_hash(tok), "text"))
    (tmp_path / "s" / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "s" / "sources.bin").unlink()
    old = Corpus.of(str(tmp_path / "s"), "--corpus").shards(tok, tmp_path / "unused", progress=False)
    assert old.doc_sources.tolist() == [0, 1] and len(old.windows(16)) > 0
    with pytest.raises(SesameError, match="shards are never replaced"):
        prepare_corpus(files, tok, tmp_path / "s", progress=False)
    rebuilt = prepare_corpus(files, tok, tmp_path / "s2", progress=False)
    assert rebuilt.meta["format"] == "sesame-shards/2" and (tmp_path / "s2" / "sources.bin").is_file()


@pytest.fixture
def multi(tok, tmp_path):
    """Shards of two files of six blank-line-separated documents each and one file of a single document."""
    for name, n_docs in (("a", 6), ("b", 6), ("c", 1)):
        paragraphs = ["\n".join(sentences(4, seed=hash((name, d)) % 1000)) for d in range(n_docs)]
        (tmp_path / f"{name}.txt").write_text("\n\n".join(paragraphs) + "\n")
    return prepare_corpus([tmp_path / f"{n}.txt" for n in "abc"], tok, tmp_path / "s", progress=False)


def test_nsp_negatives_come_from_other_documents_of_the_same_file(tok, multi):
    shards, length = multi, 16
    assert shards.doc_sources.tolist() == [0] * 6 + [1] * 6 + [2]
    windows = shards.windows(length)
    tokens = np.concatenate(shards.arrays)

    def supplied(w):
        """The document of the window's first part, which a random next segment is read from."""
        start = shards.shard_starts[w.shard] + w.start
        return int(np.searchsorted(shards.doc_ends, start + (tokens[start] == tok.specials.sep), "right"))

    def touched(w):
        start = shards.shard_starts[w.shard] + w.start
        return set(range(*np.searchsorted(shards.doc_ends, [start, start + length - 1], "right") + [0, 1]))

    partner, g = partners(shards, windows, length), torch.Generator().manual_seed(0)
    for own in range(0, len(windows), 3):
        mine = touched(windows[own])
        files = {int(shards.doc_sources[d]) for d in mine}
        pool = [p for p, w in enumerate(windows) if supplied(w) not in mine
                and (files == {2} and shards.doc_sources[supplied(w)] != 2
                     or files != {2} and shards.doc_sources[supplied(w)] in files)]
        picks = {windows.index(partner(own, g)) for _ in range(300)}
        assert pool and picks <= set(pool) and len(picks) > 0.8 * min(len(pool), 100)


def test_sop_segments_stay_inside_one_document(tok, tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text("".join(f" = Article {k} = \n \n" + " ".join(sentences(6, seed=k)) + " \n \n" for k in range(8)))
    shards = prepare_corpus([path], tok, tmp_path / "s", progress=False)
    assert len(shards.doc_ends) == 8
    obj = AlbertPretraining(backbone(tok), tok.specials)
    windows = shards.windows(29)
    rows = torch.from_numpy(np.stack([shards.read(w, 29) for w in windows]))
    split = obj.split(rows, [torch.Generator().manual_seed(i) for i in range(len(windows))])
    for w, lo, cut, hi in zip(windows, *(edge.tolist() for edge in split)):
        start = shards.shard_starts[w.shard] + w.start
        first, last = np.searchsorted(shards.doc_ends, [start + lo, start + hi - 1], "right")
        assert first == last and lo < cut < hi


def backbone(tok):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=tok.vocab_size, hidden=16, layers=1, heads=2, intermediate=32,
                                         max_positions=64))


def test_nsp_is_refused_on_a_corpus_of_one_document(tmp_path):
    text = tmp_path / "one.txt"
    text.write_text("\n".join(sentences(200)) + "\n")  # no blank line, heading or record: one document
    with pytest.raises(SesameError, match=r"--corpus .*one.txt: 1 document, but mlm_nsp .*--objective mlm"):
        sesame.pretrain([str(text)], str(tmp_path / "run"), family="bert", size="tiny", vocab_size=200, seq_len=32,
                        max_steps=1, progress=False)


@pytest.mark.parametrize("cls", [BertPretraining, AlbertPretraining, MaskedLM])
def test_validation_reports_the_pair_accuracy(cls, tok, multi):
    obj = cls.build(backbone(tok), tok)
    obj.eval()
    windows = multi.windows(obj.window_length(32))
    metrics = lm_metrics(obj, multi, windows, obj.window_length(32))
    accuracy = {name: value for name, value in metrics.items() if name.endswith("_accuracy")}
    if cls is MaskedLM:
        assert accuracy == {}
        return
    assert list(accuracy) == [f"{obj.task}_accuracy"] and 0.0 <= accuracy[f"{obj.task}_accuracy"] <= 1.0
    from sesame.data.windows import examples
    batch = examples(obj, multi, windows, range(len(windows)), range(len(windows)), obj.window_length(32), 1,
                     partners(multi, windows, obj.window_length(32)) if obj.pairs else None)
    with torch.no_grad():
        hidden = obj.backbone(batch["ids"], batch["types"], batch["padding"])
        logits = obj.get_submodule(obj.task)(obj.pooler(hidden[:, 0]))
    assert accuracy[f"{obj.task}_accuracy"] == pytest.approx((logits.argmax(-1) == batch["labels"]).float().mean())


def test_nsp_learns_to_tell_another_documents_sentence_from_the_next(tmp_path, one_thread):
    """The property NSP exists for: when documents differ in topic, a true next segment and one from another
    document are told apart. Eight topics, each document drawing its words from its own topic's, so a negative
    (another document of the file) shares the topic one time in eight: accuracy can reach about 94%. A wiring
    fault (labels not following the pairs, the pooler not trained, partners from the same document) keeps it
    at chance. NSP sits at chance for a while before it learns, and how long depends on the seed and the start of
    the token embeddings: from BERT's default, the corpus's PPMI-SVD, seed 0's plateau outlasts the 300 steps (0.55)
    while seeds 1 to 7 pass (`benchmarks/nsp_topics.py`, docs/pretraining.md); so the wiring is tested from the
    random start, whose eight seeds there all pass by step 200."""
    train, valid = load_script(NSP_TOPICS, "nsp_topics").write_corpus(tmp_path)
    metrics = sesame.pretrain([str(train)], str(tmp_path / "run"), family="bert", size="tiny", vocab_size=120,
                              seq_len=32, valid=[str(valid)], max_steps=300, eval_every=300, embedding_init="random",
                              progress=False)
    assert metrics["nsp_accuracy"] > 0.8, metrics
