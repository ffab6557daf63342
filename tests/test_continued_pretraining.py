"""Continued pre-training on a task's own unlabeled text, one command for each family (ULMFiT's target-task LM, Howard &
Ruder 2018, §3.2; DAPT/TAPT, Gururangan et al. 2020): ``sesame pretrain --from RUN --corpus TRAIN.csv`` reads the
training file's text column and nothing else, continues the run's model, and the result fine-tunes."""
import json

import pytest

from sesame.cli import main
from sesame.data.corpus import iter_pieces

from .conftest import documents, sentences

VOCAB = {"bert": "200", "gpt": "300", "t5": "400", "bart": "300"}  # t5's holds its sentinels


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    """corpus.txt (general text), train.csv (a task's labeled file whose labels are one word no text holds),
    texts.jsonl (train.csv's texts alone) and dev.csv."""
    root = tmp_path_factory.mktemp("continued")
    (root / "corpus.txt").write_text(documents(sentences(300)))
    texts = sentences(40, seed=21)
    (root / "train.csv").write_text("id,text,label\n" + "".join(f'{i},"{t}",{("zyzzyva", "quokka")[i % 2]}\n'
                                                              for i, t in enumerate(texts)))
    (root / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (root / "dev.csv").write_text("id,text,label\n" + "".join(f'{i},"{t}",{("zyzzyva", "quokka")[i % 2]}\n'
                                                            for i, t in enumerate(sentences(16, seed=22))))
    return root


def test_a_csv_corpus_is_its_text_column_a_document_per_row(task_files):
    pieces = list(iter_pieces([task_files / "train.csv"]))
    texts = [json.loads(line)["text"] for line in (task_files / "texts.jsonl").read_text().splitlines()]
    assert [text for _, _, text in pieces] == texts and [doc for _, doc, _ in pieces] == list(range(len(texts)))


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart"])
def test_continued_pretraining_on_a_tasks_training_file(family, task_files, tmp_path):
    q, root = ["--no-progress"], task_files
    short = ["--seq-len", "32", "--max-steps", "1", "--batch-size", "8"]
    base, continued = tmp_path / "base", tmp_path / "continued"
    assert main(q + ["pretrain", "--family", family, "--size", "tiny", "--corpus", str(root / "corpus.txt"),
                     "--vocab-size", VOCAB[family], *short, "--out", str(base)]) == 0
    # the documented command: no --family (the run's), the task's training file as the corpus
    assert main(q + ["pretrain", "--from", str(base), "--corpus", str(root / "train.csv"), *short,
                     "--out", str(continued)]) == 0
    made, started = (json.loads((run / "config.json").read_text()) for run in (continued, base))
    assert (made["family"], made["base"], made["model"]) == (family, str(base), started["model"])
    assert (continued / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    shards = json.loads((continued / "shards" / "meta.json").read_text())
    assert shards["boundaries"] == ["table rows"] and shards["n_docs"] == 40
    # the same tokens as the texts alone: no label, id or header was read
    assert main(q + ["prepare", "--corpus", str(root / "texts.jsonl"), "--tokenizer", str(continued), "--out",
                     str(tmp_path / "texts")]) == 0
    assert (tmp_path / "texts/tokens-00000.bin").read_bytes() == (continued / "shards/tokens-00000.bin").read_bytes()
    assert main(q + ["finetune", "--from", str(continued), "--train", str(root / "train.csv"), "--dev",
                     str(root / "dev.csv"), "--max-steps", "2", "--batch-size", "8", "--max-length", "32",
                     "--out", str(tmp_path / "tuned")]) == 0
    assert json.loads((tmp_path / "tuned/config.json").read_text())["base"] == str(continued)


def test_a_new_t5_run_is_read_through_its_encoders_mean_and_a_continued_run_as_its_base(task_files, tmp_path):
    """T5's short-budget defaults (docs/results/time_to_quality.md): a new run starts from the counts and records
    pooling mean, which its fine-tunes and its scratch twin read; continuing a run keeps the run's pooling (a T5
    imported from transformers records last, its T5ForSequenceClassification head)."""
    q, root = ["--no-progress"], task_files
    short = ["--seq-len", "32", "--max-steps", "1", "--batch-size", "8"]
    base, continued = tmp_path / "base", tmp_path / "continued"
    assert main(q + ["pretrain", "--family", "t5", "--size", "tiny", "--corpus", str(root / "corpus.txt"),
                     "--vocab-size", VOCAB["t5"], *short, "--out", str(base)]) == 0
    config = json.loads((base / "config.json").read_text())
    assert (config["pooling"], config["embedding_init"]) == ("mean", "ppmi")
    for start, out in ((str(base), "tuned"), (f"scratch:{base}", "twin")):
        assert main(q + ["finetune", "--from", start, "--train", str(root / "train.csv"), "--dev",
                         str(root / "dev.csv"), "--max-steps", "1", "--batch-size", "8", "--max-length", "32",
                         "--out", str(tmp_path / out)]) == 0
        assert json.loads((tmp_path / out / "config.json").read_text())["pooling"] == "mean"
    (base / "config.json").write_text(json.dumps({**config, "pooling": "last"}))  # as an imported T5 records
    assert main(q + ["pretrain", "--from", str(base), "--corpus", str(root / "train.csv"), *short,
                     "--out", str(continued)]) == 0
    assert json.loads((continued / "config.json").read_text())["pooling"] == "last"
