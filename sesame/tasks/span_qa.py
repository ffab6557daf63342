"""Extractive question answering (``span_qa``): a question and a context → the span of the context that
answers it, or (SQuAD v2.0) no answer.

Data: SQuAD JSON (Rajpurkar et al. 2016; v2.0 adds ``is_impossible`` questions, Rajpurkar et al. 2018):
``{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
[{"text", "answer_start"}], "is_impossible"}]}]}]}``.

Model (BERT, Devlin et al. 2019, §4.2-4.3): the input is ``cls question sep context sep`` (segments 0
then 1 for encoders; no segments for causal decoders, as :mod:`.classify` encodes pairs). A linear
layer on every final hidden state gives a start and an end logit; training minimises the sum of the
start and end cross-entropies, both softmaxes running over the context tokens and the no-answer
position alone. Contexts longer than the window are split as BERT's ``run_squad.py`` does: the
question keeps at most ``max_query_length`` tokens, windows of the context start ``doc_stride``
tokens apart, and a window that does not hold the whole (first) gold answer targets the no-answer
position, [CLS] at position 0 (for a causal decoder, whose position 0 sees nothing else, the final
separator: the one token that has read the whole input). A span may only start at a token in its
window of maximum context (``run_squad.py``'s ``_check_is_max_context``).

XLNet (``cls_last``, the family's; Yang et al. 2019, §3.3; its code's ``run_squad.py``) reads ``context <sep>
question <sep> <cls>`` (segments 0, 1, 2; the paragraph first, "because during pretraining, B is always shorter than
A"), no answer at the final ``<cls>``, with the linear start/end head above on the content stream (transformers'
``XLNetForQuestionAnsweringSimple``). Deviation: XLNet's beam-searched SQuAD head (end logits conditioned on the
start, answerability from ``<cls>``) is not built.

Decoding: over all windows of a question, the best span with end ≥ start and at most
``max_answer_length`` tokens among the top ``n_best`` start and top ``n_best`` end logits, scored
start + end; its text is the context between the tokens' character offsets. v2.0: the no-answer
score s_null = start[null] + end[null] is taken from the window where it is smallest, and the model
answers nothing when s_null − best span score > ``null_threshold`` (§4.3); :meth:`SpanQA.score`
tunes that threshold on the file it scores to maximise F1 and reports it as ``null_threshold``.

Metrics (:mod:`sesame.metrics`): the official evaluation scripts' exact match and token F1 after answer
normalisation, the maximum over the gold answers, averaged over questions (as fractions: × 100 gives the
official percentages).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..data.labeled import a_file, decode
from ..errors import SesameError
from ..metrics import answer_scores, tune_null_threshold
from ..models import Transformer
from ..tokenizer import SpecialIds, TextTokenizer
from .base import Task, TaskModel, pad, register, shown
from .qa_windows import answer_tokens, context_windows, max_context, trimmed_offsets, window_candidates

if TYPE_CHECKING:
    from ..families import Family

VERSIONS = ("auto", "1.1", "2.0")


# -- model -----------------------------------------------------------------------------------------

class SpanModel(TaskModel):
    """Backbone → linear layer → a start and an end logit per token (``[B, W, 2]``), as BERT's SQuAD
    head (no pooler, no extra dropout)."""

    def __init__(self, backbone: Transformer):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden, 2)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.backbone(batch["ids"], batch.get("types"), padding=batch["padding"]))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Σ over the batch of −log p(start) − log p(end), the softmaxes over the context tokens and the
        no-answer position (``allowed``)."""
        logits = self.outputs(batch).masked_fill(~batch["allowed"][..., None], float("-inf"))
        targets = batch["targets"]
        return (F.cross_entropy(logits[..., 0], targets[:, 0], reduction="sum")
                + F.cross_entropy(logits[..., 1], targets[:, 1], reduction="sum"))


# -- task ------------------------------------------------------------------------------------------

