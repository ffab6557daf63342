"""A Hugging Face checkpoint's tokenizer ⇄ sesame's tokenizer.json.

Import builds the tokenizer ``transformers``' AutoTokenizer would: the checkpoint's ``tokenizer.json``
as it is, or else the tokenizer class's pipeline over its vocabulary files, with the options of
``tokenizer_config.json``:

* ``vocab.txt`` (BERT, ELECTRA, DistilBERT): BERT normalisation (``do_lower_case``, default on;
  ``strip_accents``; ``tokenize_chinese_chars``), BERT pre-tokenisation, WordPiece, ``[CLS] a [SEP] b [SEP]``;
* ``vocab.json`` + ``merges.txt`` (RoBERTa, GPT-2): byte-level BPE (``add_prefix_space``, default off);
  RoBERTa's ``<s> a </s></s> b </s>``; GPT-2 adds no special tokens (unless ``add_bos_token``,
  ``add_eos_token``).

sesame finds the five roles (pad, unk, cls, sep, mask) by their names in ``SPECIAL_TOKENS`` of
``sesame.tokenizer``. Where the checkpoint names a role differently, it is renamed in place, keeping
its id (ALBERT's ``[CLS]`` becomes ``<s>``). Where a role has no token of its own (GPT-2's pad and
mask, and the unk, bos and eos that all are ``<|endoftext|>``), an entry of sesame's name is appended
to the model's vocabulary, an *alias* whose embedding row is a copy of the checkpoint's token for
that role (else of its sep/eos token). Aliases are plain vocabulary entries, not added tokens, so no
text ever produces them (pre-tokenisation splits ``<``, ``s`` and ``>`` apart and no merge joins
them): the tokenisation of every text is unchanged, a literal "<s>" in GPT-2 text included.
A Unigram vocabulary (a list, where an id is a position) cannot take such entries; where the model has
unused rows after the tokenizer's last id (T5's 32,128 rows for 32,100 tokens), its missing roles (T5's
cls and mask) become special added tokens at the next ids, reading rows the tokenizer never produced,
left as they are (a literal "<s>" or "<mask>" in the text is then that token).
Where sesame's name is already a token of the checkpoint's that holds no role, the two swap names (XLNet's ``<cls>``
and ``<sep>`` are its cls and sep roles, while its ``<s>`` and ``</s>`` are bos and eos, which sesame does not use:
``<cls>`` becomes ``<s>`` and ``<s>`` becomes ``<cls>``, each keeping its id; a literal "<s>" in a text is then
XLNet's ``<cls>``).
Export undoes all three: renamed tokens get their names back, added roles are removed, and aliases
whose rows are still copies are dropped (with their rows), so a checkpoint comes back as it went in.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import SesameError
from ..tokenizer import ROLES, SPECIAL_TOKENS, TextTokenizer
from ..train.checkpoint import read_json

SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")
ROLE_KEYS = {"pad": ("pad_token",), "unk": ("unk_token",), "cls": ("cls_token", "bos_token"),
             "sep": ("sep_token", "eos_token"), "mask": ("mask_token",)}
KIND_OF_MODEL = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}


def _optional_json(path: Path) -> dict:
    return read_json(path) if path.is_file() else {}


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def special_tokens(src: Path, defaults: dict[str, str | None], options: dict) -> dict[str, str | None]:
    """The checkpoint's special tokens: the tokenizer class's ``defaults``, overridden by
    special_tokens_map.json and tokenizer_config.json."""
    specials = dict(defaults)
    for given in (_optional_json(src / "special_tokens_map.json"), options):
        specials.update({k: _content(given[k]) for k in SPECIAL_KEYS if k in given})
    return specials


def _vocab_files(src: Path, names: tuple[str, ...]) -> list[Path]:
    paths = [src / n for n in names]
    if not all(p.is_file() for p in paths):
        raise SesameError(f"{src}: no tokenizer; give tokenizer.json, vocab.txt (WordPiece) or vocab.json and "
                          "merges.txt (byte-level BPE)")
    return paths


def _special_id(vocab: dict[str, int], token: str, path: Path) -> int:
    if token not in vocab:
        raise SesameError(f"{path}: the special token {token!r} is not in the vocabulary; name the checkpoint's own in "
                          "tokenizer_config.json (cls_token, sep_token, ...)")
    return vocab[token]


def _wordpiece(src: Path, options: dict, specials: dict) -> Tokenizer:
    """transformers' BertTokenizer over vocab.txt."""
    (path,) = _vocab_files(src, ("vocab.txt",))
    vocab = {line.rstrip("\n"): i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines())}
    unk, cls, sep = (specials[k] for k in ("unk_token", "cls_token", "sep_token"))
    _, cls_id, sep_id = (_special_id(vocab, t, path) for t in (unk, cls, sep))
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=options.get("tokenize_chinese_chars", True),
        strip_accents=options.get("strip_accents"), lowercase=options.get("do_lower_case", True))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)])
    return tok


