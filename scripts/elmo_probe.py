"""What does each layer of a pretrained ELMo know? Linear probes per layer (Peters et al. 2018, §5.3).

For CoNLL-2003 words (columns: token POS chunk NER), the representation of each biLM layer (0: the
character CNN's token vector [x; x], 1 and 2: the biLSTM layers [forward; backward]) at the word's
first token, frozen; per layer and tag set a multinomial logistic regression (scikit-learn, features
standardised, at most ``MAX_ITER`` L-BFGS iterations, the count recorded) trained on the first
``--train-sentences`` training sentences and scored on the first ``--valid-sentences`` validation
sentences: word accuracy for POS, chunk and NER tags, and for NER also conlleval's entity F1. The
paper's finding to compare with: POS is best read from the first biLSTM layer, word sense from the
second. Writes a JSON report and a PNG plot (accuracy per layer, one line
per tag set) to ``--out`` (``.json`` and ``.png``).

    python scripts/elmo_probe.py --model runs/elmo-mini --out runs/elmo-mini-probe
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from tqdm import tqdm

from sesame.errors import SesameError
from sesame.metrics import conll_report
from sesame.models.elmo import Elmo
from sesame.run import load_backbone, load_tokenizer
from sesame.tasks.classify import collate
from sesame.tasks.tag import Tag

CONLL = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003"
TAG_SETS = {"pos": 1, "chunk": 2, "ner": 3}  # CoNLL-2003 column of each tag set
MAX_LENGTH = 512
MAX_ITER = 500  # L-BFGS iterations per probe


def layer_vectors(backbone: Elmo, tok, examples: list[dict], batch_size: int, desc: str) -> list[np.ndarray]:
    """Per biLM layer, one row per word (its first token's states), words of all sentences in order."""
    features = Tag().features([{"words": row["words"]} for row in examples], tok, MAX_LENGTH, [], causal=False)
    if any(p < 0 for f in features for p in f["first"]):
        raise SesameError(f"{desc}: a sentence is longer than {MAX_LENGTH} tokens; shorten it")
    layers: list[list[np.ndarray]] = []
    with torch.no_grad():
        for start in tqdm(range(0, len(features), batch_size), desc=desc, unit="batch"):
            chunk = features[start: start + batch_size]
            batch = collate([f["ids"] for f in chunk], tok.specials.pad)
            states = backbone(batch["ids"], padding=batch["padding"], all_layers=True)
            if not layers:
                layers = [[] for _ in states]
            for depth, hidden in enumerate(states):
                layers[depth] += [hidden[i, f["first"]].numpy() for i, f in enumerate(chunk)]
    return [np.concatenate(rows) for rows in layers]


def probe(model: str, train: str, valid: str, train_sentences: int, valid_sentences: int,
          batch_size: int = 32) -> dict:
    """Accuracy (and NER entity F1) of a linear probe per layer and tag set; see the module docstring."""
    backbone = load_backbone(model)
    if not isinstance(backbone, Elmo):
        raise SesameError(f"--model {model}: not an ELMo run (arch {backbone.config.arch!r}); pretrain one with "
                          "`sesame pretrain --family elmo`")
    tok = load_tokenizer(model, "--model")
    torch.set_grad_enabled(False)
    split = {"train": Tag(label_column=1).read(train)[:train_sentences],
             "valid": Tag(label_column=1).read(valid)[:valid_sentences]}
    vectors = {name: layer_vectors(backbone, tok, rows, batch_size, f"encode {name}") for name, rows in split.items()}
    gold = {name: {task: [tag for row in Tag(label_column=column).read(path)[: len(split[name])] for tag in row["tags"]]
                   for task, column in TAG_SETS.items()}
            for name, path in (("train", train), ("valid", valid))}
    report: dict = {"model": str(model), "train_sentences": len(split["train"]), "train_words": len(gold["train"]["pos"]),
                    "valid_sentences": len(split["valid"]), "valid_words": len(gold["valid"]["pos"]),
                    "max_iter": MAX_ITER, "accuracy": {task: [] for task in TAG_SETS}, "ner_f1": [],
                    "iterations": {task: [] for task in TAG_SETS}}
    lengths = np.cumsum([len(row["words"]) for row in split["valid"]])[:-1]
    fits = tqdm(total=len(TAG_SETS) * len(vectors["train"]), desc="probes", unit="fit")
    for depth, (x_train, x_valid) in enumerate(zip(vectors["train"], vectors["valid"])):
        scaler = StandardScaler().fit(x_train)
        x_train, x_valid = scaler.transform(x_train), scaler.transform(x_valid)
        for task in TAG_SETS:
            with warnings.catch_warnings():  # reported in the JSON instead (iterations = MAX_ITER: not converged)
                warnings.simplefilter("ignore", ConvergenceWarning)
                classifier = LogisticRegression(max_iter=MAX_ITER).fit(x_train, gold["train"][task])
            report["iterations"][task].append(int(classifier.n_iter_.max()))
            predicted = classifier.predict(x_valid)
            report["accuracy"][task].append(float(np.mean(predicted == np.array(gold["valid"][task]))))
            if task == "ner":
                sentences = [list(s) for s in np.split(predicted, lengths)]
                truth = [list(s) for s in np.split(np.array(gold["valid"][task]), lengths)]
                report["ner_f1"].append(conll_report(truth, sentences)["f1"])
            fits.update()
            fits.set_postfix(layer=depth, task=task, acc=f"{report['accuracy'][task][-1]:.3f}")
    fits.close()
    return report


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for task, accuracies in report["accuracy"].items():
        ax.plot(range(len(accuracies)), accuracies, marker="o", label=task)
    ax.set_xticks(range(len(accuracies)), ["0: token", *[f"{i}: biLSTM {i}" for i in range(1, len(accuracies))]])
    ax.set_ylabel("linear probe accuracy (valid)")
    ax.set_title(f"ELMo layers, {report['train_words']} training words")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a pretrained elmo run directory")
    parser.add_argument("--out", required=True, help="report path; writes OUT.json and OUT.png")
    parser.add_argument("--train", default=str(CONLL / "train.txt"))
    parser.add_argument("--valid", default=str(CONLL / "valid.txt"))
    parser.add_argument("--train-sentences", type=int, default=2000)
    parser.add_argument("--valid-sentences", type=int, default=1000)
    args = parser.parse_args()
    try:
        for flag, value in (("--train-sentences", args.train_sentences), ("--valid-sentences", args.valid_sentences)):
            if value < 1:
                raise SesameError(f"{flag} {value}: give a positive number of sentences")
        report = probe(args.model, args.train, args.valid, args.train_sentences, args.valid_sentences)
    except SesameError as err:
        raise SystemExit(f"error: {err}") from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    for task, accuracies in report["accuracy"].items():
        print(f"{task:<6}" + "  ".join(f"layer {i}: {a:.3f}" for i, a in enumerate(accuracies)))
    print("ner entity F1  " + "  ".join(f"layer {i}: {f:.3f}" for i, f in enumerate(report["ner_f1"])))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
