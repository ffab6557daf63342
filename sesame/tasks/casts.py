"""How each kind of data becomes text to text for :class:`~sesame.tasks.text2text.Text2Text`: one row of
:data:`CASTS` per cast, as T5's Appendix D writes each task (Raffel et al. 2020), with the readers of the inputs that
are not columns (parallel text files, SQuAD JSON), the answer and gold value of a raw target, and the scorer that
parses generated text back into the original task's answers.

* ``text``: a source and a target column (CSV, TSV, JSON Lines), or a pair of parallel text files, one example per
  line (:func:`parallel_lines`). Metrics: sacreBLEU as T5 computes it (cased, ``intl`` tokenisation, exponential
  smoothing) and exact match of the whole output (T5's ``sequence_accuracy``).
* ``classify``, ``pair``: each input column as ``name: value``, the target the label, or its word in
  ``label_words``. Metrics: those of ``classify`` on the label the output names.
* ``regress`` (STS-B): the target is the score rounded to the nearest 0.2 and written with one decimal
  (:func:`stsb_target`); Pearson and Spearman of the output read as a number against the unrounded gold scores.
* ``span_qa``: SQuAD JSON (v1.1, answerable questions, :func:`squad_rows`) → the first gold answer; SQuAD's exact
  match and F1 (the official normalisation, :func:`sesame.metrics.answer_scores`) against all gold answers.

An output that names no label or is not a number is wrong, as in T5's postprocessors: it counts as no class
(``classification_report``'s -1: a miss of the gold class, no class's false positive) or as the score -1 (T5's
``string_to_float`` default); ``invalid`` reports their share.

Deviations from T5: STS-B is scored against the original scores (T5 correlates with its rounded targets); an
unparsable class in a two-class F1 is a miss, not the other class (T5's ``f1_score_with_invalid``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from ..data.labeled import read_text
from ..errors import SesameError
from ..metrics import accuracy, answer_scores, bleu, classification_report, regression_report
from .span_qa import SpanQA


class TargetOptions(Protocol):
    """What a cast reads of its :class:`~sesame.tasks.text2text.Text2Text` task's options."""
    target_column: str | None
    label_words: dict | None


INVALID = -1  # the class of an output that names none (classification_report counts it wrong)
NOT_A_NUMBER = -1.0  # the score of an output that is not a number (T5's string_to_float default)


def number(text: str) -> float | None:
    """``text`` as a finite number, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def stsb_target(score: float) -> str:
    """T5's STS-B target: the score rounded to the nearest 0.2 (round(5x)/5, half to even as ``tf.round``) with
    one decimal: 3.77 → "3.8", 0.1 → "0.0", 0.3 → "0.4"."""
    return f"{round(score * 5) / 5:.1f}"


def compose(prefix: str, fields: list[tuple[str | None, str]]) -> str:
    """A model input: the prefix, then each field as ``name: value`` (bare when it has no name), spaced once."""
    parts = [prefix.strip()] if prefix.strip() else []
    return " ".join(parts + [f"{name}: {value.strip()}" if name else value.strip() for name, value in fields])


def score_text(examples: list[dict], outputs: list[str], labels: list[str]) -> dict:
    return {"bleu": bleu(outputs, [e["gold"] for e in examples], lowercase=False, tokenize="intl"),
            "exact": accuracy([e["gold"].strip() for e in examples], [o.strip() for o in outputs])}


def score_classes(examples: list[dict], outputs: list[str], labels: list[str]) -> dict:
    index = {name: i for i, name in enumerate(labels)}
    pred = [index.get(o.strip(), INVALID) for o in outputs]
    return {**classification_report([index[e["gold"]] for e in examples], pred, labels),
            "invalid": pred.count(INVALID) / max(1, len(pred))}


def score_number(examples: list[dict], outputs: list[str], labels: list[str]) -> dict:
    pred = [number(o) for o in outputs]
    return {**regression_report([e["gold"] for e in examples], [NOT_A_NUMBER if p is None else p for p in pred]),
            "invalid": pred.count(None) / max(1, len(pred))}


def score_answers(examples: list[dict], outputs: list[str], labels: list[str]) -> dict:
    scores = [answer_scores(o, e["gold"], "1.1") for e, o in zip(examples, outputs, strict=True)]
    return {"exact": sum(s[0] for s in scores) / max(1, len(scores)),
            "f1": sum(s[1] for s in scores) / max(1, len(scores)), "questions": len(scores)}


def text_target(task: TargetOptions, raw: str, where: str) -> tuple[str, str]:
    return raw, raw


def label_target(task: TargetOptions, raw: str, where: str) -> tuple[str, str]:
    """The label, or its word in ``label_words``, as both the answer and the gold class."""
    label = raw.strip()
    if task.label_words is None:
        return label, label
    if label not in task.label_words:
        raise SesameError(f"{where}: label {label!r} has no word in label_words {task.label_words}; add it")
    return str(task.label_words[label]), str(task.label_words[label])


def score_target(task: TargetOptions, raw: str, where: str) -> tuple[str, float]:
    """STS-B's answer (:func:`stsb_target`) and the unrounded gold score."""
    score = number(raw)
    if score is None:
        raise SesameError(f"{where}: {task.target_column!r} is {raw!r}, not a finite number; cast=regress needs "
                          "numeric targets")
    return stsb_target(score), score


