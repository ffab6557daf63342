"""``sesame neighbors``: a word's contextual vectors, occurrence by occurrence, beside its one static vector.

A static embedding gives a word one vector, whatever sentence it is in; a contextual model gives each
occurrence its own (Peters et al. 2018, §5.3: ELMo's nearest neighbours of "play" separate its sports
and theatre senses; Ethayarajh 2019 measures how context-specific such vectors are). For a word in a
small corpus this module lists

* static: the word's row of the run's input-embedding table (the mean of its subword rows) and the
  nearest whole-word vocabulary entries by cosine: one list, the same for every occurrence;
* contextual: each occurrence's vector (the mean of the hidden states, at one layer, of the subword
  tokens covering it, found through the tokenizer's character offsets), its nearest other
  occurrences by cosine, and a spherical k-means split of all occurrences (Dhillon & Modha 2001,
  seeded by k-means++, Arthur & Vassilvitskii 2007; the best of a few restarts), so senses that
  separate show up as groups.

An occurrence is a whole word, case-insensitive: the word or one of ``forms`` where no letter,
digit, underscore or hyphen touches it (so "play" counts in "play's" but not in "playwright" or
"role-play"). docs/neighbors.md shows it on MiniLM.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..data.corpus import decoded_lines
from ..errors import SesameError
from ..models import EncoderDecoder, position_limit
from ..options import option
from ..run import load_backbone, load_tokenizer
from ..runtime import Runtime, device_of, to_device
from ..sources import opened
from ..tokenizer import TextTokenizer

WORD = re.compile(r"\w+(?:['-]\w+)*")
BATCH = 32
RESTARTS = 10


@dataclass(kw_only=True)
class NeighborsSpec:
    """``sesame neighbors``: a model, a word (and its other forms), a corpus, and what to list."""
    model: str = option(help="a pretrained or fine-tuned run, a transformers model directory, or minilm (the "
                             "installed all-MiniLM-L6-v2)")
    word: str = option(help="the word to look up (whole word, any case)")
    corpus: str = option(help="a text file, one sentence per line")
    forms: str = option("", help="other forms to count as the word, comma-separated, e.g. plays,played")
    k: int = option(3, help="neighbours per list")
    layer: int | None = option(None, help="hidden layer of the contextual vectors: 0 = embeddings (default: last)")
    clusters: int = option(2, help="group the occurrences into N by k-means (0 = off)")
    seed: int = option(0, help="seed of the k-means restarts")
    runtime: Runtime = option(factory=Runtime, cli=False, help="device and precision (sesame.runtime)")


@dataclass
class Occurrence:
    line: int  # 1-based line number in the corpus
    start: int  # character span of the word in the line
    end: int
    sentence: str


def find_occurrences(corpus: Path, forms: Sequence[str]) -> list[Occurrence]:
    """Every whole-word, case-insensitive occurrence of ``forms`` in the corpus, line by line."""
    pattern = re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, forms)) + r")(?![\w-])", re.IGNORECASE)
    found = []
    for lineno, line in decoded_lines(corpus):
        sentence = line.rstrip("\r\n")
        found += [Occurrence(lineno, m.start(), m.end(), sentence) for m in pattern.finditer(sentence)]
    return found


def _covering(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """Positions of the tokens whose character offsets overlap [start, end) (special tokens have none)."""
    return [i for i, (a, b) in enumerate(offsets) if a < end and b > start]


@torch.inference_mode()
def contextual_vectors(backbone: torch.nn.Module, tok: TextTokenizer, occurrences: list[Occurrence], layer: int,
                       corpus: Path) -> torch.Tensor:
    """One vector per occurrence: the mean of ``layer``'s hidden states over the tokens covering it
    (layer 0 is the embedding output, the last layer the backbone's output), computed on the backbone's device
    and returned on the CPU in float32. Each line is read as the tokenizer's template gives a single text, with its
    segment ids (XLNet's ``a <sep> <cls>``: 0 … 0 2, the class token in its own segment as pre-trained and as
    fine-tuning reads it; every other template's are all 0, a backbone's default segment); a line longer than a
    learned position table is refused (XLNet and recurrent models read any length). An encoder-decoder's (T5,
    BART) vectors are its encoder's states, layer ``i`` of ``config.layers`` encoder layers."""
    lines = sorted({o.line: o.sentence for o in occurrences}.items())
    row = {lineno: i for i, (lineno, _) in enumerate(lines)}
    encodings = tok.encodings([sentence for _, sentence in lines])
    limit = position_limit(backbone.config)  # None: any length (XLNet's relative positions, recurrent)
    for (lineno, _), enc in zip(lines, encodings):
        if limit is not None and len(enc.ids) > limit:
            raise SesameError(f"--corpus {corpus}:{lineno}: the line is {len(enc.ids)} tokens, more than the "
                              f"model's {limit} positions; split it into shorter lines")
    hidden = []
    for first in range(0, len(encodings), BATCH):
        chunk = encodings[first: first + BATCH]
        width = max(len(e.ids) for e in chunk)
        ids = torch.full((len(chunk), width), tok.specials.pad)
        types = torch.zeros(len(chunk), width, dtype=torch.long)
        padding = torch.zeros(len(chunk), width, dtype=torch.bool)
        for i, e in enumerate(chunk):
            ids[i, : len(e.ids)] = torch.tensor(e.ids)
            types[i, : len(e.ids)] = torch.tensor(e.type_ids)
            padding[i, : len(e.ids)] = True
        ids, types, padding = to_device((ids, types, padding), device_of(backbone))
        if isinstance(backbone, EncoderDecoder):
            states = backbone.encoder_layers(ids, padding)[layer]
        else:
            states = backbone(ids, types=types, padding=padding, all_layers=True)[layer]
        hidden += list(states.float().cpu())
    vectors = []
    for o in occurrences:
        positions = _covering(encodings[row[o.line]].offsets, o.start, o.end)
        vectors.append(hidden[row[o.line]][positions].mean(0))
    return torch.stack(vectors)


