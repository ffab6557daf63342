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
are the special ones, in that order of roles. A single text encodes as ``cls text sep`` and a pair
as ``cls a sep b sep`` (segment 1 for b); a fine-tuned gpt run's tokenizer appends GPT's input tokens
and encodes with them instead, and a fine-tuned ulmfit run's reads ``sep a`` as its LM read a document
(:mod:`sesame.tasks.inputs`).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

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


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int = 8000, lowercase: bool | None = None,
                    min_frequency: int = 2, show_progress: bool = False) -> TextTokenizer:
    """Train a tokenizer of ``kind`` on an iterable of texts.

    ``lowercase`` defaults to True for WordPiece (uncased BERT) and False for the others.
    """
    if kind not in SPECIAL_TOKENS:
        raise SesameError(f"--kind {kind!r} is unknown; choose one of: {', '.join(KINDS)}")
    if vocab_size < 100:
        raise SesameError(f"--vocab-size {vocab_size} is too small; use at least 100")
    specials = [SPECIAL_TOKENS[kind][r] for r in ROLES]
    if kind == "wordpiece":
        lower = True if lowercase is None else lowercase
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lower, strip_accents=lower, clean_text=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials, show_progress=show_progress)
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
        texts = (literals.sub(" ", text) for text in texts)
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
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() <= len(specials):
        raise SesameError("the corpus is empty: the tokenizer learned no tokens; check the --corpus files")
    names = SPECIAL_TOKENS[kind]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{names['cls']} $A {names['sep']}",
        pair=f"{names['cls']} $A {names['sep']} $B:1 {names['sep']}:1",
        special_tokens=[(names[r], tok.token_to_id(names[r])) for r in ("cls", "sep")],
    )
    return TextTokenizer(tok, kind)


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
