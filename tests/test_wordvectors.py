"""Word vectors: vocabulary, GloVe's counts, weights and training, GloVe/word2vec text files, embedding rows."""
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sesame.errors import SesameError
from sesame.apps.vectors import (GloveSpec, Vocabulary, build_vocabulary, cooccurrence, glove, glove_weight, nearest,
                                 train_glove)
from sesame.data.vectors import WordVectors, embedding_matrix, load_vectors, words

from .conftest import shared_data


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_words_and_vocabulary(tmp_path):
    assert words("The cat's <unk> @-@ e-mail, ok!!") == ["The", "cat's", "<unk>", "@-@", "e-mail", ",", "ok", "!!"]
    corpus = write(tmp_path, "c.txt", "The cat the dog\nthe cat <unk> bird\n")
    vocab = build_vocabulary([corpus], lower=True, min_count=2)
    assert vocab.words == ["<pad>", "<unk>", "the", "cat"]
    assert vocab.encode("The bird cat") == [2, 1, 3]
    assert build_vocabulary([corpus], max_size=4).words == ["<pad>", "<unk>", "cat", "the"]  # ties: first seen
    with pytest.raises(SesameError, match="--min-count 0"):
        build_vocabulary([corpus], min_count=0)


def test_cooccurrence_equals_a_brute_force_count(tmp_path):
    lines = ["a b c a d b a", "c c d a", "b e a c d d b a c"]
    corpus = write(tmp_path, "c.txt", "\n".join(lines) + "\n")
    vocab = Vocabulary(["<pad>", "<unk>", "a", "b", "c", "d"])  # "e" is unknown: it keeps its place, pairs dropped
    window = 3
    expected = torch.zeros(6, 6, dtype=torch.float64)
    for line in lines:
        ids = vocab.encode(line)
        for p, i in enumerate(ids):
            for q, j in enumerate(ids):
                if p != q and abs(p - q) <= window and i > 1 and j > 1:
                    expected[i, j] += 1 / abs(p - q)
    cooc = cooccurrence([corpus], vocab, window)
    got = torch.zeros(6, 6, dtype=torch.float64)
    got[torch.from_numpy(cooc.rows), torch.from_numpy(cooc.cols)] = torch.from_numpy(cooc.counts)
    assert torch.allclose(got, expected) and (cooc.counts > 0).all()


def test_weighting_function():
    x = torch.tensor([0.0, 1.0, 50.0, 100.0, 1e4])
    assert torch.allclose(glove_weight(x), torch.tensor([0.0, 0.01 ** 0.75, 0.5 ** 0.75, 1.0, 1.0]))
    assert torch.allclose(glove_weight(torch.tensor([5.0]), x_max=10, alpha=1.0), torch.tensor([0.5]))


def structured(tmp_path: Path) -> Path:
    """Animals share contexts (pet, feed, ...), vehicles share others (drive, park, ...)."""
    rng = random.Random(0)
    groups = {("cat", "dog", "rabbit"): "pet feed stroke fur vet",
              ("car", "truck", "bus"): "drive park fuel road wheel"}
    lines = []
    for _ in range(400):
        members, contexts = rng.choice(list(groups.items()))
        ctx = contexts.split()
        lines.append(" ".join(rng.sample(ctx, 2) + [rng.choice(members)] + rng.sample(ctx, 2)))
    return write(tmp_path, "s.txt", "\n".join(lines) + "\n")


def test_glove_learns_shared_contexts(tmp_path, one_thread):
    corpus = structured(tmp_path)
    vocab = build_vocabulary([corpus])
    vectors, losses = train_glove(cooccurrence([corpus], vocab, 4), vocab,
                                  GloveSpec(corpus=[corpus], out="", dim=16, epochs=30, batch_size=32, progress=False))
    assert losses[-1] < 0.5 * losses[0]
    unit = F.normalize(vectors.vectors, dim=1)

    def cos(a: str, b: str) -> float:
        return float(unit[vectors.index[a]] @ unit[vectors.index[b]])

    assert cos("cat", "dog") > cos("cat", "truck") and cos("cat", "rabbit") > cos("cat", "bus")
    assert cos("car", "bus") > cos("car", "dog") and cos("car", "truck") > cos("car", "rabbit")


def test_glove_and_word2vec_text_round_trip(tmp_path):
    vectors = WordVectors(["the", "Paris", "ça"], torch.randn(3, 5))
    vectors.save(tmp_path / "g.txt")
    back = load_vectors(tmp_path / "g.txt")
    assert back.words == vectors.words and torch.allclose(back.vectors, vectors.vectors, atol=1e-5)
    w2v = write(tmp_path, "w.txt", "2 3\nking 0.1 0.2 0.3\nqueen 0.4 0.5 -0.6\n")
    loaded = load_vectors(w2v)
    assert loaded.words == ["king", "queen"] and loaded.dim == 3
    assert torch.allclose(loaded.vectors[1], torch.tensor([0.4, 0.5, -0.6]))


