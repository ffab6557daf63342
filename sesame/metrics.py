"""Metrics: classification (accuracy, macro-F1, per-class precision/recall/F1, Matthews correlation),
regression (Pearson, Spearman) and language modelling. Correlations come from SciPy and scikit-learn."""
from __future__ import annotations

import math
from typing import Sequence


def classification_report(gold: Sequence[int], pred: Sequence[int], labels: Sequence[str]) -> dict:
    """Accuracy, macro-averaged F1, Matthews correlation (``mcc``, its multiclass form; CoLA's metric)
    and per-class precision/recall/F1/support (F1 = 2PR/(P+R), 0 when undefined). With two labels,
    ``f1`` is the F1 of the second one in sorted order: the positive class of 0/1 labels (MRPC's F1)."""
    from sklearn.metrics import matthews_corrcoef

    n = len(labels)
    tp, fp, fn = [0] * n, [0] * n, [0] * n
    for g, p in zip(gold, pred):
        if g == p:
            tp[g] += 1
        else:
            fp[p] += 1
            fn[g] += 1
    per_class = {}
    for i, name in enumerate(labels):
        precision = tp[i] / (tp[i] + fp[i]) if tp[i] + fp[i] else 0.0
        recall = tp[i] / (tp[i] + fn[i]) if tp[i] + fn[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[name] = {"precision": precision, "recall": recall, "f1": f1, "support": tp[i] + fn[i]}
    report = {
        "accuracy": sum(tp) / max(1, len(gold)),
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
