"""Subword tokenizers trained and run by Hugging Face ``tokenizers``.

Three kinds, one wrapper:

* ``wordpiece``: BERT's (Devlin et al. 2019): BERT normalisation (lower-casing by default),
  whitespace-and-punctuation pre-tokenisation, ``##`` continuation pieces, and the special tokens
  [PAD] [UNK] [CLS] [SEP] [MASK].
* ``bpe``: GPT-2's byte-level BPE (Radford et al. 2019): text is split by GPT-2's pattern into runs
  of letters, digits, punctuation and spaces before merges are learned, so no merge crosses those
  classes ("dog." "dog!" "dog?" all share "dog"), and every byte is representable (no unknowns).
* ``unigram``: SentencePiece's unigram LM (Kudo 2018) with metaspace pre-tokenisation.
* ``word``: a word vocabulary (the recurrent families: ULMFiT, ELMo, CoVe, the LSTM baselines), the
  ``vocab_size`` most frequent words split as :data:`sesame.data.vectors.WORD` splits them (so GloVe
  vectors line up); other words are ``<unk>`` (WikiText's literal ``<unk>`` included).

Every kind has the same five roles (pad, unk, cls, sep, mask); the first tokens of the vocabulary
are the special ones, in that order of roles. A tokenizer for T5's span corruption also ends with
sentinel tokens ``<extra_id_0>`` … (:func:`train_tokenizer`'s ``sentinels``). A single text encodes as
``cls text sep`` and a pair as ``cls a sep b sep`` (segment 1 for b), an xlnet run's as ``text sep cls`` and
``a sep b sep cls`` (:func:`put_cls_last`); a fine-tuned gpt run's tokenizer appends
GPT's input tokens and encodes with them instead, and a fine-tuned ulmfit run's reads ``sep a`` as its LM read a document
(:mod:`sesame.inputs`).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from tokenizers import Encoding, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .errors import SesameError
from .data.vectors import WORD

ROLES = ("pad", "unk", "cls", "sep", "mask")
SPECIAL_TOKENS: dict[str, dict[str, str]] = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "bpe": {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"},
    "unigram": {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"},
    "word": {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"},
}
KINDS = tuple(SPECIAL_TOKENS)
SENTINEL = "<extra_id_{}>"  # T5's sentinel tokens (Raffel et al. 2020, §3.1.4)
SENTINEL_SHARE = 10  # at most one id in ten is a sentinel, so a tiny vocabulary keeps most of its ids for text
# a token that ends a sentence: full stops, question and exclamation marks, then closing quotes or brackets
SENTENCE_FINAL = re.compile(r"[.!?]+[\"')\]]*")


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the special roles, as the model side needs them (no tokenizer object required)."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @property
    def all(self) -> list[int]:
        return sorted({self.pad, self.unk, self.cls, self.sep, self.mask})


@dataclass
class TextTokenizer:
    """A trained tokenizer plus the ids of its special roles."""

    backend: Tokenizer
    kind: str

    def __post_init__(self) -> None:
        specials = SPECIAL_TOKENS[self.kind]
        ids = {role: self.backend.token_to_id(tok) for role, tok in specials.items()}
        missing = [specials[r] for r, i in ids.items() if i is None]
        if missing:
            raise SesameError(f"tokenizer lacks the special tokens {missing}; train it with `sesame tokenizer train`")
        self.specials = SpecialIds(**ids)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encodings(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int | None = None,
                  special: bool = True) -> list[Encoding]:
        """``tokenizers`` encodings (ids, segment ids, offsets, word ids) per text or pair, truncated to
        ``max_length`` (a pair loses tokens from its longer side first)."""
        if max_length:
            self.backend.enable_truncation(max_length)
        else:
            self.backend.no_truncation()
        inputs = list(zip(texts, pairs)) if pairs is not None else list(texts)
        return self.backend.encode_batch(inputs, add_special_tokens=special)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int | None = None,
               special: bool = True) -> list[list[int]]:
        """Token ids per text (``cls text sep`` unless ``special`` is False), truncated to max_length."""
        return [e.ids for e in self.encodings(texts, pairs, max_length, special)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def word_starts(self) -> torch.Tensor:
        """A bool per vocabulary entry: True where the token begins a word (for whole-word and span masking).

        * wordpiece: every piece not marked ``##``.
        * bpe: pieces whose text (bytes decoded) begins with a space or with neither a letter nor a digit,
          since GPT-2's pre-tokeniser starts each run of punctuation or whitespace afresh. Known miss: the
          first word of a line has no leading space, so it counts as a continuation of what precedes it
          (a newline, or nothing: masking starts a word after every special token anyway). A piece
          beginning inside a multi-byte character counts as a continuation.
        * unigram: pieces beginning with ``▁`` or with neither a letter nor a digit (punctuation).

        Special tokens count as word starts.
        """
        if self.kind == "bpe":
            texts = self.backend.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=False)
            starts = [not (t[:1].isalnum() or t[:1] == "\ufffd") for t in texts]
        else:
            starts = [True] * self.vocab_size
            for token, i in self.backend.get_vocab().items():
                starts[i] = not token.startswith("##") if self.kind == "wordpiece" else not token[:1].isalnum()
        for i in self.specials.all:
            starts[i] = True
        return torch.tensor(starts)

    def sentinels(self) -> torch.Tensor:
        """The ids of T5's sentinels ``<extra_id_0>``, ``<extra_id_1>``, … (empty when it has none)."""
        ids = []
        while (i := self.backend.token_to_id(SENTINEL.format(len(ids)))) is not None:
            ids.append(i)
        return torch.tensor(ids, dtype=torch.long)

    def sentence_ends(self) -> torch.Tensor:
        """A bool per vocabulary entry: True where the token ends a sentence: its text (decoded, without
        spaces) is full stops, question or exclamation marks, then perhaps closing quotes or brackets
        (``.``, ``?!``, ``."``), as fairseq's BART finds sentences at GPT-2's full-stop token; and the
        separator, which ends a document."""
        texts = self.backend.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=False)
        ends = [SENTENCE_FINAL.fullmatch(t.strip()) is not None for t in texts]
        ends[self.specials.sep] = True
        return torch.tensor(ends)

    def save(self, path: str | Path) -> None:
        self.backend.no_truncation()
        self.backend.save(str(path))

    @classmethod
    def load(cls, path: str | Path) -> "TextTokenizer":
        path = Path(path)
        if not path.is_file():
            raise SesameError(f"{path}: no tokenizer.json here; train one with `sesame tokenizer train`")
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust side raises plain Exception
            raise SesameError(f"{path}: not a tokenizers JSON file ({err})") from None
        model = type(backend.model).__name__.lower()
        kind = {"wordpiece": "wordpiece", "bpe": "bpe", "unigram": "unigram", "wordlevel": "word"}.get(model)
        if kind is None:
            raise SesameError(f"{path}: a {model} tokenizer is not supported; use wordpiece, bpe, unigram or word")
        return cls(backend, kind)


