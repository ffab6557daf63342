"""Fuzzing every reader of user files: whatever the bytes, it returns or raises SesameError, never anything else.

The inputs are random bytes and, more often, random runs of the pieces the formats are made of (delimiters,
quotes, line ends, JSON punctuation, column names, numbers, CoNLL tags, a BOM, invalid UTF-8), and random JSON
with the keys the readers look for, so that most examples get past the first check.
"""
import json
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sesame.data.corpus import boundary_rule, iter_pieces, iter_texts
from sesame.data.labeled import read_columns, read_rows
from sesame.data.vectors import load_vectors
from sesame.errors import SesameError
from sesame.tasks import make_task
from sesame.tasks.cvt import read_sentences

PIECES = ["text", "label", "0", "1", "2", "-1", "1.5", "nan", "inf", "1e999", " ", ",", "\t", "\n", "\r\n", "\r",
          '"', '""', "'", "{", "}", "[", "]", ":", "null", "true", '"text"', '"label"', "-DOCSTART-", "O", "B-PER",
          " = Title = ", "CHAPTER I.", "é", "\u2028", "\x00", "\ufeff"]
KEYS = ["text", "label", "context", "choices", "data", "paragraphs", "qas", "id", "question", "answers",
        "answer_start", "is_impossible", "version", "title"]
FIELD = st.lists(st.sampled_from(PIECES), max_size=3).map("".join)
TABLE = st.builds(lambda header, rows, delimiter, end: end.join([header] + [delimiter.join(r) for r in rows]).encode(),
                  st.sampled_from(["text,label", "text\tlabel", "text,label,text", "0 1", ""]),
                  st.lists(st.lists(FIELD, min_size=1, max_size=4), max_size=8),
                  st.sampled_from([",", "\t", " "]), st.sampled_from(["\n", "\r\n", "\n\n"]))
JUNK = st.lists(st.sampled_from(PIECES).map(str.encode) | st.binary(max_size=2), max_size=40).map(b"".join)
TEXT = TABLE | JUNK | st.builds(bytes.__add__, TABLE, JUNK)  # tables, with junk after them now and then
SCALARS = st.none() | st.booleans() | st.integers(-2, 40) | st.floats() | st.sampled_from(PIECES)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                                                          max_size=5), max_leaves=25)
STRING = FIELD | JSON  # a string where a reader wants one, or any JSON value
ANSWER = st.fixed_dictionaries({"text": STRING, "answer_start": st.integers(-1, 12) | JSON})
QUESTION = st.fixed_dictionaries({"id": st.integers(0, 3) | STRING, "question": STRING,
                                  "answers": st.lists(ANSWER, max_size=2)},
                                 optional={"is_impossible": st.booleans() | JSON})
SQUAD = st.fixed_dictionaries({"data": st.lists(st.fixed_dictionaries({"title": STRING, "paragraphs": st.lists(
    st.fixed_dictionaries({"context": STRING, "qas": st.lists(QUESTION, max_size=3)}), max_size=2)}), max_size=2)},
    optional={"version": st.sampled_from(["1.1", "v2.0", "2.0"]) | JSON})
CHOICES = st.fixed_dictionaries({"context": STRING, "choices": st.lists(STRING, max_size=3) | JSON,
                                 "label": st.integers(-1, 3) | STRING}, optional={"text": STRING})


def lines(*values: st.SearchStrategy) -> st.SearchStrategy:
    """JSON Lines of ``values``, with junk lines now and then."""
    return st.lists(st.one_of(*values).map(lambda v: json.dumps(v).encode()) | JUNK, max_size=6).map(b"\n".join)


CONTENT = {".csv": TEXT, ".tsv": TEXT, ".txt": TEXT, ".jsonl": lines(CHOICES, JSON),
           ".json": (SQUAD | JSON).map(lambda v: json.dumps(v).encode()) | JUNK}


def _task(name: str, options: dict | None = None, labeled: bool = True) -> Callable[[Path], None]:
    """A task's reading of a file as fine-tuning does it: the examples, then (labeled) their label vocabulary
    and the check of the examples against it."""
    def read(path: Path) -> None:
        task = make_task(name, options)
        rows = task.read(str(path), labeled=labeled)
        if labeled:
            task.check(rows, task.labels(rows, str(path)), str(path))
    return read


LABELED = [lambda p: read_rows(p, header=False), lambda p: read_columns(p, "0", "1"), _task("classify"),
           _task("classify", labeled=False), _task("regress"), _task("pair", {"text_column": "text",
                                                                              "pair_column": "label"})]
CORPUS = [boundary_rule, lambda p: list(iter_pieces([p])), lambda p: list(iter_texts([p]))]
READERS = {
    ".csv": [*LABELED, *CORPUS], ".tsv": [*LABELED, *CORPUS],  # a corpus reads a table's text column
    ".txt": [_task("tag"), _task("tag", {"token_column": 1, "label_column": 0}), _task("tag", labeled=False),
             read_sentences, load_vectors, *CORPUS],
    ".jsonl": [*LABELED, *CORPUS, _task("multiple_choice"), _task("multiple_choice", labeled=False)],
    ".json": [_task("span_qa"), _task("span_qa", {"version": "2.0"}), _task("span_qa", labeled=False)],
}


@pytest.mark.parametrize("suffix", list(READERS))
def test_readers_raise_nothing_but_sesame_errors(tmp_path_factory, suffix):
    path = tmp_path_factory.mktemp("fuzz") / f"input{suffix}"

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(CONTENT[suffix])
    def read(content: bytes) -> None:
        path.write_bytes(content)
        for reader in READERS[suffix]:
            try:
                reader(path)
            except SesameError:
                pass

    read()
