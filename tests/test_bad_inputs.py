"""Bad input to every command: exit status 2, one line on stderr that names the flag or file, no traceback, and
every existing file (the committed fixture runs, copied here, and the data beside them) byte-identical.

Each row is (command line, what the line must say); ``{root}`` is the folder of copies: ``pre``, ``clf`` and
``adapters`` (fixture runs of tests/fixtures/runs; ``garbled-additions``, ``garbled-recipe``: ``clf`` with broken
additions, a recipe of an unknown field),
``corpus.txt``, ``train.csv``, ``dev.csv``, ``afile.txt`` (a file where a folder is expected), ``mine/`` (a folder
of the user's own files), ``empty/``, ``tasks.json`` (a compare task),
``pickled/`` (a transformers folder whose pytorch_model.bin pickles more than tensors), ``t5`` (a random t5 run),
``held/`` (an empty folder) and ``setting-up/`` (a run being set up), both held as another sesame command holds its
output, ``cut.jsonl.gz`` and ``cut.jsonl.zst`` (downloads cut short) and ``rows.parquet`` (no ``text`` column);
``{unwritable}`` is a folder where no file can be created.
"""
import gzip
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from sesame.run import SETTING_UP

from .conftest import NO_UNWRITABLE, corpora_or_skip, refused

try:
    import fcntl
except ImportError:  # Windows: outputs are not locked, and the rows that need a held folder skip
    fcntl = None

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CORPORA = all(importlib.util.find_spec(name) for name in ("zstandard", "pyarrow"))  # the corpora extra
FAST = ["--max-steps", "1", "--batch-size", "8"]
FT = ["--train", "{root}/train.csv", "--dev", "{root}/dev.csv"]
DI = ["--student", "scratch:bert:tiny", "--unlabeled", "{root}/train.csv", "--dev", "{root}/dev.csv"]

