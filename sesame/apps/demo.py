"""``sesame demo``: watch pre-training transfer, on data generated on the spot.

The world of the demo has 80 invented words. Half name creatures and half name tools, but
nothing in a word's spelling says which. The unlabeled corpus reveals it: creatures bark, nap and
chase things; tools are sharpened, oiled and hung on hooks. The labeled task asks "creature or
tool?" about sentences that give no hint ("i saw a blick near the barn"), and the dev set uses
only words the labeled training set never shows. A model pre-trained on the corpus has learned
what each word means and can answer; a from-scratch twin can only guess.

The demo pre-trains a tiny GPT (causal LM): every position is a prediction, so it learns the
words' contexts within a few hundred steps on two CPU cores. (A tiny BERT gets a training signal
at only 15% of positions and stays on its unigram plateau for longer than a demo should take.)
"""
from __future__ import annotations

import csv
import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..api import finetune, pretrain
from ..options import option
from ..outputs import claim_dir
from ..runtime import Runtime

ONSETS = ["bl", "cr", "d", "f", "gl", "j", "k", "m", "pl", "qu", "r", "sn", "st", "tr", "v", "z", "w", "br"]
VOWELS = ["a", "e", "i", "o", "u", "oo", "ee", "ai"]
CODAS = ["b", "ck", "d", "g", "m", "n", "p", "rk", "sh", "t", "x", "z", "mp", "nd"]
CONTEXT = {
    "creature": ["the {w} barked at the mailman .", "a hungry {w} ate all the seeds .", "the {w} napped in the sun .",
                 "my {w} chased its own tail .", "the little {w} purred softly .", "a wild {w} ran across the field .",
                 "the {w} licked its paws .", "that {w} laid three eggs .", "the sleepy {w} yawned and stretched .",
                 "we fed the {w} some fish ."],
    "tool": ["the {w} was sharpened on a stone .", "he tightened the bolt with a {w} .", "the {w} hung on a hook .",
             "she oiled the rusty {w} .", "a heavy {w} cut through the board .", "the {w} needs a new handle .",
             "he sawed the plank with the {w} .", "put the {w} back in the toolbox .", "the steel {w} was polished .",
             "i borrowed a {w} to fix the fence ."],
}
NEUTRAL = ["i saw a {w} near the barn .", "there is a {w} over there .", "my friend told me about the {w} .",
           "look at that {w} !", "the {w} is in the shed .", "someone mentioned a {w} yesterday .",
           "have you ever seen a {w} ?", "a {w} was in the picture ."]


@dataclass(kw_only=True)
class DemoSpec:
    """``sesame demo``: where to write the data and the three runs, and the seed of everything."""
    out: str = option("runs/demo", help="folder of the generated data, the runs and result.json")
    seed: int = option(0, help="seed of the generated world and of training")
    runtime: Runtime = option(factory=Runtime, cli=False, help="device and precision of its runs (sesame.runtime)")
    progress: bool = option(True, cli=False, help="show progress bars")


def make_world(rng: random.Random, per_class: int = 40) -> dict[str, list[str]]:
    words: set[str] = set()
    while len(words) < 2 * per_class:
        words.add(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return {"creature": ordered[:per_class], "tool": ordered[per_class:]}


def write_data(out: Path, seed: int = 0, sentences: int = 30000, labeled: int = 400) -> dict[str, Path]:
    """Write corpus.txt, train.csv (words of the first half) and dev.csv (words of the second half)."""
    rng = random.Random(seed)
    world = make_world(rng)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.txt", "w") as fh:
        for _ in range(sentences):
            label = rng.choice(list(CONTEXT))
            fh.write(rng.choice(CONTEXT[label]).format(w=rng.choice(world[label])) + "\n")
    paths = {"corpus": out / "corpus.txt"}
    for split, lo, hi, n in (("train", 0, 20, labeled), ("dev", 20, 40, labeled // 2)):
        with open(out / f"{split}.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "label"])
            for _ in range(n):
                label = rng.choice(list(CONTEXT))
                writer.writerow([rng.choice(NEUTRAL).format(w=rng.choice(world[label][lo:hi])), label])
        paths[split] = out / f"{split}.csv"
    return paths


def run_demo(spec: DemoSpec) -> dict:
    """Pre-train a tiny GPT, fine-tune it and a from-scratch twin on 400 labels, print both accuracies."""
    started = time.time()
    out, seed, progress = Path(spec.out), spec.seed, spec.progress
    spec.runtime.place()  # a device or precision this machine lacks is refused before anything is written
    claim_dir(out, "--out", "demo", fix="the demo writes into a new or empty folder, or starts its own afresh")
    paths = write_data(out / "data", seed)
    print(f"data in {out / 'data'}: an unlabeled corpus and 400 labeled sentences (dev words never seen in training)")
    common = dict(train=str(paths["train"]), dev=str(paths["dev"]), text_column="text", label_column="label",
                  epochs=8, batch_size=16, lr=3e-4, seed=seed, progress=progress, runtime=spec.runtime)
    for name in ("pretrained", "pretrained-finetuned", "scratch-finetuned"):  # a demo starts afresh
        shutil.rmtree(out / name, ignore_errors=True)
    print("1/3 pre-training a tiny GPT (causal LM) on the unlabeled corpus ...")
    pretrain(corpus=[str(paths["corpus"])], out=str(out / "pretrained"), family="gpt", size="tiny", vocab_size=1000,
             seq_len=64, max_steps=600, batch_size=32, lr=1e-3, eval_every=200, seed=seed, progress=progress,
             runtime=spec.runtime)
    print("2/3 fine-tuning it ...")
    transfer = finetune(base=str(out / "pretrained"), out=str(out / "pretrained-finetuned"), **common)
    print("3/3 fine-tuning a randomly initialised twin (same architecture and tokenizer) ...")
    scratch = finetune(base="scratch:gpt:tiny", out=str(out / "scratch-finetuned"),
                       tokenizer=str(out / "pretrained"), **common)
    result = {"pretrained_dev_accuracy": transfer["accuracy"], "scratch_dev_accuracy": scratch["accuracy"],
              "minutes": round((time.time() - started) / 60, 2)}
    print()
    print(f"{'model':<28}{'dev accuracy':>14}")
    print(f"{'pre-trained, fine-tuned':<28}{transfer['accuracy']:>14.3f}")
    print(f"{'from scratch, fine-tuned':<28}{scratch['accuracy']:>14.3f}")
    print(f"\n(chance is about 0.5; {result['minutes']} minutes; runs in {out})")
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
