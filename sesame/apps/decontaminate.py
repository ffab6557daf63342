"""N-gram overlap between a pre-training corpus and evaluation sets (``sesame decontaminate``).

After GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", Appendix C): text is
normalised (lower-cased, punctuation removed, split on whitespace), an evaluation example is
*dirty* when any of its n-grams (n = 13 by default) occurs in the corpus, and the corpus can be
written back without the documents that share an n-gram with any example. Deviations from GPT-3:

- Punctuation becomes a space rather than vanishing, so "well-known", "well @-@ known" (WikiText)
  and "don't" / "don 't" normalise alike.
- One n for all sets (``--n``), and examples shorter than n words (in every field) are not tested but
  counted apart as ``short``; GPT-3 instead chose n per dataset from its 5th-percentile example
  length, between 8 and 13 (run again with a smaller ``--n`` to see the short examples).
- A corpus *document* is one text file or one ``.jsonl`` record (as ``sesame pretrain`` reads
  them); n-grams run across line breaks inside a document, never across documents.
- An example with several fields (a sentence pair, a SQuAD question and its context) is dirty when
  any field shares an n-gram; n-grams never span two fields.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from tqdm.auto import tqdm

from ..data.corpus import (JSONL_RECORDS, PARQUET_ROWS, TEXT_SUFFIXES, decoded_lines, is_plain, record_format, records,
                           resolve_sources)
from ..data.labeled import FORMATS, read_fields, read_text
from ..errors import SesameError
from ..options import option
from ..outputs import check_dir, publish_dir
from ..train.checkpoint import temporary_dir

_NON_WORD = re.compile(r"[\W_]+")
EVAL_HELP = ("PATH[:COLUMN[,COLUMN2]]: a .csv/.tsv/.jsonl file and its text column(s) (numbers for a "
             "headerless file), a SQuAD .json file (question + context), or a text file read as "
             "PATH:lines (one example per non-blank line, the default) or PATH:conll (one sentence per example)")


@dataclass(kw_only=True)
class DecontaminateSpec:
    """``sesame decontaminate``: the corpus, the evaluation sets (:data:`EVAL_HELP`), n, and what to write."""
    corpus: list[str] = option(help="text files, folders or .jsonl files")
    evals: list[str] = option(cli=False, help="evaluation sets (--eval, repeated)")
    n: int = option(13, help="n-gram length in normalised words")
    out_corpus: str | None = option(None, metavar="DIR", help="write the corpus without the overlapping documents to "
                                                              "this new folder")
    text_field: str = option("text", help="the text field of .jsonl records")
    show: int = option(3, help="overlapping examples shown per set")
    progress: bool = option(True, cli=False, help="show a progress bar")


def normalize(text: str) -> list[str]:
    """GPT-3's normalisation: lower-case, punctuation out (here: to a space), split into words."""
    return _NON_WORD.sub(" ", text.lower()).split()


def ngrams(words: Sequence[str], n: int) -> Iterator[str]:
    """Every run of ``n`` consecutive words, joined by single spaces."""
    for i in range(len(words) - n + 1):
        yield " ".join(words[i:i + n])


@dataclass
class EvalSet:
    """One ``--eval`` set: its name, and per example an id and its text fields."""

    name: str
    ids: list[str]
    fields: list[list[str]]


def _split_spec(spec: str) -> tuple[Path, list[str]]:
    if Path(spec).exists() or ":" not in spec:
        return Path(spec), []
    path, _, columns = spec.rpartition(":")
    return Path(path), [c for c in columns.split(",") if c]


def read_eval(spec: str) -> EvalSet:
    """An ``--eval PATH[:COLUMN[,COLUMN2]]`` set, read with sesame's own readers (see ``EVAL_HELP``)."""
    path, columns = _split_spec(spec)
    if not path.is_file():
        raise SesameError(f"--eval {spec}: no such file {path}")
    suffix = path.suffix.lower()
    if suffix in FORMATS:
        if not columns:
            raise SesameError(f"--eval {spec}: name the text column(s), e.g. --eval {path}:sentence or "
                              f"{path}:sentence1,sentence2")
        rows = read_fields(path, {c: (c, f"--eval {spec}") for c in columns})
        return EvalSet(spec, [f"line {r['line']}" for r in rows], [[r[c] for c in columns] for r in rows])
    if suffix == ".json":
        from ..tasks.span_qa import SpanQA

        if columns:
            raise SesameError(f"--eval {spec}: a SQuAD file is read whole (question + context); "
                              f"drop :{','.join(columns)}")

        examples = SpanQA().read(str(path), labeled=False)
        return EvalSet(spec, [e["id"] for e in examples], [[e["question"], e["context"]] for e in examples])
    reading = columns[0] if len(columns) == 1 else "lines" if not columns else ""
    if suffix in TEXT_SUFFIXES and reading == "conll":
        from ..tasks.tag import Tag

        examples = Tag().read(str(path), labeled=False)
        return EvalSet(spec, [f"line {e['line']}" for e in examples], [[e["text"]] for e in examples])
    if suffix in TEXT_SUFFIXES and reading == "lines":
        lines = [(i, line) for i, line in enumerate(read_text(path).splitlines(), 1) if line.strip()]
        return EvalSet(spec, [f"line {i}" for i, _ in lines], [[line] for _, line in lines])
    raise SesameError(f"--eval {spec}: not a supported evaluation set; give {EVAL_HELP}")


@dataclass
class _Index:
    """The n-grams of every tested example: n-gram → the (set, example) pairs holding it."""

    n: int
    sets: list[EvalSet]
    table: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    short: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for s, eval_set in enumerate(self.sets):
            short = 0
            for e, fields in enumerate(eval_set.fields):
                words = [normalize(f) for f in fields]
                if max(len(w) for w in words) < self.n:
                    short += 1
                    continue
                for gram in {g for w in words for g in ngrams(w, self.n)}:
                    self.table.setdefault(gram, []).append((s, e))
            self.short.append(short)