def _vocabulary_words(tok: TextTokenizer) -> tuple[list[int], list[str]]:
    """Ids and texts of the vocabulary entries that are whole words: they begin a word (no ``##``
    continuation, a BPE piece with its leading space, a Unigram piece with its ``▁``), are made of
    letters only, and are not special tokens."""
    starts = tok.word_starts()
    if tok.kind == "bpe":
        texts = tok.backend.decode_batch([[i] for i in range(tok.vocab_size)], skip_special_tokens=False)
    else:
        texts = [""] * tok.vocab_size
        for token, i in tok.backend.get_vocab().items():
            texts[i] = token.lstrip("▁") if tok.kind == "unigram" else token
    specials = set(tok.specials.all)
    kept = [(i, t.strip()) for i, t in enumerate(texts)
            if starts[i] and i not in specials and t.strip().isalpha()]
    return [i for i, _ in kept], [t for _, t in kept]


def static_neighbors(table: torch.Tensor, tok: TextTokenizer, word: str, k: int) -> list[dict]:
    """The ``k`` whole-word vocabulary entries nearest (cosine) to the word's input-embedding vector,
    the mean of the rows of its subword tokens (tokenized as a word inside a sentence, after a space)."""
    enc = tok.encodings([" " + word], special=False)[0]
    pieces = [enc.ids[i] for i in _covering(enc.offsets, 1, 1 + len(word))]
    if not pieces or tok.specials.unk in pieces:
        raise SesameError(f"--word {word!r}: the tokenizer's vocabulary does not cover it (it becomes "
                          f"{tok.backend.id_to_token(tok.specials.unk)} or nothing); choose a word it covers")
    ids, texts = _vocabulary_words(tok)
    keep = [j for j, t in enumerate(texts) if t.lower() != word.lower()]
    scores = F.cosine_similarity(table[[ids[j] for j in keep]], table[pieces].mean(0, keepdim=True))
    top = scores.topk(min(k, len(keep)))
    return [{"token": texts[keep[j]], "score": round(s, 4)} for s, j in zip(top.values.tolist(), top.indices.tolist())]


def spherical_kmeans(x: torch.Tensor, k: int, seed: int, iterations: int = 100) -> list[int]:
    """Cluster unit vectors by cosine: k-means++ seeding on 1 − cos, then assign to the nearest
    centre and re-normalise the centres' sums until nothing moves; the best of ``RESTARTS`` seeded
    runs (highest total cosine to the centres). Groups are numbered by their first member."""
    generator = torch.Generator().manual_seed(seed)
    best, best_score = None, -float("inf")
    for _ in range(RESTARTS):
        chosen = [int(torch.randint(len(x), (1,), generator=generator))]
        while len(chosen) < k:
            distance = (1 - x @ x[chosen].T).clamp(min=0).min(1).values
            chosen.append(int(torch.multinomial(distance ** 2 + 1e-12, 1, generator=generator)))
        centres = x[chosen]
        for _ in range(iterations):
            assign = (x @ centres.T).argmax(1)
            sums = torch.zeros_like(centres).index_add_(0, assign, x)
            moved = F.normalize(torch.where(sums.norm(dim=1, keepdim=True) > 0, sums, centres), dim=1)
            if torch.equal(moved, centres):
                break
            centres = moved
        similarity = x @ centres.T
        score = float(similarity.max(1).values.sum())
        if score > best_score:
            best, best_score = similarity.argmax(1).tolist(), score
    order = {c: i for i, c in enumerate(dict.fromkeys(best))}
    return [order[c] for c in best]