def _byte_level(src: Path, options: dict) -> tuple[Tokenizer, dict[str, int], Path]:
    """Byte-level BPE over vocab.json and merges.txt, as transformers' RobertaTokenizer and GPT2Tokenizer."""
    vocab_path, merges_path = _vocab_files(src, ("vocab.json", "merges.txt"))
    vocab = read_json(vocab_path)
    merges = [tuple(line.split()) for line in merges_path.read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#version")]
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=options.get("add_prefix_space", False))
    tok.decoder = decoders.ByteLevel()
    return tok, vocab, vocab_path


def _roberta(src: Path, options: dict, specials: dict) -> Tokenizer:
    tok, vocab, path = _byte_level(src, options)
    cls, sep = specials["cls_token"], specials["sep_token"]
    tok.post_processor = processors.RobertaProcessing(
        (sep, _special_id(vocab, sep, path)), (cls, _special_id(vocab, cls, path)),
        trim_offsets=options.get("trim_offsets", True), add_prefix_space=options.get("add_prefix_space", False))
    return tok


def _gpt2(src: Path, options: dict, specials: dict) -> Tokenizer:
    """GPT-2's byte-level BPE; ``add_bos_token`` / ``add_eos_token`` put bos before / eos after each text."""
    tok, vocab, path = _byte_level(src, options)
    bos, eos = ([specials[f"{k}_token"]] if options.get(f"add_{k}_token") else [] for k in ("bos", "eos"))
    if bos or eos:
        def text(name: str, segment: int) -> str:
            return " ".join([f"{t}:{segment}" for t in bos] + [f"${name}:{segment}"] + [f"{t}:{segment}" for t in eos])

        tok.post_processor = processors.TemplateProcessing(
            single=text("A", 0), pair=f"{text('A', 0)} {text('B', 1)}",
            special_tokens=[(t, _special_id(vocab, t, path)) for t in dict.fromkeys(bos + eos)])
    return tok


def _json_only(src: Path, options: dict, specials: dict) -> Tokenizer:
    raise SesameError(f"{src}: no tokenizer.json; this architecture's tokenizer converts only from tokenizer.json "
                      "(save it with a fast tokenizer: AutoTokenizer.from_pretrained(...).save_pretrained(DIR))")


BUILDERS = {"wordpiece": _wordpiece, "roberta": _roberta, "gpt2": _gpt2, "json": _json_only}


def _renamed(node: Any, names: dict[str, str]) -> Any:
    """A tokenizer's JSON with every token named a key of ``names`` renamed to its value (vocabulary,
    added tokens, templates), keeping its id."""
    if isinstance(node, str):
        return names.get(node, node)
    if isinstance(node, list):
        return [_renamed(x, names) for x in node]
    if isinstance(node, dict):
        return {names.get(k, k): _renamed(v, names) for k, v in node.items()}
    return node