def sentinel_count(vocab_size: int, asked: int) -> int:
    """The sentinels a tokenizer trained with ``vocab_size`` ids ends with when ``asked`` for some (one id in
    :data:`SENTINEL_SHARE` at most)."""
    return min(asked, vocab_size // SENTINEL_SHARE)


def train_tokenizer(texts: Iterable[str] | Callable[[], Iterable[str]], kind: str, vocab_size: int = 8000,
                    lowercase: bool | None = None, min_frequency: int = 2, show_progress: bool = False, *,
                    sentinels: int = 0) -> TextTokenizer:
    """Train a tokenizer of ``kind`` on texts, or on a function that reads them afresh (WordPiece reads them twice;
    a one-shot iterator is kept in memory for that).

    ``sentinels`` > 0 ends the vocabulary with T5's sentinel tokens, counting down from the top as T5's do
    (``<extra_id_0>`` is the last id, ``vocab_size − 1``), within ``vocab_size``: as many as asked (T5: 100), but
    at most a tenth of ``vocab_size`` (:data:`SENTINEL_SHARE`).

    ``lowercase`` defaults to True for WordPiece (uncased BERT) and False for the others. The same texts give the
    same tokenizer, byte for byte, in any process (:func:`_deterministic`).
    """
    if not callable(texts):
        kept = list(texts) if kind == "wordpiece" and iter(texts) is texts else texts
        texts = lambda: kept
    if kind not in SPECIAL_TOKENS:
        raise SesameError(f"--kind {kind!r} is unknown; choose one of: {', '.join(KINDS)}")
    if vocab_size < 100:
        raise SesameError(f"--vocab-size {vocab_size} is too small; use at least 100")
    if sentinels < 0:
        raise SesameError(f"--sentinels {sentinels}: use 0 (none) or more (T5: 100)")
    sentinels = sentinel_count(vocab_size, sentinels)
    specials = [SPECIAL_TOKENS[kind][r] for r in ROLES]
    vocab_size -= sentinels  # the learned tokens; the sentinels come on top
    if kind == "wordpiece":
        lower = True if lowercase is None else lowercase
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lower, strip_accents=lower, clean_text=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials + _continuations(tok, texts(), specials),
                                            show_progress=show_progress)
    elif kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
        if lowercase:
            tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Split(Regex(WORD.pattern), "isolated")])
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                            show_progress=show_progress)
        # the trainer would count a special token's literal (WikiText's "<unk>") as a new word with a second id
        literals = re.compile("|".join(map(re.escape, specials)))
        read = texts
        texts = lambda: (literals.sub(" ", text) for text in read())
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        if lowercase:
            tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=show_progress)
    else:
        steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence(steps)
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>",
                                          show_progress=show_progress)
    tok.train_from_iterator(texts(), trainer)
    if tok.get_vocab_size() <= len(specials):
        raise SesameError("the corpus is empty: the tokenizer learned no tokens; check the --corpus files")
    tok = _deterministic(tok, kind)
    tok.add_special_tokens([SENTINEL.format(k) for k in reversed(range(sentinels))])
    names = SPECIAL_TOKENS[kind]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{names['cls']} $A {names['sep']}",
        pair=f"{names['cls']} $A {names['sep']} $B:1 {names['sep']}:1",
        special_tokens=[(names[r], tok.token_to_id(names[r])) for r in ("cls", "sep")],
    )
    return TextTokenizer(tok, kind)