ROWS = {
    # tokenizer
    "tokenizer: missing corpus": (["tokenizer", "train", "--corpus", "{root}/nothing.txt", "--out", "{root}/t.json"],
                                  "--corpus", "nothing.txt"),
    "tokenizer: folder without text": (["tokenizer", "train", "--corpus", "{root}/empty", "--out", "{root}/t.json"],
                                       "--corpus", "empty"),
    "tokenizer: over a run's tokenizer": (["tokenizer", "train", "--corpus", "{root}/corpus.txt", "--out",
                                           "{root}/pre"], "--out", "tokenizer.json: exists"),
    "tokenizer: over its corpus": (["tokenizer", "train", "--corpus", "{root}/corpus.txt", "--out",
                                    "{root}/corpus.txt"], "--out", "is also --corpus"),
    "tokenizer: parent is a file": (["tokenizer", "train", "--corpus", "{root}/corpus.txt", "--out",
                                     "{root}/afile.txt/t.json"], "--out", "afile.txt is a file"),
    "tokenizer: an unknown kind": (["tokenizer", "train", "--corpus", "{root}/corpus.txt", "--kind", "bpee", "--out",
                                    "{root}/t.json"], "--kind bpee: choose one of wordpiece, bpe"),
    # vectors
    "vectors: over its corpus": (["vectors", "train", "--corpus", "{root}/corpus.txt", "--out", "{root}/corpus.txt"],
                                 "--out", "is also --corpus"),
    "vectors: over a file": (["vectors", "train", "--corpus", "{root}/corpus.txt", "--out", "{root}/train.csv"],
                             "--out", "train.csv: exists"),
    # prepare
    "prepare: into a run": (["prepare", "--corpus", "{root}/corpus.txt", "--tokenizer", "{root}/pre", "--out",
                             "{root}/pre"], "--out", "holds a pretrained run"),
    "prepare: into the user's folder": (["prepare", "--corpus", "{root}/corpus.txt", "--tokenizer", "{root}/pre",
                                         "--out", "{root}/mine"], "--out", "holds other files"),
    "prepare: onto a file": (["prepare", "--corpus", "{root}/corpus.txt", "--tokenizer", "{root}/pre", "--out",
                              "{root}/afile.txt"], "--out", "is a file"),
    "prepare: no tokenizer": (["prepare", "--corpus", "{root}/corpus.txt", "--tokenizer", "{root}/empty", "--out",
                               "{root}/new"], "--tokenizer", "no tokenizer.json"),
    "prepare: a corrupt gzip corpus": (["prepare", "--corpus", "{root}/cut.jsonl.gz", "--tokenizer", "{root}/pre",
                                        "--out", "{root}/new"], "cut.jsonl.gz", "not a readable .gz file"),
    # pretrain
    "pretrain: over a run": (["pretrain", "--corpus", "{root}/corpus.txt", "--out", "{root}/pre", *FAST], "--out",
                             "holds a pretrained run"),
    "pretrain: into the user's folder": (["pretrain", "--corpus", "{root}/corpus.txt", "--out", "{root}/mine",
                                          *FAST], "--out", "holds other files"),
    "pretrain: parent is a file": (["pretrain", "--corpus", "{root}/corpus.txt", "--out", "{root}/afile.txt/run",
                                    *FAST], "--out", "afile.txt is a file"),
    "pretrain: a missing teacher": (["pretrain", "--teacher", "{root}/nothing", "--corpus", "{root}/corpus.txt",
                                     "--out", "{root}/new", *FAST], "--teacher", "no such run"),
    "pretrain: a fine-tuned teacher": (["pretrain", "--teacher", "{root}/clf", "--corpus", "{root}/corpus.txt",
                                        "--out", "{root}/new", *FAST], "--teacher", "a finetuned run"),
    "pretrain: a teacher and a family": (["pretrain", "--teacher", "{root}/pre", "--family", "bert", "--corpus",
                                          "{root}/corpus.txt", "--out", "{root}/new", *FAST], "--family",
                                         "drop --family"),
    "pretrain: student layers the teacher lacks": (["pretrain", "--teacher", "{root}/pre", "--student-layers", "0",
                                                    "99", "--corpus", "{root}/corpus.txt", "--out", "{root}/new",
                                                    *FAST], "--student-layers 0 99", "has layers 0 to"),
    "pretrain: a negative loss weight": (["pretrain", "--teacher", "{root}/pre", "--kl-weight", "-1", "--corpus",
                                          "{root}/corpus.txt", "--out", "{root}/new", *FAST], "--kl-weight",
                                         "0 (off) or more"),
    "pretrain: smoothed masks of whole words": (["pretrain", "--teacher", "{root}/pre", "--masking", "whole_word",
                                                 "--corpus", "{root}/corpus.txt", "--out", "{root}/new", *FAST],
                                                "--mlm-smoothing 0.7", "--mlm-smoothing 0"),
    "pretrain: a negative smoothing": (["pretrain", "--teacher", "{root}/pre", "--mlm-smoothing", "-1", "--corpus",
                                        "{root}/corpus.txt", "--out", "{root}/new", *FAST], "--mlm-smoothing -1",
                                       "0 (uniform masking) or more"),
    "pretrain: separators neither true nor false": (["pretrain", "--family", "t5", "--objective-option",
                                                     "separators=no", "--corpus", "{root}/corpus.txt", "--out",
                                                     "{root}/new", *FAST], "separators=no", "true"),
    "pretrain: spare tokens with the separators kept": (["pretrain", "--family", "t5", "--objective-option",
                                                          "separators=true", "--objective-option", "spare_tokens=4",
                                                          "--corpus", "{root}/corpus.txt", "--out", "{root}/new",
                                                          *FAST], "spare_tokens=4", "separators=false"),
    "pretrain: an unknown family": (["pretrain", "--family", "bertt", "--corpus", "{root}/corpus.txt", "--out",
                                     "{root}/new", *FAST], "--family bertt: choose one of bert, roberta"),
    "pretrain: an unknown size": (["pretrain", "--size", "huge", "--corpus", "{root}/corpus.txt", "--out",
                                   "{root}/new", *FAST], "--size huge: choose one of tiny"),
    "pretrain: size auto without a time budget": (["pretrain", "--size", "auto", "--corpus", "{root}/corpus.txt",
                                                   "--out", "{root}/new", *FAST], "--size auto", "--max-minutes"),
    "pretrain: size auto of a run continued": (["pretrain", "--from", "{root}/pre", "--size", "auto", "--max-minutes",
                                                "1", "--corpus", "{root}/corpus.txt", "--out", "{root}/new", *FAST],
                                               "--size auto", "--from", "drop --size"),
    "pretrain: continue a classifier": (["pretrain", "--from", "{root}/clf", "--corpus", "{root}/corpus.txt", "--out",
                                         "{root}/new", *FAST], "--from", "holds a 'finetuned' run"),
    "pretrain: continue another family": (["pretrain", "--from", "{root}/pre", "--family", "gpt", "--corpus",
                                           "{root}/corpus.txt", "--out", "{root}/new", *FAST], "--from",
                                          "continue it with --family bert"),
    "pretrain: missing corpus": (["pretrain", "--corpus", "{root}/nothing.txt", "--out", "{root}/new", *FAST],
                                 "--corpus", "nothing.txt"),
    "pretrain: a Parquet corpus without its text column": (["pretrain", "--corpus", "{root}/rows.parquet", "--out",
                                                            "{root}/new", *FAST], "rows.parquet", "no column 'text'",
                                                           "--text-field"),
    "pretrain: a cut zstd corpus": (["pretrain", "--corpus", "{root}/cut.jsonl.zst", "--out", "{root}/new", *FAST],
                                    "cut.jsonl.zst", "not a readable .zst file"),
    "pretrain: negative budget": (["pretrain", "--corpus", "{root}/corpus.txt", "--out", "{root}/new",
                                   "--max-steps", "-3"], "--max-steps", "positive"),
    "pretrain: missing phrases": (["pretrain", "--corpus", "{root}/corpus.txt", "--masking", "phrase", "--phrases",
                                   "{root}/nothing.txt", "--out", "{root}/new", *FAST], "--phrases", "nothing.txt"),
    "pretrain: resume another family": (["pretrain", "--resume", "--corpus", "{root}/corpus.txt", "--out",
                                         "{root}/pre", "--family", "gpt"], "--family gpt", "made with bert"),
    "pretrain: resume another size": (["pretrain", "--resume", "--corpus", "{root}/corpus.txt", "--out",
                                       "{root}/pre", "--size", "mini"], "--size mini", "made with tiny"),
    "pretrain: resume another seq-len": (["pretrain", "--resume", "--corpus", "{root}/corpus.txt", "--out",
                                          "{root}/pre", "--seq-len", "64"], "--seq-len 64", "made with 32"),
    "pretrain: resume a classifier": (["pretrain", "--resume", "--corpus", "{root}/corpus.txt", "--out",
                                       "{root}/clf"], "--out", "holds a 'finetuned' run"),
    "pretrain: t5 noise out of range": (["pretrain", "--family", "t5", "--corpus", "{root}/corpus.txt",
                                         "--objective-option", "noise_density=1.5", "--out", "{root}/new", *FAST],
                                        "--objective-option noise_density=1.5", "between 0 and 1"),
    "pretrain: bart option of another objective": (["pretrain", "--family", "bart", "--corpus", "{root}/corpus.txt",
                                                    "--objective-option", "noise_density=0.2", "--out", "{root}/new",
                                                    *FAST], "--objective-option noise_density", "denoising"),
    "pretrain: bert with bart's objective": (["pretrain", "--family", "bert", "--objective", "denoising", "--corpus",
                                              "{root}/corpus.txt", "--out", "{root}/new", *FAST],
                                             "--objective denoising", "--family bert"),
    "pretrain: t5 with a causal LM": (["pretrain", "--family", "t5", "--objective", "clm", "--corpus",
                                       "{root}/corpus.txt", "--out", "{root}/new", *FAST],
                                      "--objective clm", "span_corruption, denoising"),
    "pretrain: bert with xlnet's objective": (["pretrain", "--family", "bert", "--objective", "plm", "--corpus",
                                               "{root}/corpus.txt", "--out", "{root}/new", *FAST],
                                              "--objective plm", "--family bert"),
    "pretrain: xlnet with a masked LM": (["pretrain", "--family", "xlnet", "--objective", "mlm", "--corpus",
                                          "{root}/corpus.txt", "--out", "{root}/new", *FAST], "--objective mlm", "plm"),
    "pretrain: xlnet predicting none": (["pretrain", "--family", "xlnet", "--corpus", "{root}/corpus.txt",
                                         "--objective-option", "k=0", "--out", "{root}/new", *FAST],
                                        "--objective-option k=0", "at least 1"),
    "pretrain: xlnet spans below 0": (["pretrain", "--family", "xlnet", "--corpus", "{root}/corpus.txt",
                                       "--objective-option", "max_span=-1", "--out", "{root}/new", *FAST],
                                      "--objective-option max_span=-1", "at least 0"),
    "pretrain: xlnet bi_data not a bool": (["pretrain", "--family", "xlnet", "--corpus", "{root}/corpus.txt",
                                            "--objective-option", "bi_data=2", "--out", "{root}/new", *FAST],
                                           "--objective-option bi_data=2", "true"),
    "pretrain: t5 with a tokenizer lacking sentinels": (["pretrain", "--family", "t5", "--corpus",
                                                         "{root}/corpus.txt", "--tokenizer", "{root}/unigram.json",
                                                         "--out", "{root}/new", *FAST],
                                                        "--tokenizer", "unigram.json", "--sentinels"),
    "pretrain: into a run another command is setting up": (["pretrain", "--corpus", "{root}/corpus.txt", "--out",
                                                             "{root}/setting-up", *FAST], "--out", "setting-up",
                                                            "another sesame command"),
    "pretrain: resume a run another command is setting up": (["pretrain", "--resume", "--corpus", "{root}/corpus.txt",
                                                              "--out", "{root}/setting-up", *FAST], "--out",
                                                             "another sesame command"),
    "pretrain: resume nothing": (["pretrain", "--resume", "--corpus", "{root}/corpus.txt", "--out", "{root}/new"],
                                 "--out", "no such run directory"),
    # finetune
    "finetune: over a run": (["finetune", "--from", "{root}/pre", *FT, "--out", "{root}/clf"], "--out",
                             "holds a fine-tuned run"),
    "finetune: onto a file": (["finetune", "--from", "{root}/pre", *FT, "--out", "{root}/afile.txt"], "--out",
                              "is a file"),
    "finetune: missing train file": (["finetune", "--from", "{root}/pre", "--train", "{root}/nothing.csv", "--dev",
                                      "{root}/dev.csv", "--out", "{root}/new"], "nothing.csv"),
    "finetune: missing run": (["finetune", "--from", "{root}/nothing", *FT, "--out", "{root}/new"], "--from"),
    "finetune: scratch twin of a fine-tuned run": (["finetune", "--from", "scratch:{root}/clf", *FT, "--out",
                                                     "{root}/new"], "--from", "'finetuned' run", "scratch:FAMILY:SIZE"),
    "finetune: a feature extractor from scratch": (["finetune", "--from", "scratch:elmo:tiny", *FT, "--out",
                                                    "{root}/new"], "--from scratch:elmo:tiny", "make a run first"),
    "finetune: word vectors for a pretrained transformer": (["finetune", "--from", "{root}/pre", *FT, "--vectors",
                                                             "{root}/corpus.txt", "--out", "{root}/new"],
                                                            "--vectors", "initialises the word embedding"),
    "finetune: negative eval points": (["finetune", "--from", "{root}/pre", *FT, "--out", "{root}/new",
                                        "--max-minutes", "1", "--eval-points", "-1"], "--eval-points", "0 (none)"),
    "finetune: missing column": (["finetune", "--from", "{root}/pre", *FT, "--text-column", "sentence", "--out",
                                  "{root}/new"], "train.csv", "'sentence'"),
    "finetune: an unknown task": (["finetune", "--from", "{root}/pre", *FT, "--task", "tagg", "--out", "{root}/new"],
                                  "--task tagg: choose one of classify"),
    "finetune: a folder for --train": (["finetune", "--from", "{root}/pre", "--train", "{root}/empty", "--dev",
                                        "{root}/dev.csv", "--out", "{root}/new"], "empty is a folder", "CSV"),
    "finetune: a text file of texts alone for --train": (["finetune", "--from", "{root}/pre", "--train",
                                                          "{root}/texts.txt", "--dev", "{root}/dev.csv", "--out",
                                                          "{root}/new"], "texts.txt", "--label-column", "labels"),
    "finetune: a JSON object as a label": (["finetune", "--from", "{root}/pre", "--train", "{root}/object.jsonl",
                                            "--dev", "{root}/dev.csv", "--out", "{root}/new"], "object.jsonl:2",
                                           "a JSON object"),
    "finetune: a label that is nan": (["finetune", "--from", "{root}/pre", "--train", "{root}/nan-label.csv", "--dev",
                                       "{root}/dev.csv", "--out", "{root}/new"], "nan-label.csv:3", "NaN"),
    "finetune: a tagging file of words alone": (["finetune", "--from", "{root}/pre", "--task", "tag", "--train",
                                                 "{root}/words.txt", "--dev", "{root}/words.txt", "--out",
                                                 "{root}/new"], "words.txt:1", "a word without a tag"),
    "finetune: a mixture's unknown cast": (["finetune", "--from", "scratch:t5:tiny", "--task", "text2text", "--mixture",
                                            "{root}/mixture.json", "--out", "{root}/new"],
                                           "mixture.json: task 'a': cast=clasify: choose one of"),
    "finetune: zero epochs": (["finetune", "--from", "{root}/pre", *FT, "--epochs", "0", "--out", "{root}/new"],
                              "--epochs 0"),
    "finetune: resume another task": (["finetune", "--resume", "--from", "{root}/pre", *FT, "--out", "{root}/clf",
                                       "--task", "regress"], "--task regress", "made with classify"),
    "finetune: resume another max-length": (["finetune", "--resume", "--from", "{root}/pre", *FT, "--out",
                                             "{root}/clf", "--max-length", "64"], "--max-length 64", "made with 32"),
    "finetune: resume another lr": (["finetune", "--resume", "--from", "{root}/pre", *FT, "--out", "{root}/clf",
                                     "--lr", "0.5"], "--lr 0.5", "made with 0.001"),
    "finetune: resume a pretrained run": (["finetune", "--resume", "--from", "{root}/pre", *FT, "--out",
                                           "{root}/pre"], "--out", "holds a 'pretrained' run"),
    # distil
    "distil: a pretrained teacher": (["distil", "--teacher", "{root}/pre", *DI, "--out", "{root}/new"], "--teacher",
                                     "a finetuned run is needed"),
    "distil: alpha without labels": (["distil", "--teacher", "{root}/clf", *DI, "--alpha", "0.5", "--out",
                                      "{root}/new"], "--alpha 0.5", "--train"),
    "distil: teacher outputs of a run that kept none": (["distil", "--teacher", "{root}/clf", *DI, "--teacher-outputs",
                                                         "{root}/pre", "--out", "{root}/new"], "--teacher-outputs",
                                                        "no teacher_outputs.json"),
    "distil: a folder of unlabeled text": (["distil", "--teacher", "{root}/clf", *DI[:2], "--unlabeled",
                                            "{root}/empty", *DI[4:], "--out", "{root}/new"], "empty is a folder"),
    "distil: a text file for two texts": (["distil", "--teacher", "{root}/clf", *DI[:2], "--unlabeled",
                                           "{root}/texts.txt", *DI[4:], "--pair-column", "second", "--out",
                                           "{root}/new"], "texts.txt", "--pair-column"),
    "distil: a missing student": (["distil", "--teacher", "{root}/clf", *DI[2:], "--student", "{root}/nothing",
                                   "--out", "{root}/new"], "--student", "no such run"),
    # evaluate
    "evaluate: missing run": (["evaluate", "--model", "{root}/nothing", "--data", "{root}/dev.csv"], "--model",
                              "nothing"),
    "evaluate: missing data": (["evaluate", "--model", "{root}/clf", "--data", "{root}/nothing.csv"],
                               "nothing.csv"),
    "evaluate: a folder for --data": (["evaluate", "--model", "{root}/clf", "--data", "{root}/empty"],
                                      "empty is a folder"),
    "evaluate: not a run": (["evaluate", "--model", "{root}/mine", "--data", "{root}/dev.csv"], "--model", "mine"),
    # predict
    "predict: over its input": (["predict", "--model", "{root}/clf", "--input", "{root}/dev.csv", "--output",
                                 "{root}/dev.csv"], "--output", "is also --input"),
    "predict: over a run's file": (["predict", "--model", "{root}/clf", "--input", "{root}/dev.csv", "--output",
                                    "{root}/pre/config.json"], "--output", "config.json: exists"),
    "predict: parent is a file": (["predict", "--model", "{root}/clf", "--input", "{root}/dev.csv", "--output",
                                   "{root}/afile.txt/p.jsonl"], "--output", "afile.txt is a file"),
    "predict: missing input": (["predict", "--model", "{root}/clf", "--input", "{root}/nothing.csv"],
                               "nothing.csv"),
    "predict: into a folder it cannot write": (["predict", "--model", "{root}/clf", "--input", "{root}/dev.csv",
                                                "--output", "{unwritable}/p.jsonl"], "--output", "cannot write there"),
    # serve
    "serve: missing model": (["serve", "--model", "{root}/nothing"], "--model", "no such run directory"),
    "serve: an encoder that neither classifies nor generates": (["serve", "--model", "{root}/pre"], "--model",
                                                                "generate needs a causal language model"),
    "serve: no inputs per request": (["serve", "--model", "{root}/clf", "--max-client-batch-size", "0"],
                                     "--max-client-batch-size", "at least 1"),
    "serve: no beams": (["serve", "--model", "{root}/clf", "--max-beams", "0"], "--max-beams", "at least 1"),
    "serve: a negative deadline": (["serve", "--model", "{root}/clf", "--request-timeout", "-1"], "--request-timeout",
                                   "at least 0"),
    "serve: an address not of this machine": (["serve", "--model", "{root}/clf", "--host", "192.0.2.1", "--api-key",
                                               "k"], "--host 192.0.2.1", "cannot listen there"),
    # export
    "export: a pretrained run": (["export", "--model", "{root}/pre", "--out", "{root}/new"], "--model", "pretrained"),
    "export: into someone's folder": (["export", "--model", "{root}/clf", "--out", "{root}/mine"], "--out", "mine"),
    "export: over a run": (["export", "--model", "{root}/clf", "--out", "{root}/pre"], "--out", "pretrained run"),
    # convert
    "convert: export over a run": (["convert", "--to-hf", "{root}/pre", "--out", "{root}/clf"], "--out",
                                   "holds a fine-tuned run"),
    "convert: export into its own run": (["convert", "--to-hf", "{root}/pre", "--out", "{root}/pre"], "--out",
                                         "holds a pretrained run"),
    "convert: into a folder another command holds": (["convert", "--to-hf", "{root}/pre", "--out", "{root}/held"],
                                                      "--out", "held", "another sesame command"),
    "convert: missing model": (["convert", "--from-hf", "{root}/nothing", "--out", "{root}/new"], "--from-hf"),
    "convert: a pickle of more than tensors": (["convert", "--from-hf", "{root}/pickled", "--out", "{root}/new"],
                                                "pickled/pytorch_model.bin", "convert it to safetensors"),
    "convert: generator without import": (["convert", "--to-hf", "{root}/pre", "--generator", "{root}/pre", "--out",
                                           "{root}/new"], "--generator"),
    "convert: a run with adapters": (["convert", "--to-hf", "{root}/adapters", "--out", "{root}/new"], "--to-hf",
                                     "adapters", "export the run it was fine-tuned from"),
    # generate
    "generate: missing prompts": (["generate", "--model", "{root}/pre", "--prompts", "{root}/nothing.txt"],
                                  "--prompts", "nothing.txt"),
    "generate: empty prompts": (["generate", "--model", "{root}/pre", "--prompts", "{root}/blank.txt"],
                                "--prompts", "blank.txt"),
    # translate
    "translate: over its input": (["translate", "--model", "{root}/pre", "--input", "{root}/corpus.txt",
                                   "--output", "{root}/corpus.txt"], "--output", "is also --input"),
    "translate: a folder of sources": (["translate", "--model", "{root}/pre", "--input", "{root}/empty"], "--input",
                                       "empty is a folder"),
    # compare
    "compare: into the user's folder": (["compare", "--approaches", "bert:tiny", "--corpus", "{root}/corpus.txt",
                                         "--tasks", "{root}/tasks.json", "--minutes", "1", "--out", "{root}/mine"],
                                        "--out", "holds other files"),
    "compare: into a run": (["compare", "--approaches", "bert:tiny", "--corpus", "{root}/corpus.txt", "--tasks",
                             "{root}/tasks.json", "--minutes", "1", "--out", "{root}/pre"], "--out",
                            "holds a pretrained run"),
    "compare: onto a file": (["compare", "--approaches", "bert:tiny", "--corpus", "{root}/corpus.txt", "--tasks",
                              "{root}/tasks.json", "--minutes", "1", "--out", "{root}/afile.txt"], "--out",
                             "is a file"),
    "compare: missing corpus": (["compare", "--approaches", "bert:tiny", "--corpus", "{root}/nothing.txt",
                                 "--tasks", "{root}/tasks.json", "--minutes", "1", "--out", "{root}/new"],
                                "--corpus", "nothing.txt"),
    # ulmfit
    "ulmfit: into the user's folder": (["ulmfit", "--corpus", "{root}/corpus.txt", *FT, "--out", "{root}/mine"],
                                       "--out", "holds other files"),
    "ulmfit: into a run": (["ulmfit", "--corpus", "{root}/corpus.txt", *FT, "--out", "{root}/clf"], "--out",
                           "holds a fine-tuned run"),
    # decontaminate
    "decontaminate: into the user's folder": (["decontaminate", "--corpus", "{root}/corpus.txt", "--eval",
                                               "{root}/dev.csv", "--out-corpus", "{root}/mine"], "--out-corpus",
                                              "holds other files"),
    "decontaminate: missing corpus": (["decontaminate", "--corpus", "{root}/nothing.txt", "--eval", "{root}/dev.csv"],
                                      "--corpus", "nothing.txt"),
    "decontaminate: a compressed corpus cleaned": (["decontaminate", "--corpus", "{root}/cut.jsonl.gz", "--eval",
                                                    "{root}/dev.csv", "--out-corpus", "{root}/new"], "--out-corpus",
                                                   "cut.jsonl.gz is compressed or Parquet"),
    # demo
    "demo: into the user's folder": (["demo", "--out", "{root}/mine"], "--out", "holds other files"),
    "demo: into a folder another command holds": (["demo", "--out", "{root}/held"], "--out", "held",
                                                   "another sesame command"),
    # what the readers refuse (file:line and the fix)
    "finetune: a row with an extra field": (["finetune", "--from", "{root}/pre", "--train", "{root}/more.csv", "--dev",
                                             "{root}/dev.csv", "--out", "{root}/new"], "more.csv:3", "quote"),
    "finetune: a row short of a field": (["finetune", "--from", "{root}/pre", "--train", "{root}/fewer.csv", "--dev",
                                          "{root}/dev.csv", "--out", "{root}/new"], "fewer.csv:2", "1 field"),
    "finetune: an unclosed quote": (["finetune", "--from", "{root}/pre", "--train", "{root}/open.csv", "--dev",
                                     "{root}/dev.csv", "--out", "{root}/new"], "open.csv:2"),
    "finetune: a column named twice": (["finetune", "--from", "{root}/pre", "--train", "{root}/twice.csv", "--dev",
                                        "{root}/dev.csv", "--out", "{root}/new"], "twice.csv:1", "more than once"),
    "finetune: a target that is nan": (["finetune", "--from", "{root}/pre", "--task", "regress", "--train",
                                        "{root}/nan.csv", "--dev", "{root}/nan.csv", "--out", "{root}/new"],
                                       "nan.csv:3", "finite"),
    "finetune: not UTF-8": (["finetune", "--from", "{root}/pre", "--train", "{root}/latin1.csv", "--dev",
                             "{root}/dev.csv", "--out", "{root}/new"], "latin1.csv:3", "UTF-8"),
    "finetune: dropout of 1.5": (["finetune", "--from", "{root}/pre", *FT, "--dropout", "1.5", "--out", "{root}/new"],
                                 "--dropout 1.5"),
    "pretrain: dropout of -0.1": (["pretrain", "--corpus", "{root}/corpus.txt", "--dropout", "-0.1", "--out",
                                   "{root}/new", *FAST], "--dropout -0.1"),
    "pretrain: shards cut short": (["pretrain", "--corpus", "{root}/cut-shards", "--out", "{root}/new", *FAST],
                                   "cut-shards", "prepare"),
    "pretrain: shards with a garbled meta.json": (["pretrain", "--corpus", "{root}/garbled-shards", "--out",
                                                   "{root}/new", *FAST], "garbled-shards", "meta.json"),
    "evaluate: seq-len 0": (["evaluate", "--model", "{root}/pre", "--data", "{root}/corpus.txt", "--seq-len", "0"],
                            "--seq-len 0"),
    "evaluate: memory for a model without": (["evaluate", "--model", "{root}/pre", "--data", "{root}/corpus.txt",
                                              "--mem-len", "4"], "--mem-len 4", "reads no memory"),
    "evaluate: weights cut short": (["evaluate", "--model", "{root}/cut", "--data", "{root}/corpus.txt"],
                                    "model.safetensors"),
    "evaluate: config.json not UTF-8": (["evaluate", "--model", "{root}/latin1-run", "--data", "{root}/corpus.txt"],
                                        "config.json", "not UTF-8"),
    "evaluate: config.json's additions garbled": (["evaluate", "--model", "{root}/garbled-additions", "--data",
                                                   "{root}/dev.csv"], "config.json", "broken additions record [4]"),
    "evaluate: config.json's recipe garbled": (["evaluate", "--model", "{root}/garbled-recipe", "--data",
                                                "{root}/dev.csv"], "config.json", 'broken recipe record {"colour"'),
    "evaluate: a model config of no backbone": (["evaluate", "--model", "{root}/odd-model", "--data",
                                                 "{root}/corpus.txt"], "odd-model/config.json",
                                                "hidden 64 is not divisible by heads 3"),
    "generate: prompts not UTF-8": (["generate", "--model", "{root}/pre", "--prompts", "{root}/latin1.csv"],
                                    "latin1.csv:3", "UTF-8"),
    "generate: a folder of prompts": (["generate", "--model", "{root}/pre", "--prompts", "{root}/empty"],
                                      "--prompts", "empty is a folder"),
    "generate: a t5 past its positions": (["generate", "--model", "{root}/t5", "--prompt", "a cat",
                                           "--max-new-tokens", "100000"], "--max-new-tokens 100000", "512 positions"),
    "generate: an empty prompt": (["generate", "--model", "{root}/pre", "--prompt", ""], "--prompt"),
    # neighbors, prompt-eval, cove
    "neighbors: missing run": (["neighbors", "--model", "{root}/nothing", "--word", "cat", "--corpus",
                                "{root}/corpus.txt"], "--model", "nothing"),
    "prompt-eval: a label that is nan": (["prompt-eval", "--model", "{root}/pre", "--data", "{root}/nan-label.csv",
                                          "--k", "0"],
                                         "nan-label.csv:3", "NaN"),
    "prompt-eval: demonstrations without --train": (["prompt-eval", "--model", "{root}/pre", "--data",
                                                     "{root}/dev.csv", "--k", "8"], "--k 8", "--train"),
    "cove: missing source": (["cove", "--train-src", "{root}/nothing.txt", "--train-tgt", "{root}/corpus.txt",
                              "--valid-src", "{root}/corpus.txt", "--valid-tgt", "{root}/corpus.txt", "--out",
                              "{root}/new"], "--train-src", "nothing.txt"),
    "cove: over a run": (["cove", "--train-src", "{root}/corpus.txt", "--train-tgt", "{root}/corpus.txt",
                          "--valid-src", "{root}/corpus.txt", "--valid-tgt", "{root}/corpus.txt", "--out",
                          "{root}/pre"], "--out", "holds a pretrained run"),
    # report
    "report: missing run": (["report", "{root}/nothing", "--out", "{root}/page.html"], "nothing", "not found"),
    "report: into a folder it cannot write": (["report", "{root}/pre", "--out", "{unwritable}/page.html"], "--out",
                                              "cannot write there"),
    "report: a page over a file it did not write": (["report", "{root}/pre", "--out", "{root}/corpus.txt"], "--out",
                                                     ".html"),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("bad_inputs")
    shutil.copytree(FIXTURES / "runs" / "pretrained", root / "pre")
    shutil.copytree(FIXTURES / "runs" / "classifier", root / "clf")
    shutil.copytree(FIXTURES / "runs" / "adapters", root / "adapters")
    shutil.copytree(root / "clf", root / "garbled-additions")
    config = root / "garbled-additions" / "config.json"
    written = json.loads(config.read_text())
    model = {k: v for k, v in written["model"].items() if k not in ("adapter_size", "scalar_mix")}  # today's layout
    config.write_text(json.dumps({**written, "model": model, "additions": [4]}))
    shutil.copytree(root / "clf", root / "garbled-recipe")
    config = root / "garbled-recipe" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "recipe": {"colour": "red"}}))
    shutil.copy(FIXTURES / "data" / "eval.txt", root / "corpus.txt")
    for name in ("train.csv", "dev.csv"):
        shutil.copy(FIXTURES / "data" / name, root / name)
    (root / "afile.txt").write_text("a file, not a folder\n")
    (root / "blank.txt").write_text("\n  \n")
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("years of work\n")
    (root / "empty").mkdir()
    (root / "more.csv").write_text("text,label\ngood,positive\nlate again, friendly staff,negative\n")
    (root / "fewer.csv").write_text("text,label\ngreat flight\n")
    (root / "open.csv").write_text('text,label\n"never closed,positive\nfine,negative\n')
    (root / "twice.csv").write_text("text,text\na,b\n")
    (root / "nan.csv").write_text("text,label\nfine,1.0\nodd,nan\n")
    (root / "latin1.csv").write_bytes("text,label\nok,positive\ncaf\u00e9,negative\n".encode("latin-1"))
    shutil.copytree(root / "pre", root / "cut")
    weights = root / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    shutil.copytree(root / "pre", root / "latin1-run")
    config = root / "latin1-run" / "config.json"
    config.write_bytes(config.read_bytes().replace(b'"kind"', '"k\u00efnd"'.encode("latin-1"), 1))
    shutil.copytree(root / "pre", root / "odd-model")
    odd = json.loads((root / "odd-model" / "config.json").read_text())
    (root / "odd-model" / "config.json").write_text(json.dumps({**odd, "model": {**odd["model"], "heads": 3}}))
    from sesame.data.shards import prepare_corpus
    from sesame.run import load_tokenizer
    from sesame.tokenizer import train_tokenizer

    train_tokenizer([(root / "corpus.txt").read_text()], "unigram", 100).save(root / "unigram.json")  # no sentinels

    for name in ("cut-shards", "garbled-shards"):
        prepare_corpus([root / "corpus.txt"], load_tokenizer(root / "pre"), root / name, progress=False)
    tokens = next((root / "cut-shards").glob("tokens-*.bin"))
    tokens.write_bytes(tokens.read_bytes()[:10])
    (root / "garbled-shards" / "meta.json").write_text('{"format": "sesame-sh')
    (root / "tasks.json").write_text(json.dumps({"name": "t", "train": str(root / "train.csv"),
                                                 "dev": str(root / "dev.csv")}))
    (root / "texts.txt").write_text("a text alone\nanother\n")
    records = "".join(json.dumps({"text": f"document {i} of a web crawl"}) + "\n" for i in range(2000)).encode()
    (root / "cut.jsonl.gz").write_bytes(gzip.compress(records)[:-50])  # downloads cut short
    if CORPORA:
        import pyarrow as pa
        import pyarrow.parquet as pq
        import zstandard

        (root / "cut.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(records)[:-50])
        pq.write_table(pa.table({"content": ["a document"]}), root / "rows.parquet")
    (root / "object.jsonl").write_text('{"text": "fine", "label": "a"}\n{"text": "odd", "label": {"a": 1}}\n')
    (root / "nan-label.csv").write_text("text,label\nfine,positive\nodd,nan\nbad,negative\n")
    (root / "words.txt").write_text("EU\nrejects\n\nPeter\n")
    (root / "mixture.json").write_text(json.dumps({name: {"train": "train.csv", "dev": "dev.csv", "cast": cast}
                                                   for name, cast in (("a", "clasify"), ("b", "classify"))}))
    pickled(root / "pickled")
    random_run(root / "t5", "t5", (root / "corpus.txt").read_text())
    (root / "held").mkdir()
    (root / "setting-up").mkdir()
    (root / "setting-up" / SETTING_UP).touch()
    held = [os.open(root / name, os.O_RDONLY) for name in ("held", "setting-up")] if fcntl else []
    for fd in held:  # as another command holds its output (sesame.outputs.hold)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    yield root
    for fd in held:
        os.close(fd)


def pickled(folder: Path) -> None:
    """A transformers BERT folder (config.json, vocab.txt) whose pytorch_model.bin pickles an object besides tensors."""
    import argparse

    import torch

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": 6, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
        "intermediate_size": 8, "max_position_embeddings": 8}))
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(6, 4), "args": argparse.Namespace(lr=1.0)},
               folder / "pytorch_model.bin")


