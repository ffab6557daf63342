"""The peer side of the task comparison: a plain PyTorch loop over transformers' own heads, one per task.

Written from transformers' documented usage and the task papers, independently of sesame's tasks: its
own readers, encoders, heads (``AutoModelFor…``), scheduler (``get_linear_schedule_with_warmup``) and
scorers (scikit-learn and SciPy for GLUE, ``seqeval`` for CoNLL, the official SQuAD v1.1
normalisation below), so that agreement with sesame says something about both.

* classify / pair / regress: ``AutoModelForSequenceClassification`` (BERT's pooler, dropout, a linear
  layer; ``num_labels=1`` is regression with MSE), inputs ``[CLS] a [SEP] (b [SEP])`` truncated
  longest-first.
* tag: ``AutoModelForTokenClassification``; a word's label sits on its first sub-word, the others are
  ignored (-100), as in BERT §5.3; entity F1 by ``seqeval`` (conlleval's rules in its default mode).
* span_qa: ``AutoModelForQuestionAnswering`` on windows of ``max_length`` tokens overlapping by
  ``stride`` tokens (``truncation="only_second"``, transformers' run_qa.py convention); the answer is
  the best start/end pair over all windows (n-best 20, at most 30 tokens), mapped back through offsets.
* multiple_choice: ``AutoModelForMultipleChoice``, each ``[CLS] context [SEP] choice [SEP]`` scored on
  its own, a softmax across the choices.

Training: AdamW (weight decay on all but biases and LayerNorm weights), linear warmup then linear decay,
gradient clipping at 1.0, shuffled batches padded to their longest member, and a dev evaluation after
every epoch; the best epoch by the task's metric is kept.
"""
from __future__ import annotations

import collections
import csv
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef


@dataclass(kw_only=True)
class Settings:
    """What both sides share: the optimisation and the input length."""
    epochs: int
    lr: float
    max_length: int
    batch_size: int = 32
    seed: int = 0
    warmup: float = 0.1
    weight_decay: float = 0.01
    clip: float = 1.0
    stride: int = 128  # span_qa: tokens shared by neighbouring windows
    eval_batch: int = 64


# -- readers ---------------------------------------------------------------------------------------------

def read_table(path: Path, columns: dict[str, str]) -> list[dict]:
    """Rows of a CSV (quoted) or TSV (GLUE: tabs, no quoting) file; ``columns`` maps a field to its column name,
    or to its position when the file has no header (CoLA)."""
    tsv = path.suffix == ".tsv"
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL))
    if all(c.isdigit() for c in columns.values()):
        return [{k: row[int(c)] for k, c in columns.items()} for row in rows]
    header = rows.pop(0)
    at = {k: header.index(c) for k, c in columns.items()}
    return [{k: row[i] for k, i in at.items()} for row in rows]


def read_conll(path: Path) -> list[dict]:
    """Sentences of a CoNLL-2003 file: words (first column) and tags (last column); -DOCSTART- lines skipped."""
    sentences, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                sentences.append({"words": words, "tags": tags})
            words, tags = [], []
            continue
        words.append(parts[0])
        tags.append(parts[-1])
    return sentences


def read_squad(path: Path) -> list[dict]:
    """Questions of a SQuAD v1.1 file with their context, answers and the first answer's character start."""
    out = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                out.append({"id": qa["id"], "question": qa["question"], "context": paragraph["context"],
                            "answers": [a["text"] for a in qa["answers"]],
                            "start": qa["answers"][0]["answer_start"], "answer": qa["answers"][0]["text"]})
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# -- scorers ---------------------------------------------------------------------------------------------

def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 evaluation's normalisation: lower case, no punctuation, articles or extra spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_scores(prediction: str, golds: list[str]) -> tuple[float, float]:
    """(exact match, token F1), each the maximum over the gold answers, as the official script computes them."""
    def f1(gold: str) -> float:
        p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
        same = sum((collections.Counter(p) & collections.Counter(g)).values())
        if same == 0:
            return 0.0
        precision, recall = same / len(p), same / len(g)
        return 2 * precision * recall / (precision + recall)
    return (max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds),
            max(f1(g) for g in golds))


# -- tasks -----------------------------------------------------------------------------------------------

class Job:
    """One task: how to read its files, encode them, batch them, and score the model's dev outputs."""
    auto = "AutoModelForSequenceClassification"

    def __init__(self, train: Path, dev: Path, options: dict):
        self.options = options
        self.train_rows, self.dev_rows = self.read(train), self.read(dev)

    def read(self, path: Path) -> list[dict]:
        raise NotImplementedError

    def model_kwargs(self) -> dict:
        return {}

    def encode(self, tok, rows: list[dict], s: Settings, train: bool) -> list[dict]:
        raise NotImplementedError

    def collate(self, tok, features: list[dict]) -> dict[str, torch.Tensor]:
        keep = [{k: v for k, v in f.items() if k in ("input_ids", "token_type_ids", "attention_mask", "labels")}
                for f in features]
        return tok.pad(keep, return_tensors="pt")

    def score(self, features: list[dict], outputs: list) -> dict:
        raise NotImplementedError