def answers_target(task: TargetOptions, raw: list[str], where: str) -> tuple[str, list[str]]:
    """SQuAD: the first gold answer is the answer to learn; the metric takes the best over all of them."""
    return raw[0], raw


@dataclass(frozen=True)
class Cast:
    """How one kind of data becomes text-to-text: its input fields (default columns, in order; SQuAD's fields for
    ``squad``), whether the input names them (``name: value``), its default target column, the answer and gold
    value of a raw target (``target``), its metrics (the first picks the kept weights) and their scorer, and
    whether the answer is a label of a vocabulary (saved as labels.json)."""

    inputs: tuple[str, ...]
    named: bool
    column: str | None
    target: Callable[[TargetOptions, object, str], tuple[str, object]]
    metrics: tuple[str, ...]
    score: Callable[[list[dict], list[str], list[str]], dict]
    classes: bool = False
    squad: bool = False  # reads SQuAD JSON (question, context, answers) instead of columns


CLASS_METRICS = ("accuracy", "macro_f1", "mcc")
CASTS: dict[str, Cast] = {
    #           inputs                     named  column   target          metrics               scorer
    "text": Cast(("source",), False, "target", text_target, ("bleu", "exact"), score_text),
    "classify": Cast(("sentence",), True, "label", label_target, CLASS_METRICS, score_classes, classes=True),
    "pair": Cast(("sentence1", "sentence2"), True, "label", label_target, CLASS_METRICS, score_classes, classes=True),
    "regress": Cast(("sentence1", "sentence2"), True, "score", score_target, ("pearson", "spearman"), score_number),
    "span_qa": Cast(("question", "context"), True, None, answers_target, ("f1", "exact"), score_answers, squad=True),
}
LANGUAGES = re.compile(r"([^-./\s]+)-([^-./\s]+)")  # languages=en-de: the two files' suffixes


def parallel_lines(path: str, languages: str, labeled: bool) -> list[dict]:
    """Rows ``{"line", "source"[, "target"]}`` of a pair of parallel text files (``path`` with or without the source
    suffix), line i of one the translation of line i of the other; a blank line or a line count that differs is an
    error naming the file (and line)."""
    source, target = LANGUAGES.fullmatch(languages).groups()
    stem = path[: -len(source) - 1] if path.endswith(f".{source}") else path
    files = {"source": Path(f"{stem}.{source}")} | ({"target": Path(f"{stem}.{target}")} if labeled else {})
    lines = {}
    for side, file in files.items():
        text = read_text(file, "a text file, one sentence per line").split("\n")
        lines[side] = [line.rstrip("\r") for line in text[: -1 if text[-1] == "" else None]]
    if labeled and len(lines["source"]) != len(lines["target"]):
        raise SesameError(f"{files['source']} has {len(lines['source'])} lines but {files['target']} has "
                          f"{len(lines['target'])}; parallel files pair line i with line i: give both the same lines")
    for side, file in files.items():
        for i, line in enumerate(lines[side], 1):
            if not line.strip():
                raise SesameError(f"{file}:{i}: an empty {side} line; remove line {i} from both parallel files")
    return [{"line": i + 1, **{side: lines[side][i] for side in files}} for i in range(len(lines["source"]))]


def squad_rows(path: str, labeled: bool) -> list[dict]:
    """Rows ``{"id", "source": question, "pair": context[, "target": every gold answer]}`` of a SQuAD file
    (:meth:`SpanQA.read`, which checks it); a question without an answer (v2.0) is refused."""
    rows = []
    for question in SpanQA().read(path, labeled):
        if question.get("impossible"):
            raise SesameError(f"{path}: question {question['id']!r} has no answer (SQuAD v2.0); cast=span_qa reads "
                              "answerable questions (v1.1)")
        rows.append({"line": f"question {question['id']}", "id": question["id"], "source": question["question"],
                     "pair": question["context"],
                     **({"target": [a["text"] for a in question["answers"]]} if labeled else {})})
    return rows
