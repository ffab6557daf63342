"""``sesame tokenizer``: train a subword tokenizer."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..tokenizer import KINDS


def add(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser("tokenizer", help="train a subword tokenizer")
    top.set_defaults(run=run)
    tok = top.add_subparsers(dest="action", required=True)
    t = tok.add_parser("train", help="train WordPiece, byte-level BPE or Unigram on text files")
    t.add_argument("--corpus", nargs="+", required=True, help="text files, folders or .jsonl files")
    t.add_argument("--kind", choices=KINDS, default="wordpiece")
    t.add_argument("--vocab-size", type=int, default=16000)
    t.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                   help="lower-case text (default: on for wordpiece, off otherwise)")
    t.add_argument("--sentinels", type=int, default=0, metavar="N",
                   help="end the vocabulary with T5's sentinel tokens <extra_id_0> ... (span corruption needs them; "
                        "T5: 100, at most a tenth of --vocab-size; `sesame pretrain --family t5` adds them itself)")
    t.add_argument("--text-field", default="text", help="the text field of .jsonl records")
    t.add_argument("--out", required=True, help="a new file to write, or a folder to write tokenizer.json in "
                                                "(never replaces a file)")


def run(args: argparse.Namespace) -> None:
    progress = not args.no_progress
    from ..data.corpus import iter_texts, resolve_sources
    from ..outputs import new_file
    from ..tokenizer import train_tokenizer

    files = resolve_sources(args.corpus)
    out = Path(args.out)
    out = new_file(out / "tokenizer.json" if out.is_dir() else out, "--out", {"--corpus": files})
    tok = train_tokenizer(lambda: iter_texts(files, args.text_field), args.kind, args.vocab_size, args.lowercase,
                          show_progress=progress, sentinels=args.sentinels)
    tok.save(out)
    print(f"wrote {out}: {tok.kind}, {tok.vocab_size} tokens")
