"""Derive a SQuAD v2.0-style file (with unanswerable questions) from a SQuAD v1.1 file.

THE OUTPUT IS DERIVED, NOT SQuAD v2.0. The shared data has no v2.0 file, so this script takes a
v1.1 file and moves a deterministic share of its questions (a third by default, drawn with
``random.Random(seed)``) to a paragraph of ANOTHER article, where they are marked
``"is_impossible": true`` with ``"answers": []``; every other question stays where it was with
``"is_impossible": false``. The file's ``"version"`` is ``"v2.0-derived"`` so that no one takes it for
the official set, and ``--task span_qa`` reads it as v2.0.

Caveat: real v2.0 unanswerable questions were written by crowd workers to look answerable from their
own paragraph, with a plausible distractor (Rajpurkar et al. 2018); a question moved to another
article is usually off-topic, so this set is much easier and its no-answer scores are not
comparable with published v2.0 results. It exercises the no-answer machinery (s_null, the tuned
threshold), not the model's reading.

    python scripts/squad_v2.py ../shared/data/squad/train.json runs/squad2/train.json
    python scripts/squad_v2.py ../shared/data/squad/dev.json runs/squad2/dev.json --seed 1
"""
from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path


def derive(squad: dict, fraction: float = 1 / 3, seed: int = 0) -> dict:
    """A copy of a v1.1 ``squad`` dict in which ``round(fraction · questions)`` questions, drawn with
    ``random.Random(seed)``, are moved to a random paragraph of a different article as unanswerable."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction {fraction}: must lie between 0 and 1")
    data = copy.deepcopy(squad["data"])
    if len(data) < 2:
        raise ValueError("needs at least two articles: an unanswerable question comes from another article")
    rng = random.Random(seed)
    places = [(a, p, qa) for a, article in enumerate(data) for p, paragraph in enumerate(article["paragraphs"])
              for qa in paragraph["qas"]]
    moved = sorted(rng.sample(range(len(places)), round(fraction * len(places))))
    for article in data:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = []
    moving = set(moved)
    for i, (a, p, qa) in enumerate(places):
        if i not in moving:
            data[a]["paragraphs"][p]["qas"].append({**qa, "is_impossible": False})
    for i in moved:
        a, _, qa = places[i]
        other = rng.choice([b for b in range(len(data)) if b != a])
        rng.choice(data[other]["paragraphs"])["qas"].append({**qa, "is_impossible": True, "answers": []})
    return {"version": "v2.0-derived", "data": data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="a SQuAD v1.1 JSON file")
    parser.add_argument("output", help="where to write the derived v2.0-style JSON")
    parser.add_argument("--fraction", type=float, default=1 / 3, help="share of questions made unanswerable")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    squad = json.loads(Path(args.input).read_text(encoding="utf-8"))
    derived = derive(squad, args.fraction, args.seed)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(derived, ensure_ascii=False) + "\n", encoding="utf-8")
    questions = [qa for article in derived["data"] for p in article["paragraphs"] for qa in p["qas"]]
    print(f"wrote {out}: {len(questions)} questions, {sum(qa['is_impossible'] for qa in questions)} unanswerable "
          "(moved to another article's paragraph)")


if __name__ == "__main__":
    main()
