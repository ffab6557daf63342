"""Metrics, one section per family: counts (accuracy, precision/recall/F1), classification (macro-F1,
per-class scores, Matthews correlation), regression (Pearson, Spearman), language modelling (perplexity,
bits per byte and per character), entity F1 (conlleval), extractive QA (SQuAD's EM and F1), translation
(sacreBLEU) and the spread of a score over draws. Correlations come from SciPy and scikit-learn.
"""
from __future__ import annotations

import math
import re
import statistics
import string
from collections import Counter, defaultdict
from typing import Sequence


# -- counts ----------------------------------------------------------------------------------------

def accuracy(gold: Sequence, predicted: Sequence) -> float:
    """The share of items whose prediction equals the gold answer (0 for no items)."""
    return sum(g == p for g, p in zip(gold, predicted, strict=True)) / max(1, len(gold))


def precision_recall_f1(correct: int, gold: int, predicted: int) -> dict:
    """P = correct / predicted, R = correct / gold, F1 = 2PR / (P + R), each 0 when undefined."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


# -- classification and regression -----------------------------------------------------------------

def classification_report(gold: Sequence[int], pred: Sequence[int], labels: Sequence[str]) -> dict:
    """Accuracy, macro-averaged F1, Matthews correlation (``mcc``, its multiclass form; CoLA's metric)
    and per-class precision/recall/F1/support (F1 = 2PR/(P+R), 0 when undefined). With two labels,
    ``f1`` is the F1 of the second one in sorted order: the positive class of 0/1 labels (MRPC's F1).
    A prediction of -1 names no class (a generated answer that is no label, :mod:`sesame.tasks.text2text`): it is
    wrong, a miss of its gold class and no class's false positive; MCC counts it as a class of its own."""
    from sklearn.metrics import matthews_corrcoef

    n = len(labels)
    tp, fp, fn = [0] * n, [0] * n, [0] * n
    for g, p in zip(gold, pred):
        if g == p:
            tp[g] += 1
        else:
            if p >= 0:
                fp[p] += 1
            fn[g] += 1
    per_class = {name: {**precision_recall_f1(tp[i], tp[i] + fn[i], tp[i] + fp[i]), "support": tp[i] + fn[i]}
                 for i, name in enumerate(labels)}
    report = {
        "accuracy": accuracy(gold, pred),
        "macro_f1": sum(c["f1"] for c in per_class.values()) / max(1, n),
        "mcc": float(matthews_corrcoef(gold, pred)) if gold else 0.0,
    }
    if n == 2:
        report["f1"] = per_class[labels[1]]["f1"]
    return {**report, "per_class": per_class, "n": len(gold)}


def regression_report(gold: Sequence[float], pred: Sequence[float]) -> dict:
    """Pearson and Spearman correlations (STS-B's metrics; 0 when a side is constant) and mean squared error."""
    import numpy as np
    from scipy.stats import pearsonr, spearmanr

    g, p = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
    varies = len(g) > 1 and g.std() > 0 and p.std() > 0
    return {"pearson": float(pearsonr(g, p)[0]) if varies else 0.0,
            "spearman": float(spearmanr(g, p)[0]) if varies else 0.0,
            "mse": float(((g - p) ** 2).mean()) if len(g) else 0.0, "n": len(g)}


# -- language modelling ----------------------------------------------------------------------------

def language_model_report(loss_sum: float, count: int, size: dict | None = None) -> dict:
    """Mean loss (nats per predicted token) and perplexity = exp(loss), which depend on how the text was cut
    into tokens; with the text's ``size`` ({"bytes": B, "chars": C}), bits per byte = Σ nats / (B ln 2) and
    bits per character = Σ nats / (C ln 2), which do not: the same text costs the same bits whatever the
    tokenizer (docs/decoders.md)."""
    loss = loss_sum / max(1, count)
    report = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "tokens": count}
    if size and size.get("bytes"):
        report["bits_per_byte"] = loss_sum / (math.log(2) * size["bytes"])
        report["bits_per_char"] = loss_sum / (math.log(2) * size["chars"])
    return report


def format_classification(report: dict) -> str:
    lines = [f"accuracy  {report['accuracy']:.4f}", f"macro-F1  {report['macro_f1']:.4f}   (n = {report['n']})",
             f"MCC       {report['mcc']:.4f}", "",
             f"{'label':<20}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}"]
    for name, c in report["per_class"].items():
        lines.append(f"{name:<20}{c['precision']:>10.4f}{c['recall']:>10.4f}{c['f1']:>10.4f}{c['support']:>10}")
    return "\n".join(lines)


# -- entity F1: the CoNLL-2000/2003 conlleval script (Tjong Kim Sang & Buchholz 2000) ----------------

def split_tag(tag: str) -> tuple[str, str]:
    """conlleval's split at the first hyphen: ``B-PER`` → (``B``, ``PER``); ``O`` → (``O``, ``""``)."""
    head, hyphen, kind = tag.partition("-")
    return (head, kind) if hyphen else (tag, "")


def chunk_end(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's ``endOfChunk``: does a chunk end between the previous word and this one?"""
    return ((prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
            or (prev_tag not in ("O", ".") and prev_type != type_) or prev_tag in ("[", "]"))


def chunk_start(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's ``startOfChunk``: does a chunk start at this word?"""
    return ((prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}
            or (tag not in ("O", ".") and prev_type != type_) or tag in ("[", "]"))


def conll_report(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """conlleval's counts over sentences of gold and predicted tags: entity precision, recall and F1
    (0 when undefined), token accuracy, and the same per entity type. As in the script, the sentences
    form one stream, each followed by a break read as an ``O`` that is not a token."""
    found_gold: dict[str, int] = defaultdict(int)
    found_pred: dict[str, int] = defaultdict(int)
    correct: dict[str, int] = defaultdict(int)
    correct_tags = tokens = 0
    last_g, last_gt, last_p, last_pt = "O", "", "O", ""
    in_correct = False
    for g_sentence, p_sentence in zip(gold, predicted, strict=True):
        if len(g_sentence) != len(p_sentence):
            raise ValueError(f"a sentence of {len(g_sentence)} gold tags has {len(p_sentence)} predicted ones")
        for position, (g_tag, p_tag) in enumerate([*zip(g_sentence, p_sentence), ("O", "O")]):
            (g, gt), (p, pt) = split_tag(g_tag), split_tag(p_tag)
            g_end, p_end = chunk_end(last_g, g, last_gt, gt), chunk_end(last_p, p, last_pt, pt)
            if in_correct:
                if g_end and p_end and last_pt == last_gt:
                    in_correct = False
                    correct[last_gt] += 1
                elif g_end != p_end or pt != gt:
                    in_correct = False
            g_start, p_start = chunk_start(last_g, g, last_gt, gt), chunk_start(last_p, p, last_pt, pt)
            if g_start and p_start and pt == gt:
                in_correct = True
            if g_start:
                found_gold[gt] += 1
            if p_start:
                found_pred[pt] += 1
            if position < len(g_sentence):  # a word, not the sentence break
                correct_tags += (g, gt) == (p, pt)
                tokens += 1
            last_g, last_gt, last_p, last_pt = g, gt, p, pt
    if in_correct:
        correct[last_gt] += 1
    types = sorted(set(found_gold) | set(found_pred))
    return {**precision_recall_f1(sum(correct.values()), sum(found_gold.values()), sum(found_pred.values())),
            "accuracy": correct_tags / tokens if tokens else 0.0,
            "entities": sum(found_gold.values()), "predicted_entities": sum(found_pred.values()),
            "correct_entities": sum(correct.values()), "tokens": tokens,
            "per_type": {t: {**precision_recall_f1(correct[t], found_gold[t], found_pred[t]), "support": found_gold[t]}
                         for t in types}}


# -- extractive QA: SQuAD's official evaluate-v1.1.py and evaluate-v2.0.py ---------------------------

PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (SQuAD's
    ``normalize_answer``, in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, empty_match: bool = False) -> float:
    """F1 of the normalised tokens' multiset overlap. With ``empty_match`` (v2.0's script) an answer
    that normalises to nothing scores 1 against a gold that does too and 0 otherwise; v1.1's script
    scores such pairs 0."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if empty_match and (not pred or not ref):
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    return precision_recall_f1(same, len(ref), len(pred))["f1"]


def answer_scores(prediction: str, golds: list[str], version: str) -> tuple[float, float]:
    """(exact match, F1) of one prediction: the maximum over the gold answers. v2.0 drops golds that
    normalise to nothing and scores an unanswerable question against the one gold ``""``."""
    if version == "2.0":
        golds = [g for g in golds if normalize_answer(g)] or [""]
    return (max(exact_match(prediction, g) for g in golds),
            max(token_f1(prediction, g, version == "2.0") for g in golds))


def tune_null_threshold(diffs: list[float | None], answered: list[float], unanswered: list[float]
                        ) -> tuple[float, float]:
    """The threshold t maximising the mean score when question i gets no answer iff diffs[i] > t
    (diffs: s_null − best span score; ``answered``/``unanswered``: each question's score either way),
    as the official v2.0 script's ``find_best_thresh`` searches it: t is the diff of the last question
    still answered (ties move together), or below every diff when answering nothing is best.
    Questions without a candidate span (diff None) get no answer whatever t is. Returns (t, mean score)."""
    total = best = sum(unanswered)
    threshold = None
    order = sorted((d, a - u) for d, a, u in zip(diffs, answered, unanswered) if d is not None)
    i = 0
    while i < len(order):
        diff = order[i][0]
        while i < len(order) and order[i][0] == diff:
            total += order[i][1]
            i += 1
        if total > best:
            best, threshold = total, diff
    if threshold is None:
        threshold = order[0][0] - 1.0 if order else 0.0
    return threshold, best / max(1, len(unanswered))


# -- translation -----------------------------------------------------------------------------------

def bleu(hypotheses: Sequence[str], references: Sequence[str], *, lowercase: bool = True,
         tokenize: str = "13a") -> float:
    """sacrebleu corpus BLEU (exponential smoothing) of the outputs against raw references; by default with 13a
    tokenisation, case-insensitive (CoVe's lower-cased output); T5 scores cased with ``intl`` tokenisation
    (``lowercase=False, tokenize="intl"``, its ``t5.evaluation.metrics.bleu``)."""
    import sacrebleu

    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)], lowercase=lowercase, tokenize=tokenize,
                                 force=True).score


# -- spread over draws -----------------------------------------------------------------------------

def spread(values: Sequence[float]) -> dict:
    """Mean, sample standard deviation (0 for one value), minimum and maximum of a score over draws, e.g. of
    few-shot accuracy over draws of demonstrations (Zhao et al. 2021 show how much it varies)."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}