def import_tokenizer(src: Path, *, builder: str, defaults: dict[str, str | None], model_vocab: int
                     ) -> tuple[TextTokenizer, dict, dict[int, int]]:
    """(sesame tokenizer, the record export needs, {alias id: id whose embedding row it copies}) of the checkpoint
    ``src``, whose tokenizer class has the special tokens ``defaults`` and builds from vocabulary files with
    ``BUILDERS[builder]``."""
    options = _optional_json(src / "tokenizer_config.json")
    specials = special_tokens(src, defaults, options)
    if (src / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(src / "tokenizer.json"))
        except Exception as err:  # the Rust side raises plain Exception
            raise SesameError(f"{src / 'tokenizer.json'}: not a tokenizers JSON file ({err})") from None
    else:
        tok = BUILDERS[builder](src, options, specials)
    tok.no_truncation()
    tok.no_padding()
    present = [t for t in dict.fromkeys(specials.values()) if t is not None and tok.token_to_id(t) is not None]
    added = {t.content for t in tok.get_added_tokens_decoder().values()}  # keep theirs (RoBERTa's <mask> lstrips)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in present if t not in added])
    kind = KIND_OF_MODEL.get(type(tok.model).__name__)
    if kind is None:
        raise SesameError(f"{src}: a {type(tok.model).__name__} tokenizer; sesame runs WordPiece, BPE and Unigram")

    names = SPECIAL_TOKENS[kind]
    holder = {role: next((specials.get(k) for k in keys if specials.get(k) in present), None)
              for role, keys in ROLE_KEYS.items()}
    shared = Counter(holder.values())
    renamed = {}
    for r in ROLES:
        old, new = holder[r], names[r]
        if old in (None, new) or shared[old] != 1:
            continue
        if tok.token_to_id(new) is None:
            renamed[old] = new
        elif new not in shared:  # XLNet: its <cls> is sesame's <s>, and its own <s> (bos, no role here) takes <cls>
            renamed |= {old: new, new: old}
    aliases = {names[r]: holder[r] or holder["sep"] for r in ROLES
               if holder[r] != names[r] and holder[r] not in renamed}
    data = _renamed(json.loads(tok.to_str()), renamed)
    for name, source in aliases.items():
        if source is None:
            raise SesameError(f"{src}: the tokenizer has no token for sesame's {name!r} and no sep/eos token to stand "
                              "in for it; set sep_token or eos_token in tokenizer_config.json")
        if tok.token_to_id(name) is not None:
            raise SesameError(f"{src}: {name!r} is an ordinary token of this vocabulary, so it cannot become sesame's "
                              f"special token; this checkpoint's tokenizer is not convertible")
    size, listed = tok.get_vocab_size(), not isinstance(data["model"]["vocab"], dict)
    spare = list(aliases) if listed and size + len(aliases) <= model_vocab else []
    appended = {n: s for n, s in aliases.items() if n not in spare}
    if appended:
        if size != model_vocab or listed:
            raise SesameError(f"{src}: cannot append sesame's special tokens {list(aliases)}: that needs a WordPiece "
                              f"or BPE vocabulary of config.json's vocab_size {model_vocab}, or a Unigram one with as "
                              f"many unused rows (it has {size} tokens)")
        data["model"]["vocab"].update({name: model_vocab + k for k, name in enumerate(appended)})
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in spare])  # ids size, size + 1, ...
    rows = {tok.token_to_id(n): tok.token_to_id(renamed.get(s, s)) for n, s in appended.items()}
    record = {"special_tokens": specials, "renamed": renamed, "aliases": aliases, "spare": spare}
    return TextTokenizer(tok, kind), record, rows


def export_tokenizer(tok: TextTokenizer, record: dict | None, drop_aliases: bool) -> tuple[str, dict[str, str]]:
    """(tokenizer.json text, special tokens for tokenizer_config.json): the checkpoint's names back
    for a run imported from Hugging Face (its aliases dropped if ``drop_aliases``), else sesame's roles
    (bos and eos: cls and sep)."""
    if record is None:
        names = SPECIAL_TOKENS[tok.kind]
        specials = {f"{r}_token": names[r] for r in ROLES}
        if tok.kind != "wordpiece":
            specials.update(bos_token=names["cls"], eos_token=names["sep"])
        return tok.backend.to_str(), specials
    data = _renamed(json.loads(tok.backend.to_str()), {new: old for old, new in record["renamed"].items()})
    spare = record.get("spare", [])
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in spare]  # their rows are the model's
    if drop_aliases:
        for name in record["aliases"]:
            if name not in spare:
                del data["model"]["vocab"][name]
    return json.dumps(data, ensure_ascii=False), {k: v for k, v in record["special_tokens"].items() if v is not None}