def random_run(folder: Path, family: str, text: str) -> None:
    """A pretrained run of ``family`` at size tiny with random weights and a tokenizer trained on ``text``."""
    from sesame.families import backbone_config
    from sesame.models import build_model
    from sesame.run import RunConfig, write_config
    from sesame.tokenizer import train_tokenizer
    from sesame.train.checkpoint import save_weights

    folder.mkdir()
    tok = train_tokenizer([text], "unigram", 100)
    tok.save(folder / "tokenizer.json")
    model = backbone_config(family, "tiny", tok.vocab_size, tok.specials.pad, specials=tok.specials)
    weights = build_model(model).state_dict()
    save_weights(folder / "model.safetensors", {"backbone." + k: v for k, v in weights.items()})
    write_config(folder, RunConfig(kind="pretrained", family=family, model=model))


def test_the_table_covers_every_command():
    from sesame.commands import COMMANDS

    covered = {argv[0] for argv, *_ in ROWS.values()}
    assert len(ROWS) >= 40
    assert set(COMMANDS) == {name.replace("-", "_") for name in covered}


@pytest.mark.parametrize("case", list(ROWS))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, root, unwritable, capsys):
    argv, *expected = ROWS[case]
    if fcntl is None and "another sesame command" in expected:
        pytest.skip("outputs are locked where fcntl is (Linux, macOS)")
    if unwritable is None and "{unwritable}" in " ".join(argv):
        pytest.skip(NO_UNWRITABLE)
    if any(arg.endswith((".zst", ".parquet")) for arg in argv):
        corpora_or_skip()
    refused([a.format(root=root, unwritable=unwritable) for a in argv], capsys, root, *expected)
    assert not (root / "new").exists()


@pytest.mark.parametrize("command", [["prepare", "--tokenizer", "{root}/pre"], ["pretrain", *FAST]])
def test_a_corpus_whose_reader_is_not_installed_is_refused(command, root, capsys, monkeypatch):
    """Where zstandard is not installed, a .jsonl.zst corpus is refused as bad input is, saying how to install it."""
    (root / "web.jsonl.zst").write_bytes(b"never read")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    argv = [command[0], "--corpus", str(root / "web.jsonl.zst"), "--out", str(root / "new"),
            *(a.format(root=root) for a in command[1:])]
    refused(argv, capsys, root, "web.jsonl.zst", "zstandard", "pip install 'sesame-nlp[corpora]'")
    assert not (root / "new").exists()
    (root / "web.jsonl.zst").unlink()