@pytest.mark.parametrize("text, match", [
    ("a 1 2 3\nb 1 2\n", r"b\.txt:2: 2 values, but the file's vectors have 3"),
    ("a 1 2\nb 1 x\n", r"b\.txt:2: a value is not a finite number"),
    ("3 2\na 1 2\nb 1 2\n", r"b\.txt:1: the header says 3 vectors but the file has 2"),
    ("a 1 2\nb\n", r"b\.txt:2: a word without values"),
    ("a 1 2\nb nan 2\n", r"b\.txt:2: a value is not a finite number"),
    ("a 1 inf\nb 1 2\n", r"b\.txt:1: a value is not a finite number"),
    ("a 1 1e39\n", r"b\.txt:1: a value is not a finite number"),  # beyond float32
])
def test_bad_vector_files_name_file_and_line(tmp_path, text, match):
    with pytest.raises(SesameError, match=match):
        load_vectors(write(tmp_path, "b.txt", text))


def test_bad_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "b.txt"
    path.write_bytes(b"a 1 2\n\xff 1 2\n")
    with pytest.raises(SesameError, match=r"b\.txt:2: not valid UTF-8"):
        load_vectors(path)


def test_embedding_matrix_rows_and_coverage():
    vectors = WordVectors(["paris", "the"], torch.tensor([[1.0, 2.0], [3.0, -4.0]]))
    matrix, found = embedding_matrix(vectors, ["<pad>", "<unk>", "the", "Paris", "London"])
    assert found.tolist() == [False, False, True, True, False]
    assert matrix[0].eq(0).all()  # <pad>; below, "Paris" falls back to "paris"
    assert torch.equal(matrix[2], vectors.vectors[1]) and torch.equal(matrix[3], vectors.vectors[0])
    assert matrix[4].abs().sum() > 0  # unknown words start random, at the found rows' scale
    again, _ = embedding_matrix(vectors, ["<pad>", "<unk>", "the", "Paris", "London"])
    assert torch.equal(matrix, again)  # seeded


@pytest.mark.slow
def test_glove_on_wikitext2_valid(tmp_path):
    """The whole path on real text (WikiText-2 valid, 217k tokens): counts, 3 epochs, a file that loads back."""
    data = shared_data()
    report = glove(GloveSpec(corpus=[data / "wikitext2/valid.txt"], out=tmp_path / "v.txt", dim=50, epochs=3,
                             lower=True, min_count=3, progress=False))
    assert report["losses"][-1] < report["losses"][0] and report["nonzero_pairs"] > 500_000
    vectors = load_vectors(tmp_path / "v.txt")
    assert len(vectors.words) == report["words"] and vectors.dim == 50


def test_bad_settings_name_the_flag(tmp_path):
    corpus = write(tmp_path, "c.txt", "a b a b\n")
    vocab = build_vocabulary([corpus])
    with pytest.raises(SesameError, match="--window 0"):
        cooccurrence([corpus], vocab, 0)
    with pytest.raises(SesameError, match="--dim 0"):
        train_glove(cooccurrence([corpus], vocab), vocab, GloveSpec(corpus=[corpus], out="", dim=0))
    lonely = write(tmp_path, "l.txt", "a\nb\n")  # no two words share a line
    with pytest.raises(SesameError, match="no two known words share a window"):
        glove(GloveSpec(corpus=[lonely], out=tmp_path / "v.txt", progress=False))
    with pytest.raises(SesameError, match="'zebra' has no vector"):
        nearest(WordVectors(["a", "b"], torch.eye(2)), "zebra", 10)


def test_cli_trains_vectors_and_lists_neighbours(tmp_path, capsys, one_thread):
    import json

    from sesame import cli

    corpus = structured(tmp_path)
    out = tmp_path / "v.txt"
    assert cli.main(["--no-progress", "vectors", "train", "--corpus", str(corpus), "--out", str(out), "--dim", "16",
                     "--window", "4", "--epochs", "30", "--batch-size", "32"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dim"] == 16 and report["losses"][-1] < report["losses"][0] and out.is_file()
    assert cli.main(["vectors", "neighbors", "--vectors", str(out), "--word", "cat", "--k", "2"]) == 0
    neighbours = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert len(neighbours) == 2 and set(neighbours) <= {"dog", "rabbit", "pet", "feed", "stroke", "fur", "vet"}
    assert cli.main(["vectors", "neighbors", "--vectors", str(out), "--word", "zebra"]) == 2
    assert "--word 'zebra'" in capsys.readouterr().err
