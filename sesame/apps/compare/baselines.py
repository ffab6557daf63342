"""The TF-IDF baseline of ``sesame compare``: word and character n-grams with logistic regression."""
from __future__ import annotations

import time

from ...metrics import classification_report
from ...pipelines.stages import LabeledFiles

C_GRID = (0.25, 1.0, 4.0, 16.0)  # logistic regression's inverse regularisation, picked on dev


def scores(report: dict) -> dict:
    """Accuracy and macro-F1 of a classification report, rounded as the tables keep them."""
    return {"accuracy": round(report["accuracy"], 6), "macro_f1": round(report["macro_f1"], 6)}


def tfidf_baseline(task: LabeledFiles, seed: int = 0) -> dict:
    """TF-IDF word 1–2-grams and character 2–5-grams (within words) → logistic regression.

    A text pair (u, v) is represented as InferSent's (u, v, |u − v|, u ∗ v) (Conneau et al. 2017, §3.3),
    one vectoriser fitted on both sides; the product (what the texts share) is L2-normalised, as its raw
    entries are too small for the regularised fit to use. The inverse regularisation C is the one of
    ``C_GRID`` with the best dev accuracy (the smallest on ties), so the dev score is slightly optimistic.
    Returns parameters (coefficients), C, seconds, and train and dev accuracy and macro-F1.
    """
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion
    from sklearn.preprocessing import normalize

    started = time.time()
    train, dev = task.read(task.train), task.read(task.dev)
    labels = sorted({row["label"] for row in train})
    y_train, y_dev = ([labels.index(row["label"]) for row in rows] for rows in (train, dev))
    features = FeatureUnion([
        ("word", TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)),
        ("char", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), min_df=2, sublinear_tf=True))])
    features.fit([row[side] for row in train for side in ("text", "pair")[:1 + bool(task.pair_column)]])

    def vectors(rows: list[dict]):
        first = features.transform([row["text"] for row in rows])
        if not task.pair_column:
            return first
        second = features.transform([row["pair"] for row in rows])
        return hstack([first, second, abs(first - second), normalize(first.multiply(second))]).tocsr()

    x_train, x_dev = vectors(train), vectors(dev)
    fits = [LogisticRegression(C=c, max_iter=3000, random_state=seed).fit(x_train, y_train) for c in C_GRID]
    best = max(fits, key=lambda model: model.score(x_dev, y_dev))
    return {"parameters": int(best.coef_.size + best.intercept_.size), "C": best.C,
            "seconds": round(time.time() - started, 3),
            "train": scores(classification_report(y_train, best.predict(x_train).tolist(), labels)),
            "dev": scores(classification_report(y_dev, best.predict(x_dev).tolist(), labels))}