def put_cls_last(tok: TextTokenizer) -> None:
    """Give ``tok`` XLNet's template: ``a <sep> <cls>`` and ``a <sep> b <sep> <cls>``, segment 0 for a and its
    separator, 1 for b and its separator, 2 for the class token (XLNet's ``build_inputs_with_special_tokens`` and
    ``SEG_ID_CLS``: XLNet's code reads the class token last, where the paper, §2.5, writes BERT's [CLS, A, SEP, B,
    SEP]). The tokens are the tokenizer's cls and sep roles (a unigram tokenizer's ``<s>`` and ``</s>``)."""
    cls, sep = (tok.backend.id_to_token(i) for i in (tok.specials.cls, tok.specials.sep))
    tok.backend.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {sep}:0 {cls}:2", pair=f"$A:0 {sep}:0 $B:1 {sep}:1 {cls}:2",
        special_tokens=[(cls, tok.specials.cls), (sep, tok.specials.sep)])


def _continuations(tok: Tokenizer, texts: Iterable[str], specials: list[str]) -> list[str]:
    """WordPiece's continuation pieces of single characters (``##e``), in character order.

    The trainer gives them ids in the hash order of the words, which differs from one process to the next, and
    breaks ties between equally frequent merges by id; given beforehand (as special tokens, which
    :func:`_deterministic` turns back into ordinary ones), their ids are fixed and so is the vocabulary. A first
    pass that learns no merges lists them.
    """
    probe = Tokenizer.from_str(tok.to_str())
    probe.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=0, special_tokens=specials,
                                                               show_progress=False))
    return sorted(t for t in probe.get_vocab() if t.startswith("##") and len(t) == 3)