def neighbors(spec: NeighborsSpec) -> dict:
    """Static and contextual nearest neighbours of ``spec.word`` (and its ``forms``) in ``spec.corpus`` for a
    pretrained or fine-tuned model: a JSON-able dict (see docs/neighbors.md)."""
    with opened(spec.model, "--model") as (_, run):
        return _neighbors(run, spec)


def _neighbors(run: Path, spec: NeighborsSpec) -> dict:
    corpus, word, k, clusters = Path(spec.corpus), spec.word.strip(), spec.k, spec.clusters
    forms = list(dict.fromkeys([word] + [f.strip() for f in spec.forms.split(",") if f.strip()]))
    for form in forms:
        if not WORD.fullmatch(form):
            raise SesameError(f"--word/--forms {form!r}: not a single word; give letters and digits "
                              "(inner hyphens and apostrophes allowed)")
    if k < 1:
        raise SesameError(f"--k {k}: give at least 1 neighbour")
    if not corpus.is_file():
        raise SesameError(f"--corpus {corpus}: no such file; give a text file with one sentence per line")
    occurrences = find_occurrences(corpus, forms)
    if len(occurrences) < 2:
        raise SesameError(f"--word {word!r}: {len(occurrences)} occurrence(s) of {', '.join(forms)} in {corpus}; "
                          "at least 2 are needed (check the spelling, or add --forms)")
    if clusters and not 2 <= clusters <= len(occurrences):
        raise SesameError(f"--clusters {clusters}: give 0 (none) or 2 to {len(occurrences)}, the number of "
                          "occurrences")
    placement = spec.runtime.place()
    backbone = placement.model(load_backbone(run, "--model"))
    tok = load_tokenizer(run, "--model")
    depth = backbone.config.layers
    layer = depth if spec.layer is None else spec.layer
    if not 0 <= layer <= depth:
        raise SesameError(f"--layer {layer}: this model has layers 0 (embeddings) to {depth}")
    static = static_neighbors(backbone.embed.tokens.weight.detach().float().cpu(), tok, word, k)
    with placement.autocast():
        vectors = F.normalize(contextual_vectors(backbone, tok, occurrences, layer, corpus), dim=1)
    similarity = (vectors @ vectors.T).fill_diagonal_(-float("inf"))
    k_near = min(k, len(occurrences) - 1)
    top = similarity.topk(k_near, dim=1)
    groups = spherical_kmeans(vectors, clusters, spec.seed) if clusters else None
    return {
        "word": word, "forms": forms, "corpus": str(corpus), "layer": layer, "layers": depth, "k": k_near,
        "static": static,
        "occurrences": [
            {"line": o.line, "start": o.start, "end": o.end, "text": o.sentence[o.start: o.end],
             "sentence": o.sentence, "cluster": groups[i] if groups else None,
             "neighbors": [{"index": j, "score": round(s, 4)} for s, j in zip(scores, indices)]}
            for i, (o, scores, indices) in enumerate(zip(occurrences, top.values.tolist(), top.indices.tolist()))],
        "clusters": [[i for i, g in enumerate(groups) if g == c] for c in range(clusters)] if groups else [],
    }


def snippet(occurrence: dict, width: int = 32) -> str:
    """The occurrence's sentence cut at a space within ``width`` characters either side, the word in *stars*."""
    s, a, b = occurrence["sentence"], occurrence["start"], occurrence["end"]
    left = "…" + s[a - width: a].split(" ", 1)[-1] if a > width else s[:a]
    right = s[b: b + width].rsplit(" ", 1)[0] + "…" if len(s) - b > width else s[b:]
    return f"{left}*{s[a:b]}*{right}"


def format_neighbors(result: dict) -> str:
    """The readable report of :func:`neighbors`."""
    occ = result["occurrences"]
    out = [f"{result['word']!r} in {result['corpus']}: {len(occ)} occurrences of {', '.join(result['forms'])}",
           "",
           "static (the input-embedding row; one list whatever the context):",
           "  " + "  ".join(f"{n['token']} {n['score']:.2f}" for n in result["static"]),
           "",
           f"contextual (layer {result['layer']} of {result['layers']}): each occurrence's {result['k']} nearest "
           "other occurrences, cosine"]
    for i, o in enumerate(occ):
        out.append(f"  [{i}] line {o['line']}: {snippet(o)}")
        out += [f"      {n['score']:.2f} [{n['index']}] {snippet(occ[n['index']])}" for n in o["neighbors"]]
    if result["clusters"]:
        out += ["", f"{len(result['clusters'])} groups (spherical k-means on the contextual vectors):"]
        for c, members in enumerate(result["clusters"]):
            out.append(f"  group {c + 1} ({len(members)}):")
            out += [f"    [{i}] {snippet(occ[i])}" for i in members]
    return "\n".join(out)
