"""`sesame neighbors`: occurrences, static and contextual neighbours, groups, errors; and on MiniLM, senses of "play"."""
import json
from pathlib import Path

import pytest
import torch

from sesame import pretrain
from sesame.cli import main
from sesame.errors import SesameError
from sesame.models import (EncoderDecoder, EncoderDecoderConfig, Recurrent, RecurrentConfig, XLNet,
                           XLNetConfig)
from sesame.apps.neighbors import (NeighborsSpec, contextual_vectors, find_occurrences, format_neighbors, neighbors,
                                   spherical_kmeans, static_neighbors)
from sesame.models.encoder_decoder import STYLES
from sesame.run import load_backbone, load_tokenizer
from sesame.tokenizer import put_cls_last, train_tokenizer

from .conftest import documents, minilm, sentences

PLAY = Path(__file__).resolve().parents[1] / "docs" / "examples" / "play.txt"
SPORT = "S"
SENSES = SPORT * 13 + "T" * 13  # play.txt: lines 1-13 sport, 14-26 the stage


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny BERT pre-trained for two steps on text where the cat sleeps, plays and is played with."""
    root = tmp_path_factory.mktemp("neighbors")
    lines = sentences(300) + ["The cat plays in the garden.", "A dog played near the river."] * 20
    (root / "corpus.txt").write_text(documents(lines))  # several documents, for NSP
    pretrain([str(root / "corpus.txt")], str(root / "run"), family="bert", size="tiny", vocab_size=300, seq_len=32,
             progress=False, max_steps=2, batch_size=8)
    return root / "run"


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text("The cat plays in the garden.\nThe dog sleeps.\nA bird played near the old house, play on.\n"
                    "The playful cat and the role-play.\nPLAY the blue stone.\n")
    return path


def test_whole_word_occurrences_any_case(small: Path) -> None:
    found = find_occurrences(small, ["play", "plays", "played"])
    assert [(o.line, o.sentence[o.start: o.end]) for o in found] == [
        (1, "plays"), (3, "played"), (3, "play"), (5, "PLAY")]  # not "playful", not "role-play"


def test_json_structure(run: Path, small: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["neighbors", "--model", str(run), "--word", "play", "--forms", "plays,played", "--corpus", str(small),
                 "--k", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["forms"] == ["play", "plays", "played"] and result["layer"] == result["layers"] == 2
    assert result["k"] == 2 and len(result["static"]) == 2
    assert all(s["token"].isalpha() and s["token"] != "play" and -1 <= s["score"] <= 1 for s in result["static"])
    occ = result["occurrences"]
    assert [o["text"] for o in occ] == ["plays", "played", "play", "PLAY"]
    for i, o in enumerate(occ):
        assert len(o["neighbors"]) == 2 and i not in {n["index"] for n in o["neighbors"]}
        assert o["neighbors"][0]["score"] >= o["neighbors"][1]["score"]
    assert sorted(sum(result["clusters"], [])) == [0, 1, 2, 3] and len(result["clusters"]) == 2
    assert all(occ[i]["cluster"] == c for c, members in enumerate(result["clusters"]) for i in members)
    text = format_neighbors(result)
    assert "static" in text and "group 2" in text and "*PLAY* the blue stone." in text


def test_k_is_capped_and_clusters_can_be_off(run: Path, small: Path) -> None:
    result = neighbors(NeighborsSpec(model=run, word="play", corpus=small, forms="plays,played", k=10, clusters=0,
                                     layer=0))
    assert result["k"] == 3 and all(len(o["neighbors"]) == 3 for o in result["occurrences"])
    assert result["clusters"] == [] and result["occurrences"][0]["cluster"] is None
    assert len(result["static"]) == 10


def test_static_list_ignores_context_contextual_vectors_do_not(run: Path, small: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.txt"
    other.write_text("Green trees play under a large cloud.\nA small fish and a stone play.\n")
    assert neighbors(NeighborsSpec(model=run, word="play", corpus=small))["static"] == \
        neighbors(NeighborsSpec(model=run, word="play", corpus=other))["static"]
    backbone, tok = load_backbone(run), load_tokenizer(run)
    alone, padded = tmp_path / "alone.txt", tmp_path / "padded.txt"  # the same sentence unpadded and padded
    alone.write_text("The cat plays.\n")
    padded.write_text("The cat plays.\nThe old dog sleeps under the green tree and plays.\n")
    layer = backbone.config.layers
    first = contextual_vectors(backbone, tok, find_occurrences(alone, ["plays"]), layer, alone)
    vectors = contextual_vectors(backbone, tok, find_occurrences(padded, ["plays"]), layer, padded)
    assert torch.allclose(first[0], vectors[0], atol=1e-5)
    assert not torch.allclose(vectors[0], vectors[1], atol=1e-3)


def by_hand(backbone: torch.nn.Module, tok, line: str, word: str, layer: int, types: list[int] | None) -> torch.Tensor:
    """The mean of ``layer``'s states over ``word``'s tokens, ``line`` read alone (no padding) with ``types``."""
    enc = tok.encodings([line])[0]
    start = line.index(word)
    covering = [i for i, (a, b) in enumerate(enc.offsets) if a < start + len(word) and b > start]
    given = None if types is None else torch.tensor([types])
    return backbone(torch.tensor([enc.ids]), types=given, all_layers=True)[layer][0, covering].mean(0)


def test_bert_lines_read_in_segment_zero_as_without_segments(run: Path, tmp_path: Path) -> None:
    backbone, tok = load_backbone(run), load_tokenizer(run)
    corpus = tmp_path / "lines.txt"
    corpus.write_text("The cat plays.\nThe old dog sleeps under the green tree and plays.\n")
    vectors = contextual_vectors(backbone, tok, find_occurrences(corpus, ["plays"]), 2, corpus)
    for vector, line in zip(vectors, corpus.read_text().splitlines()):
        torch.testing.assert_close(vector, by_hand(backbone, tok, line, "plays", 2, None), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def xlnet_tok():
    tok = train_tokenizer(sentences(300), "unigram", 150)
    put_cls_last(tok)
    return tok


def tiny_xlnet(tok) -> XLNet:
    """A tiny XLNet with N(0, 1) tokens, segment vectors and bias, so a token's segment shows in every state; its
    ``max_positions`` (16) is shorter than the lines it reads, which it may read as it has no position table."""
    torch.manual_seed(0)
    net = XLNet(XLNetConfig(vocab_size=tok.vocab_size, hidden=16, layers=2, heads=2, intermediate=32, dropout=0.0,
                            max_positions=16))
    with torch.no_grad():
        net.embed.tokens.weight.normal_()
        for attention in net.attention:
            attention.seg_embed.normal_()
            attention.r_s_bias.normal_()
    return net.eval()


def test_xlnet_reads_a_line_as_fine_tuning_does_its_cls_in_segment_two(xlnet_tok, tmp_path: Path) -> None:
    net, corpus = tiny_xlnet(xlnet_tok), tmp_path / "lines.txt"
    lines = ["The cat sleeps near the river.", " ".join(["the old dog runs"] * 8) + " and the cat sleeps."]
    corpus.write_text("\n".join(lines) + "\n")
    lengths = [len(e.ids) for e in xlnet_tok.encodings(lines)]
    assert lengths[1] > net.config.max_positions  # read: relative positions have no limit
    vectors = contextual_vectors(net, xlnet_tok, find_occurrences(corpus, ["cat"]), 2, corpus)
    for vector, line, n in zip(vectors, lines, lengths):
        segments = [0] * (n - 1) + [2]  # a <sep> <cls>: the class token in its own segment
        torch.testing.assert_close(vector, by_hand(net, xlnet_tok, line, "cat", 2, segments), atol=1e-5, rtol=1e-5)
        assert (vector - by_hand(net, xlnet_tok, line, "cat", 2, None)).abs().max() > 1e-4  # all 0: other states


def test_recurrent_models_have_no_position_limit(tmp_path: Path) -> None:
    tok = train_tokenizer(sentences(300), "word", 100)
    net = Recurrent(RecurrentConfig(vocab_size=tok.vocab_size, embedding_size=8, hidden_size=8, layers=1)).eval()
    corpus = tmp_path / "lines.txt"
    corpus.write_text("the cat sleeps\nthe dog runs and the cat sleeps\n")
    assert contextual_vectors(net, tok, find_occurrences(corpus, ["cat"]), 1, corpus).shape == (2, 8)


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_an_encoder_decoder_reads_a_line_with_its_encoder(style: str, tmp_path: Path) -> None:
    """T5 and BART backbones take decoder inputs too: their vectors are the encoder's states (it used to be a
    TypeError)."""
    tok = train_tokenizer(sentences(300), "bpe", 150)
    torch.manual_seed(0)
    net = EncoderDecoder(EncoderDecoderConfig(**STYLES[style], vocab_size=tok.vocab_size, hidden=16, layers=2,
                                              heads=2, intermediate=32, dropout=0.0, max_positions=64,
                                              pad_id=tok.specials.pad, decoder_start_id=tok.specials.sep)).eval()
    corpus = tmp_path / "lines.txt"
    corpus.write_text("The cat sleeps.\nThe old dog runs and the cat sleeps.\n")
    vectors = contextual_vectors(net, tok, find_occurrences(corpus, ["cat"]), 2, corpus)
    for vector, line in zip(vectors, corpus.read_text().splitlines()):
        enc = tok.encodings([line])[0]
        start = line.index("cat")
        covering = [i for i, (a, b) in enumerate(enc.offsets) if a < start + 3 and b > start]
        states = net.encode(torch.tensor([enc.ids])).states[0, covering].mean(0)  # the encoder's last layer
        torch.testing.assert_close(vector, states, atol=1e-5, rtol=1e-5)
    assert (vectors[0] - vectors[1]).abs().max() > 1e-4  # the context shows


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_static_neighbours_are_whole_words_for_every_tokenizer(kind: str) -> None:
    tok = train_tokenizer(sentences(300) + ["the cats play and the dogs play"] * 5, kind, 300)
    table = torch.randn(tok.vocab_size, 8, generator=torch.Generator().manual_seed(0))
    found = static_neighbors(table, tok, "play", 5)
    assert len(found) == 5 and all(n["token"].isalpha() and n["token"] != "play" for n in found)


def test_kmeans_finds_two_obvious_groups() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.tensor([1.0, 0, 0]) + 0.1 * torch.randn(5, 3, generator=g),
                   torch.tensor([0, 1.0, 0]) + 0.1 * torch.randn(4, 3, generator=g)])
    assert spherical_kmeans(torch.nn.functional.normalize(x, dim=1), 2, seed=0) == [0] * 5 + [1] * 4


@pytest.mark.parametrize("flags, message", [
    (["--corpus", "missing.txt"], "--corpus missing.txt: no such file"),
    (["--word", "xylophone", "--forms", ""], "--word 'xylophone': 0 occurrence(s) of xylophone in"),
    (["--layer", "3"], "--layer 3: this model has layers 0 (embeddings) to 2"),
    (["--forms", "plays,two words"], "--word/--forms 'two words': not a single word"),
    (["--clusters", "9"], "--clusters 9: give 0 (none) or 2 to 4"),
    (["--k", "0"], "--k 0: give at least 1"),
])
def test_bad_input_is_one_line(run: Path, small: Path, capsys, flags: list[str], message: str) -> None:
    args = {"--model": str(run), "--word": "play", "--forms": "plays,played", "--corpus": str(small)}
    args.update(zip(flags[::2], flags[1::2]))
    capsys.readouterr()
    assert main(["neighbors"] + [x for pair in args.items() for x in pair]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_wrong_run_and_long_lines(run: Path, small: Path, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"kind": "compare"}')
    with pytest.raises(SesameError, match="holds a 'compare' run, but a pretrained or finetuned run is needed"):
        neighbors(NeighborsSpec(model=tmp_path / "other", word="play", corpus=small))
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("A xylophone.\nTwo xylophone sounds.\n")
    with pytest.raises(SesameError, match=r"--word 'xylophone': the tokenizer's vocabulary does not cover it \(it becomes \[UNK\]"):
        neighbors(NeighborsSpec(model=run, word="xylophone", corpus=unknown))
    long = tmp_path / "long.txt"
    long.write_text("play now\n" + "the cat " * 300 + "plays\n")
    with pytest.raises(SesameError, match=r"long.txt:2: the line is 603 tokens, more than the model's 512 positions"):
        neighbors(NeighborsSpec(model=run, word="play", corpus=long, forms="plays"))


def agreement(groups: list[int]) -> float:
    """Share of occurrences whose group matches their sense, under the better of the two pairings."""
    same = sum((g == 0) == (s == SPORT) for g, s in zip(groups, SENSES)) / len(SENSES)
    return max(same, 1 - same)


def test_minilm_separates_the_senses_of_play(tmp_path: Path, one_thread) -> None:
    from sesame.interop import from_hf

    from_hf(minilm(), tmp_path / "minilm")
    result = neighbors(NeighborsSpec(model=tmp_path / "minilm", word="play", corpus=PLAY, forms="plays,played",
                                     k=3))
    occ = result["occurrences"]
    assert [o["line"] for o in occ] == list(range(1, 27))  # one occurrence per line; "playwright" is not one
    same = [SENSES[n["index"]] == SENSES[i] for i, o in enumerate(occ) for n in o["neighbors"]]
    assert sum(same) / len(same) >= 0.85
    last = agreement([o["cluster"] for o in occ])
    assert last >= 0.85
    assert {s["token"] for s in result["static"]} <= {"plays", "playing", "played", "game", "player", "players"}
    # at the embedding layer the vectors group by surface form (play vs plays/played), not by sense
    first = neighbors(NeighborsSpec(model=tmp_path / "minilm", word="play", corpus=PLAY, forms="plays,played", k=3,
                                    layer=0))
    assert agreement([o["cluster"] for o in first["occurrences"]]) < last - 0.2