def _field(obj: object, key: str, kind: type | tuple[type, ...], where: str) -> object:
    """``obj[key]`` when it is of ``kind`` (a bool is not a number), else an error naming ``where``."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise SesameError(f"{where}: needs {key!r} ({names}); SQuAD JSON is {{\"data\": [{{\"title\", "
                          "\"paragraphs\": [{\"context\", \"qas\": [{\"id\", \"question\", \"answers\": "
                          "[{\"text\", \"answer_start\"}]}]}]}]}")
    return value


@register
@dataclass
class SpanQA(Task):
    """Extractive QA on SQuAD JSON. ``version`` "1.1" (every question has an answer), "2.0" (some have
    none), or "auto": decided by the first file read (its "version" field, or any ``is_impossible``)
    and then kept, so the run records it. ``null_threshold`` (v2.0): no answer when s_null − best span
    score exceeds it; None (the default until a run saves its tuned value) scores with the threshold
    tuned on the scored file and predicts with 0, BERT's default. ``cls_last``: XLNet's layout, context first and
    ``<cls>`` last (None: the family's inputs', :attr:`sesame.inputs.InputFormat.cls_last`, set by
    :meth:`for_family`)."""

    name: ClassVar[str] = "span_qa"
    select: ClassVar[str] = "f1"
    has_labels: ClassVar[bool] = False
    per_token: ClassVar[bool] = True
    head_drops: ClassVar[bool] = False  # BERT's SQuAD head: no dropout of its own
    windows: ClassVar[bool] = True  # a long context is read in windows doc_stride tokens apart
    version: str | float = "auto"  # auto, 1.1 or 2.0; a number (Python's 2.0) is read as its text
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_threshold: float | None = None
    cls_last: bool | None = None

    def __post_init__(self, where: str) -> None:
        self.version = str(self.version).lstrip("v")
        if self.version not in VERSIONS:
            raise SesameError(f"{where}: version={self.version}: choose one of {', '.join(VERSIONS)}")
        for key in ("doc_stride", "max_query_length", "max_answer_length", "n_best"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SesameError(f"{where}: {key}={value}: must be a positive whole number")
        if self.null_threshold is not None and not isinstance(self.null_threshold, (int, float)):
            raise SesameError(f"{where}: null_threshold={self.null_threshold}: must be a number")

    def for_family(self, family: Family | None) -> None:
        """``cls_last`` not given: the family's; an explicit ``--task-option cls_last=...`` is kept."""
        if self.cls_last is None:
            self.cls_last = bool(family and family.inputs.cls_last)

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        return ("f1", "exact")

    def read(self, path: str, labeled: bool = True) -> list[dict]:
        """One example per question: ``id``, ``title``, ``question``, ``context`` and, when ``labeled``,
        ``answers`` (``text``, ``start``) and ``impossible``. Every answer must sit at its answer_start."""
        try:
            raw = json.loads(decode(a_file(path, "a SQuAD JSON file").read_bytes(), str(path)))
        except json.JSONDecodeError as err:
            raise SesameError(f"{path}: not a SQuAD JSON file ({err})") from None
        articles = _field(raw, "data", list, str(path))
        v2_file = str(raw.get("version", "")).lstrip("v").startswith("2")
        examples, seen = [], {}
        for a, article in enumerate(articles):
            title = article.get("title", f"#{a + 1}") if isinstance(article, dict) else f"#{a + 1}"
            for paragraph in _field(article, "paragraphs", list, f"{path}: article {title!r}"):
                context = _field(paragraph, "context", str, f"{path}: article {title!r}")
                for qa in _field(paragraph, "qas", list, f"{path}: article {title!r}"):
                    qid = str(_field(qa, "id", (str, int), f"{path}: a question of article {title!r}"))
                    where = f"{path}: question {qid!r} (article {title!r})"
                    if qid in seen:
                        raise SesameError(f"{where}: the id is used before (article {seen[qid]!r}); ids must be unique")
                    seen[qid] = title
                    example = {"id": qid, "title": title, "question": _field(qa, "question", str, where),
                               "context": context}
                    v2_file = v2_file or "is_impossible" in qa
                    if labeled:
                        example.update(self._answers(qa, context, where))
                    examples.append(example)
        if not examples:
            raise SesameError(f"{path}: no questions; SQuAD JSON lists them under data → paragraphs → qas")
        if self.version == "auto":
            self.version = "2.0" if v2_file else "1.1"
        return examples

    def example_of(self, value: object, where: str) -> dict:
        """``{"question", "context"}`` with an optional ``id``, as a question of a SQuAD file reads."""
        texts = isinstance(value, dict) and all(isinstance(value.get(k), str) and value[k].strip()
                                                for k in ("question", "context"))
        qid = value.get("id", "") if isinstance(value, dict) else None
        if not texts or not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise SesameError(f"{where}: --task {self.name} reads {{\"question\": \"...\", \"context\": \"...\"}} per "
                              f"input (and an optional \"id\"), not {shown(value)}")
        return {"question": value["question"], "context": value["context"], **({"id": str(qid)} if "id" in value
                                                                                else {})}

    def _answers(self, qa: dict, context: str, where: str) -> dict:
        impossible = qa.get("is_impossible", False) is True
        answers = qa.get("answers") or []
        if impossible and self.version == "1.1":
            raise SesameError(f"{where}: is_impossible (a SQuAD v2.0 question) but the task reads v1.1; "
                              "use --task-option version=2.0")
        if impossible and answers:
            raise SesameError(f"{where}: is_impossible yet has answers; give \"answers\": [] (v2.0 keeps the "
                              "unanswerable question's candidates under \"plausible_answers\")")
        if not impossible and not answers:
            raise SesameError(f"{where}: no answers; give \"answers\": [{{\"text\", \"answer_start\"}}], or "
                              "\"is_impossible\": true for SQuAD v2.0")
        gold = []
        for answer in answers:
            text = _field(answer, "text", str, where)
            start = _field(answer, "answer_start", int, where)
            found = context[start: start + len(text)] if start >= 0 else ""
            if not text.strip() or found != text:
                raise SesameError(f"{where}: answer {text!r} is not at answer_start {start} of its context "
                                  f"(the context has {found!r} there); fix answer_start or the answer text")
            gold.append({"text": text, "start": start})
        return {"answers": gold, "impossible": impossible}

    def features(self, examples: list[dict], tok: TextTokenizer, max_length: int, labels: list[str],
                 causal: bool) -> list[dict]:
        """Windows of each example (:meth:`layout`): ``ids``, ``types`` (encoders), ``context_start`` (position of the
        first context token), ``offsets`` (characters of each context token), ``max_context``, ``null`` (the
        no-answer position) and, for labeled examples, ``target`` (start, end positions)."""
        questions = tok.encodings([e["question"] for e in examples], special=False)
        contexts = list(dict.fromkeys(e["context"] for e in examples))
        encoded = {c: (e.ids, trimmed_offsets(c, e.offsets))
                   for c, e in zip(contexts, tok.encodings(contexts, special=False))}
        features = []
        for i, example in enumerate(examples):
            question = questions[i].ids[: self.max_query_length]
            room = max_length - len(question) - 3
            if room < 1:
                raise SesameError(f"--max-length {max_length}: no room for the context after a question of "
                                  f"{len(question)} tokens; raise --max-length or lower max_query_length")
            ids, offsets = encoded[example["context"]]
            answer = self._answer_tokens(example, offsets) if "answers" in example else None
            windows = context_windows(len(ids), room, self.doc_stride)
            for (start, length), best in zip(windows, max_context(windows)):
                feature = {"example": i, **self.layout(question, ids[start: start + length], tok.specials, causal),
                           "offsets": offsets[start: start + length], "max_context": best}
                k = feature["context_start"]
                if "answers" in example:
                    inside = answer is not None and start <= answer[0] and answer[1] < start + length
                    feature["target"] = ((k + answer[0] - start, k + answer[1] - start) if inside
                                         else (feature["null"], feature["null"]))
                features.append(feature)
        return features

    def layout(self, question: list[int], context: list[int], specials: SpecialIds, causal: bool) -> dict:
        """One window's ``ids``, ``types`` (not for causal decoders), ``context_start`` and ``null`` (module doc)."""
        cls, sep = specials.cls, specials.sep
        if self.cls_last:
            ids = [*context, sep, *question, sep, cls]
            types = [0] * (len(context) + 1) + [1] * (len(question) + 1) + [2]
            window = {"ids": ids, "context_start": 0, "null": len(ids) - 1}
        else:
            ids = [cls, *question, sep, *context, sep]
            types = [0] * (len(question) + 2) + [1] * (len(context) + 1)
            window = {"ids": ids, "context_start": len(question) + 2, "null": len(ids) - 1 if causal else 0}
        return window if causal else {**window, "types": types}

    def _answer_tokens(self, example: dict, offsets: list[tuple[int, int]]) -> tuple[int, int] | None:
        """The context tokens of the first gold answer (BERT trains on it), None when unanswerable."""
        if example["impossible"]:
            return None
        first = example["answers"][0]
        tokens = answer_tokens(offsets, first["start"], first["start"] + len(first["text"]))
        if tokens is None:
            raise SesameError(f"question {example['id']!r} (article {example.get('title')!r}): the answer "
                              f"{first['text']!r} covers no token of the context")
        return tokens

    def collate(self, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        ids = pad([f["ids"] for f in features], pad_id)
        lengths = torch.tensor([len(f["ids"]) for f in features])
        allowed = torch.zeros_like(ids, dtype=torch.bool)
        for row, f in enumerate(features):
            allowed[row, f["context_start"]: f["context_start"] + len(f["offsets"])] = True
            allowed[row, f["null"]] = True
        batch = {"ids": ids, "padding": torch.arange(ids.shape[1]) < lengths[:, None], "allowed": allowed}
        if "types" in features[0]:
            batch["types"] = pad([f["types"] for f in features], 0)
        if "target" in features[0]:
            batch["targets"] = torch.tensor([f["target"] for f in features])
            batch["counts"] = {"loss": len(features)}  # one start + end loss per window
        return batch

    def build(self, backbone: Transformer, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        return SpanModel(backbone)

    def decode(self, examples: list[dict], features: list[dict], outputs: torch.Tensor) -> list[dict]:
        """Per example: the best span (``best``: text, score, start character; None without one), its
        n-best list, and ``null_score`` (v2.0: the smallest s_null over its windows)."""
        windows: list[list[int]] = [[] for _ in examples]
        for j, feature in enumerate(features):
            windows[feature["example"]].append(j)
        decoded = []
        for example, rows in zip(examples, windows):
            candidates, null = [], math.inf
            for j in rows:
                logits = outputs[j, : len(features[j]["ids"])].tolist()
                candidates += window_candidates(example["context"], features[j], logits, self.n_best,
                                                self.max_answer_length)
                null = min(null, sum(logits[features[j]["null"]]))
            unique = {}
            for candidate in sorted(candidates, key=lambda c: -c["score"]):
                unique.setdefault(candidate["text"], candidate)
            n_best = list(unique.values())[: self.n_best]
            decoded.append({"best": n_best[0] if n_best else None, "n_best": n_best,
                            "null_score": null if self.version == "2.0" else None})
        return decoded

    def _answer(self, decoded: dict, threshold: float | None) -> str:
        """The best span's text, or "" when there is none or (v2.0) s_null − its score > threshold."""
        best = decoded["best"]
        if best is None or threshold is not None and decoded["null_score"] - best["score"] > threshold:
            return ""
        return best["text"]

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        """``exact`` and ``f1``; v2.0 also ``null_threshold`` (the saved one, else the one tuned here),
        ``best_null_threshold`` and ``best_f1`` (tuned on this file), and F1 / exact match over the
        answerable (``has_answer_*``) and unanswerable (``no_answer_*``) questions."""
        decoded = self.decode(examples, features, outputs)
        golds = [[a["text"] for a in e["answers"]] for e in examples]
        if self.version != "2.0":
            scores = [answer_scores(self._answer(d, None), g, "1.1") for d, g in zip(decoded, golds)]
            return {"exact": sum(s[0] for s in scores) / len(scores), "f1": sum(s[1] for s in scores) / len(scores),
                    "questions": len(scores)}
        diffs = [None if d["best"] is None else d["null_score"] - d["best"]["score"] for d in decoded]
        answered = [answer_scores(self._answer(d, math.inf), g, "2.0")[1] for d, g in zip(decoded, golds)]
        unanswered = [answer_scores("", g, "2.0")[1] for g in golds]
        tuned, best_f1 = tune_null_threshold(diffs, answered, unanswered)
        threshold = tuned if self.null_threshold is None else float(self.null_threshold)
        scores = [answer_scores(self._answer(d, threshold), g, "2.0") for d, g in zip(decoded, golds)]
        report = {"exact": sum(s[0] for s in scores) / len(scores), "f1": sum(s[1] for s in scores) / len(scores),
                  "null_threshold": threshold, "best_null_threshold": tuned, "best_f1": best_f1,
                  "questions": len(scores)}
        for name, keep in (("has_answer", False), ("no_answer", True)):
            part = [s for s, e in zip(scores, examples) if e["impossible"] == keep]
            if part:
                report[f"{name}_exact"] = sum(s[0] for s in part) / len(part)
                report[f"{name}_f1"] = sum(s[1] for s in part) / len(part)
        return report

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        """``{"id", "answer", "n_best": [{"text", "probability", "score", "start"}]}``, probabilities a
        softmax over the n-best scores (BERT); v2.0 adds ``null_score_diff`` and the no-answer entry
        (text "") to the n-best list."""
        threshold = (self.null_threshold or 0.0) if self.version == "2.0" else None
        out = []
        for i, (example, decoded) in enumerate(zip(examples, self.decode(examples, features, outputs))):
            entries = [dict(c) for c in decoded["n_best"]]
            result = {"id": str(example.get("id", i)), "answer": self._answer(decoded, threshold)}
            if threshold is not None:
                entries = sorted(entries + [{"text": "", "score": decoded["null_score"], "start": -1}],
                                 key=lambda c: -c["score"])
                best = decoded["best"]
                result["null_score_diff"] = None if best is None else round(decoded["null_score"] - best["score"], 6)
            if entries:
                probabilities = torch.tensor([c["score"] for c in entries]).softmax(0).tolist()
                for entry, p in zip(entries, probabilities):
                    entry.update(score=round(entry["score"], 6), probability=round(p, 6))
            result["n_best"] = entries
            out.append(result)
        return out

    def write(self, examples: list[dict], predictions: list[dict], path: str | Path) -> None:
        """``{question id: answer text}`` ("" for no answer): what the official evaluation scripts read."""
        with open(path, "w", encoding="utf-8") as out:
            json.dump({p["id"]: p["answer"] for p in predictions}, out, ensure_ascii=False, indent=1)
            out.write("\n")
