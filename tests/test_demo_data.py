import csv
import random

from sesame.apps.demo import make_world, write_data


def test_dev_words_never_appear_in_labeled_training(tmp_path):
    paths = write_data(tmp_path, seed=0, sentences=500, labeled=200)
    world = make_world(random.Random(0))
    words = {w for ws in world.values() for w in ws}
    used = {}
    for split in ("train", "dev"):
        with open(paths[split]) as fh:
            used[split] = {w for row in csv.DictReader(fh) for w in row["text"].split() if w in words}
    assert used["train"] and used["dev"] and not used["train"] & used["dev"]
    corpus_words = {w for line in paths["corpus"].read_text().split() for w in [line] if w in words}
    assert used["dev"] <= corpus_words  # the corpus is where their meaning can be learned


def test_labels_follow_the_hidden_classes(tmp_path):
    paths = write_data(tmp_path, seed=3, sentences=10, labeled=100)
    world = make_world(random.Random(3))
    with open(paths["train"]) as fh:
        for row in csv.DictReader(fh):
            assert any(w in world[row["label"]] for w in row["text"].split())
