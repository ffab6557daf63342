"""Peak memory of `sesame prepare` as the corpus grows: streaming means it should stay flat.

Runs `sesame prepare` in a fresh process on the corpus repeated 1x and 8x (the same files listed
again, so each copy is one more document) and reads the child's peak resident set size from
``os.wait4``. Prints a table and one JSON line per size.

    python benchmarks/prepare_memory.py --corpus ../shared/data/wikitext2/train.txt
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_rss_mib(argv: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of a child process running ``argv``."""
    start = time.time()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(argv)} failed with status {status}")
    return usage.ru_maxrss / 1024, time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", required=True)
    parser.add_argument("--factors", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--vocab-size", type=int, default=16000)
    args = parser.parse_args()
    sesame = [sys.executable, "-m", "sesame", "--no-progress"]
    with tempfile.TemporaryDirectory() as tmp:
        tok = Path(tmp) / "tokenizer.json"
        subprocess.run(sesame + ["tokenizer", "train", "--corpus", *args.corpus, "--vocab-size", str(args.vocab_size),
                                 "--out", str(tok)], check=True, stdout=subprocess.DEVNULL)
        size = sum(Path(c).stat().st_size for c in args.corpus)
        print(f"{'corpus':>10}{'MB':>10}{'peak RSS MiB':>14}{'seconds':>10}{'MB/s':>8}")
        for factor in args.factors:
            out = Path(tmp) / f"shards-{factor}"
            rss, seconds = peak_rss_mib(sesame + ["prepare", "--corpus", *(args.corpus * factor), "--tokenizer",
                                                  str(tok), "--out", str(out)])
            mb = factor * size / 1e6
            print(f"{factor:>9}x{mb:>10.1f}{rss:>14.0f}{seconds:>10.1f}{mb / seconds:>8.1f}")
            print(json.dumps({"bench": "prepare-peak-rss", "factor": factor, "corpus_mb": round(mb, 1),
                              "peak_rss_mib": round(rss), "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    main()