class Sequence(Job):
    """classify and pair (``pair`` option: the second text's column); ``regress`` for a number."""

    def __init__(self, train: Path, dev: Path, options: dict, *, regress: bool = False):
        self.regress = regress
        super().__init__(train, dev, options)
        self.labels = [] if regress else sorted({r["label"] for r in self.train_rows})

    def read(self, path: Path) -> list[dict]:
        columns = {"text": self.options["text"], "label": self.options["label"]}
        if self.options.get("pair"):
            columns["pair"] = self.options["pair"]
        return read_table(path, columns)

    def model_kwargs(self) -> dict:
        return {"num_labels": 1 if self.regress else len(self.labels)}

    def encode(self, tok, rows, s, train):
        pairs = [r["pair"] for r in rows] if "pair" in rows[0] else None
        enc = tok([r["text"] for r in rows], pairs, truncation=True, max_length=s.max_length)
        labels = [float(r["label"]) if self.regress else self.labels.index(r["label"]) for r in rows]
        return [{**{k: enc[k][i] for k in enc}, "labels": y} for i, y in enumerate(labels)]

    def collate(self, tok, features):
        batch = super().collate(tok, features)
        batch["labels"] = batch["labels"].float() if self.regress else batch["labels"].long()
        return batch

    def score(self, features, outputs):
        logits = torch.cat(outputs)
        gold = [f["labels"] for f in features]
        if self.regress:
            pred = logits.squeeze(-1).tolist()
            return {"pearson": float(pearsonr(gold, pred)[0]), "spearman": float(spearmanr(gold, pred)[0])}
        pred = logits.argmax(-1).tolist()
        out = {"accuracy": float(np.mean(np.array(gold) == np.array(pred))), "mcc": float(matthews_corrcoef(gold, pred))}
        if len(self.labels) == 2:
            out["f1"] = float(f1_score(gold, pred, pos_label=1))
        return out


class Tag(Job):
    auto = "AutoModelForTokenClassification"

    def __init__(self, train, dev, options):
        super().__init__(train, dev, options)
        self.labels = sorted({t for r in self.train_rows for t in r["tags"]})

    def read(self, path):
        return read_conll(path)

    def model_kwargs(self):
        return {"num_labels": len(self.labels)}

    def encode(self, tok, rows, s, train):
        enc = tok([r["words"] for r in rows], is_split_into_words=True, truncation=True, max_length=s.max_length)
        features = []
        for i, row in enumerate(rows):
            words, labels, previous = enc.word_ids(i), [], None
            for w in words:
                labels.append(-100 if w is None or w == previous else self.labels.index(row["tags"][w]))
                previous = w
            features.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                             "attention_mask": enc["attention_mask"][i], "labels": labels, "row": i,
                             "words": words})
        return features

    def collate(self, tok, features):
        labels = [f["labels"] for f in features]
        batch = super().collate(tok, [{k: v for k, v in f.items() if k != "labels"} for f in features])
        width = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        return batch

    def score(self, features, outputs):
        from seqeval.metrics import accuracy_score, f1_score as entity_f1

        predicted = [p for batch in outputs for p in batch.argmax(-1).tolist()]
        gold_tags, pred_tags = [], []
        for f, pred in zip(features, predicted):
            tags = self.dev_rows[f["row"]]["tags"]
            guess = ["O"] * len(tags)  # words cut off by truncation count as O
            previous = None
            for position, w in enumerate(f["words"]):
                if w is not None and w != previous:
                    guess[w] = self.labels[pred[position]]
                previous = w
            gold_tags.append(tags)
            pred_tags.append(guess)
        return {"f1": float(entity_f1(gold_tags, pred_tags)), "accuracy": float(accuracy_score(gold_tags, pred_tags))}