def _documents(files: Sequence[Path], text_field: str) -> Iterator[tuple[Path, int | None, Iterator[str]]]:
    """``(file, record line or None, lines)`` per corpus document, as ``sesame pretrain`` splits them."""
    for path in files:
        if record_format(path) in (JSONL_RECORDS, PARQUET_ROWS):  # (a CSV file is read as text, its rows lines)
            for lineno, text in records(path, text_field):
                yield path, lineno, iter([text])
        else:
            yield path, None, (line for _, line in decoded_lines(path))


def _out_names(corpus: Sequence[str]) -> dict[Path, Path]:
    """Each corpus file's name in ``--out-corpus``: relative to its folder argument, or its own name."""
    names: dict[Path, Path] = {}
    for raw in corpus:
        root = Path(raw)
        for f in resolve_sources([raw]):
            name = f.relative_to(root) if root.is_dir() else Path(f.name)
            if name in names.values():
                raise SesameError(f"--out-corpus: two corpus files would both be written as {name}; "
                                  "rename one or pass their folder instead")
            names[f] = name
    return names


def decontaminate(spec: DecontaminateSpec) -> dict:
    """Report which evaluation examples share an n-gram with the corpus; optionally write the corpus without the
    overlapping documents to ``spec.out_corpus`` (a new or empty folder)."""
    n, corpus = spec.n, spec.corpus
    if n < 1:
        raise SesameError(f"--n {n}: must be a positive whole number (GPT-3 used 13)")
    if not spec.evals:
        raise SesameError("--eval: give at least one evaluation set")
    files = resolve_sources(corpus)
    out = Path(spec.out_corpus) if spec.out_corpus else None
    if out is not None:
        check_dir(out, "--out-corpus", fix="choose a new folder")
        if unplain := next((f for f in files if not is_plain(f)), None):
            raise SesameError(f"--out-corpus: {unplain} is compressed or Parquet, and the clean corpus is written as "
                              "text and .jsonl; decompress it first, or drop --out-corpus to report only")
        names = _out_names(corpus)
    index = _Index(n, [read_eval(e) for e in spec.evals])
    hits: dict[tuple[int, int], tuple[str, str]] = {}  # (set, example) → (first n-gram, document)
    documents, dirty_docs = 0, []
    clean: dict[Path, list[int | None]] = {}
    bar = tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, desc="decontaminate",
               disable=not spec.progress)
    for path, record, lines in _documents(files, spec.text_field):
        documents += 1
        name = f"{path}:{record}" if record is not None else str(path)
        window: list[str] = []
        found: set[tuple[int, int]] = set()
        for line in lines:
            bar.update(len(line.encode()))
            window = window[-(n - 1):] + normalize(line) if n > 1 else normalize(line)
            for gram in ngrams(window, n):
                for key in index.table.get(gram, ()):
                    found.add(key)
                    hits.setdefault(key, (gram, name))
        if found:
            dirty_docs.append({"document": name, "examples": len(found)})
        else:
            clean.setdefault(path, []).append(record)
    bar.update(max(0, bar.total - bar.n))  # .jsonl counts only the text fields
    bar.close()
    report = {"n": n, "documents": documents, "overlapping_documents": len(dirty_docs),
              "documents_with_overlap": dirty_docs, "eval": []}
    for s, eval_set in enumerate(index.sets):
        dirty = sorted(e for (t, e) in hits if t == s)
        total = len(eval_set.ids)
        report["eval"].append({
            "eval": eval_set.name, "examples": total, "short": index.short[s], "overlapping": len(dirty),
            "percent": round(100 * len(dirty) / total, 2),
            "samples": [{"example": eval_set.ids[e], "text": " | ".join(eval_set.fields[e])[:120],
                         "ngram": hits[s, e][0], "document": hits[s, e][1]} for e in dirty[:spec.show]]})
    if out is not None:
        _write_corpus(out, names, clean)
        report["out_corpus"] = str(out)
    return report


def _write_corpus(out: Path, names: dict[Path, Path], clean: dict[Path, list[int | None]]) -> None:
    """Copy the clean text files and the clean records of ``.jsonl`` files into ``out``, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_dir(out.parent, f".{out.name}.")
    try:
        for path, records in clean.items():
            target = tmp / names[path]
            target.parent.mkdir(parents=True, exist_ok=True)
            if records == [None]:
                shutil.copyfile(path, target)
            else:
                keep = set(records)
                with open(target, "w", encoding="utf-8") as fh:
                    fh.writelines(line for lineno, line in decoded_lines(path) if lineno in keep)
        publish_dir(tmp, out, "--out-corpus")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def format_report(report: dict) -> str:
    """The report as a text table, then a few overlapping examples per set."""
    lines = [f"{report['overlapping_documents']:,} of {report['documents']:,} corpus documents share a "
             f"{report['n']}-gram with an evaluation example",
             f"{'examples':>9} {'short':>7} {'overlap':>8} {'%':>7}  eval set"]
    for r in report["eval"]:
        lines.append(f"{r['examples']:>9,} {r['short']:>7,} {r['overlapping']:>8,} {r['percent']:>7.2f}  {r['eval']}")
    for r in report["eval"]:
        for x in r["samples"]:
            lines.append(f"  {r['eval']} {x['example']}: {x['text']!r} shares {x['ngram']!r} with {x['document']}")
    if "out_corpus" in report:
        lines.append(f"wrote {report['out_corpus']} without the {report['overlapping_documents']} overlapping "
                     "documents")
    return "\n".join(lines)