UNIGRAM_DIGITS = 6  # scores are rounded to this many decimals, below the last-digit noise of their sums
UNIGRAM_STEP = 0.0001  # tokenizers' UnigramTrainer: the k-th character added back scores the lowest + k × this


def _deterministic(tok: Tokenizer, kind: str) -> Tokenizer:
    """``tok`` as the trainer would make it if it did not iterate hash maps (whose order is random per process).

    * wordpiece: the continuation pieces given as special tokens (:func:`_continuations`) become ordinary pieces.
    * unigram: EM sums the expected counts over words in hash order, so scores differ in their last digits; and
      the characters EM dropped come back at the lowest score plus k steps, k in hash order. Those characters, and
      the characters EM kept at the lowest score, get their steps in character order (a character is on step k when
      its score is within 10^-:data:`UNIGRAM_DIGITS` of it: EM's noise reaches 10^-10, and which characters EM
      drops among the tied ones differs too), every score is rounded to :data:`UNIGRAM_DIGITS` decimals, and pieces
      are ordered by score, then piece (specials stay first).
    * bpe, word: already deterministic (ties broken by the characters' sorted ids, or by the word).
    """
    data = json.loads(tok.to_str())
    roles = set(SPECIAL_TOKENS[kind].values())
    if kind == "wordpiece":
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in roles]
    elif kind == "unigram":
        vocab = data["model"]["vocab"]
        specials, pieces = vocab[:len(roles)], dict(vocab[len(roles):])
        singles = {piece: score for piece, score in pieces.items() if len(piece) == 1}
        low, step, added = min(pieces.values()), 0.0, []
        while on_step := [p for p, s in singles.items() if abs(s - low - step) < 10 ** -UNIGRAM_DIGITS]:
            added += on_step  # the rungs the trainer's added characters stand on, as it climbs them
            step += UNIGRAM_STEP
        step = 0.0
        for piece in sorted(added):
            pieces[piece] = low + step
            step += UNIGRAM_STEP
        rounded = sorted(((p, round(s, UNIGRAM_DIGITS)) for p, s in pieces.items()), key=lambda ps: (-ps[1], ps[0]))
        data["model"]["vocab"] = specials + [list(ps) for ps in rounded]
    else:
        return tok
    return Tokenizer.from_str(json.dumps(data))


def extend_words(tok: TextTokenizer, texts: Iterable[str], max_new: int, min_frequency: int = 2
                 ) -> tuple[TextTokenizer, int]:
    """A word tokenizer with the words of ``texts`` it lacks appended after its own, whose ids stay the same:
    the ``max_new`` most frequent of those seen at least ``min_frequency`` times. ULMFiT fine-tunes its LM on
    the target task's vocabulary (Howard & Ruder 2018, §3.2; their code starts a new word at the mean
    embedding). Returns the tokenizer and the number of words added."""
    if tok.kind != "word":
        raise ValueError(f"extend_words: a word tokenizer is needed, not {tok.kind}")
    normalizer, pre_tokenizer = tok.backend.normalizer, tok.backend.pre_tokenizer
    counts: Counter[str] = Counter()
    for text in texts:
        text = normalizer.normalize_str(text) if normalizer is not None else text
        counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(text))
    vocab = tok.backend.get_vocab()
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    new = [w for w, n in ranked if n >= min_frequency and w not in vocab][:max_new]
    data = json.loads(tok.backend.to_str())
    data["model"]["vocab"].update({w: len(vocab) + i for i, w in enumerate(new)})
    return TextTokenizer(Tokenizer.from_str(json.dumps(data)), "word"), len(new)