class SpanQA(Job):
    auto = "AutoModelForQuestionAnswering"
    n_best, max_answer = 20, 30

    def read(self, path):
        return read_squad(path)

    def encode(self, tok, rows, s, train):
        enc = tok([r["question"] for r in rows], [r["context"] for r in rows], truncation="only_second",
                  max_length=s.max_length, stride=s.stride, return_overflowing_tokens=True,
                  return_offsets_mapping=True)
        features = []
        for i, row_index in enumerate(enc["overflow_to_sample_mapping"]):
            row, sequence = rows[row_index], enc.sequence_ids(i)
            offsets = [o if sequence[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])]
            feature = {"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                       "attention_mask": enc["attention_mask"][i], "row": row_index, "offsets": offsets}
            if train:
                first, end_char = row["start"], row["start"] + len(row["answer"])
                inside = [k for k, o in enumerate(offsets) if o is not None]
                if offsets[inside[0]][0] <= first and offsets[inside[-1]][1] >= end_char:
                    start = next(k for k in inside if offsets[k][1] > first)
                    end = max(k for k in inside if offsets[k][0] < end_char)
                else:
                    start = end = 0  # the answer is not in this window: point at [CLS]
                feature.update(start_positions=start, end_positions=end)
            features.append(feature)
        return features

    def collate(self, tok, features):
        batch = super().collate(tok, features)
        if "start_positions" in features[0]:
            batch["start_positions"] = torch.tensor([f["start_positions"] for f in features])
            batch["end_positions"] = torch.tensor([f["end_positions"] for f in features])
        return batch

    def score(self, features, outputs):
        starts = [s for batch in outputs for s in batch[0].tolist()]
        ends = [e for batch in outputs for e in batch[1].tolist()]
        best: dict[int, tuple[float, str]] = {}
        for f, start_logits, end_logits in zip(features, starts, ends):
            context, offsets = self.dev_rows[f["row"]]["context"], f["offsets"]
            top_start = np.argsort(start_logits[: len(offsets)])[::-1][: self.n_best]  # the batch's padding cut off
            top_end = np.argsort(end_logits[: len(offsets)])[::-1][: self.n_best]
            for a in top_start:
                for b in top_end:
                    if offsets[a] is None or offsets[b] is None or b < a or b - a + 1 > self.max_answer:
                        continue
                    value = start_logits[a] + end_logits[b]
                    if f["row"] not in best or value > best[f["row"]][0]:
                        best[f["row"]] = (value, context[offsets[a][0]: offsets[b][1]])
        scores = [squad_scores(best.get(i, (0.0, ""))[1], row["answers"]) for i, row in enumerate(self.dev_rows)]
        return {"exact": float(np.mean([s[0] for s in scores])), "f1": float(np.mean([s[1] for s in scores]))}


class MultipleChoice(Job):
    auto = "AutoModelForMultipleChoice"

    def read(self, path):
        return read_jsonl(path)

    def encode(self, tok, rows, s, train):
        features = []
        for row in rows:
            enc = tok([row["context"]] * len(row["choices"]), row["choices"], truncation=True, max_length=s.max_length)
            features.append({"choices": [{k: enc[k][c] for k in enc} for c in range(len(row["choices"]))],
                             "labels": row["label"]})
        return features

    def collate(self, tok, features):
        n = len(features[0]["choices"])
        flat = tok.pad([c for f in features for c in f["choices"]], return_tensors="pt")
        batch = {k: v.view(len(features), n, -1) for k, v in flat.items()}
        batch["labels"] = torch.tensor([f["labels"] for f in features])
        return batch

    def score(self, features, outputs):
        pred = torch.cat(outputs).argmax(-1).tolist()
        return {"accuracy": float(np.mean([p == f["labels"] for p, f in zip(pred, features)]))}


def make_job(task: str, train: Path, dev: Path, options: dict) -> Job:
    if task in ("classify", "pair", "regress"):
        return Sequence(train, dev, options, regress=task == "regress")
    return {"tag": Tag, "span_qa": SpanQA, "multiple_choice": MultipleChoice}[task](train, dev, options)


# -- the loop --------------------------------------------------------------------------------------------

def fine_tune(model_dir: str | Path, job: Job, s: Settings, *, select: str,
              log: Callable[[str], None] = print) -> dict:
    """Fine-tune ``model_dir`` on ``job`` with settings ``s``; the dev metrics of the best epoch by ``select``
    (and ``best_epoch``, ``per_epoch``)."""
    import transformers
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    torch.manual_seed(s.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = getattr(transformers, job.auto).from_pretrained(model_dir, **job.model_kwargs())
    train = job.encode(tok, job.train_rows, s, train=True)
    dev = job.encode(tok, job.dev_rows, s, train=False)
    per_epoch = -(-len(train) // s.batch_size)
    total = s.epochs * per_epoch
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=s.lr, fused=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(s.warmup * total), total)
    history = []
    for epoch in range(s.epochs):
        model.train()
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(s.seed + epoch)).tolist()
        for start in range(0, len(order), s.batch_size):
            loss = model(**job.collate(tok, [train[i] for i in order[start: start + s.batch_size]])).loss
            loss.backward()
            if s.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        outputs = []
        with torch.no_grad():
            for start in range(0, len(dev), s.eval_batch):
                batch = job.collate(tok, dev[start: start + s.eval_batch])
                batch = {k: v for k, v in batch.items() if k not in ("labels", "start_positions", "end_positions")}
                out = model(**batch)
                outputs.append((out.start_logits, out.end_logits) if job.auto.endswith("QuestionAnswering")
                               else out.logits)
        metrics = job.score(dev, outputs)
        history.append(metrics)
        log(f"  transformers epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    best = max(range(len(history)), key=lambda e: history[e][select])
    return {**history[best], "best_epoch": best + 1, "per_epoch": history}
