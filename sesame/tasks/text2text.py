"""Text-to-text (``text2text``): every task as text in, text out, for an encoder-decoder (T5, Raffel et al. 2020,
§2.4): the encoder reads an input that names the task, the decoder writes the answer as text, and one loss, the
teacher-forced cross-entropy of the answer's tokens, serves every task.

Reading is the ``cast`` option's: one row of :data:`~sesame.tasks.casts.CASTS` per kind of data (text or parallel
files, a class, a pair, a score, a SQuAD question), which says how a row becomes the input (``prefix`` then the
row's fields: ``translate English to German: A man ...``, ``sst2 sentence: ...``), what the answer is, and how
generated text is scored (:mod:`sesame.tasks.casts`).

Inputs and targets are the tokenizer's pieces of the text, cut to ``--max-length`` and ``max_target_length``, then
the end token ``</s>`` (T5 appends it after trimming, so every sequence ends with it); ``bos`` also starts both
with ``<s>``, BART's format (Lewis et al. 2020), and by default follows the family (its row's
:class:`~sesame.inputs.SourceStart`: on for bart, off for t5). Batches are padded to their longest source and target,
and the loss sums the cross-entropy over the real target tokens only. The outputs scored and predicted are decoded by
:func:`sesame.seq2seq.generate_seq2seq` (the hook :func:`generate`): greedy, or beam search with the options
``beams`` and ``length_penalty``, up to ``max_target_length`` tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar

import torch
import torch.nn.functional as F

from ..data.labeled import read_fields
from ..errors import SesameError
from ..inputs import TEXT_FIRST, source_start
from ..models import ModelConfig
from ..models.encoder_decoder import EncoderDecoder
from ..tokenizer import TextTokenizer
from .base import Task, TaskModel, label_vocabulary, register
from .casts import CASTS, LANGUAGES, compose, parallel_lines, squad_rows
from .classify import collate
from .words import IGNORE

if TYPE_CHECKING:  # sesame.decoding reads the data modules, which read the tasks: imported where used
    from ..decoding import GenerationConfig
    from ..families import Family

# the generation hook: (model, source ids, padding, eos=, config=) → each row's new tokens
Generate = Callable[..., list[list[int]]]


def generate(model: EncoderDecoder, ids: torch.Tensor, padding: torch.Tensor, *, eos: int,
             config: GenerationConfig) -> list[list[int]]:
    """The target tokens :meth:`Text2TextModel.outputs` asks for: for each row of the padded sources ``ids``
    (``padding`` True at real tokens), the hypothesis :func:`~sesame.seq2seq.generate_seq2seq` decodes by ``config``
    from the row's real tokens alone (so a row's output does not depend on the padding its batch gives it), without
    the end token ``eos``."""
    from ..seq2seq import generate_seq2seq

    rows = [ids[i][padding[i]].tolist() for i in range(ids.shape[0])]
    return [h.tokens for h in generate_seq2seq(model, rows, config, eos=eos, batch_size=len(rows))]


# -- the task --------------------------------------------------------------------------------------

class Text2TextModel(TaskModel):
    """An encoder-decoder as a task model: ``forward`` is the teacher-forced cross-entropy summed over the real
    target tokens (the decoder reads the targets shifted right behind its start token,
    :meth:`EncoderDecoder.decoder_inputs`); ``outputs`` the ids ``generate`` (:data:`Generate`, by default the
    module's :func:`generate`) decodes by ``decoding``, ``decoding.max_new_tokens`` columns padded with the pad id."""

    def __init__(self, backbone: EncoderDecoder, *, decoding: GenerationConfig, generate: Generate):
        super().__init__()
        self.backbone, self.decoding, self.generate = backbone, decoding, generate

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        targets = batch["targets"]
        logits = self.backbone(batch["ids"], decoder_ids=self.backbone.decoder_inputs(targets),
                               padding=batch["padding"])
        gold = targets.masked_fill(~batch["target_padding"], IGNORE)
        return F.cross_entropy(logits.flatten(0, 1).float(), gold.flatten(), ignore_index=IGNORE, reduction="sum")

    def outputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = self.generate(self.backbone, batch["ids"], batch["padding"], eos=batch["eos"], config=self.decoding)
        width, pad_id = self.decoding.max_new_tokens, self.backbone.config.pad_id
        return torch.tensor([row[:width] + [pad_id] * (width - len(row[:width])) for row in map(list, rows)],
                            dtype=torch.long, device=batch["ids"].device)


@register
@dataclass
class Text2Text(Task):
    """Any task as text to text (see the module's docstring): options ``cast`` (a row of :data:`CASTS`),
    ``prefix``, the columns (defaults: the cast's), ``label_words`` ({label: word}), ``languages`` (parallel
    files), ``max_target_length`` (target tokens with ``</s>``, and the most an output may have), ``bos``, and the
    decoding of outputs: greedy (T5's default), or beam search with ``beams`` > 1 ranked by Σ log p / length^α,
    α = ``length_penalty`` (T5's long outputs: 4 beams, α = 0.6; :mod:`sesame.decoding`). Being options, they are
    recorded in config.json, so evaluate and predict decode as fine-tuning's dev evaluation did."""

    name: ClassVar[str] = "text2text"
    head_drops: ClassVar[bool] = False  # no head: the decoder's tied output layer
    cast: str = "text"
    prefix: str = ""
    source_column: str | None = None
    pair_column: str | None = None
    target_column: str | None = None
    label_words: dict | None = None
    languages: str | None = None
    max_target_length: int = 128
    bos: bool | None = None  # None: the family's (its row's source_start, :meth:`for_family`)
    beams: int = 1
    length_penalty: float = 1.0

    def __post_init__(self, where: str) -> None:
        if self.cast not in CASTS:
            raise SesameError(f"{where}: cast={self.cast}: choose one of {', '.join(CASTS)}")
        cast = CASTS[self.cast]
        for key, least, why in (("max_target_length", 2, "the answer's tokens and </s>"), ("beams", 1, "1: greedy")):
            value = getattr(self, key)  # its type: make_task's
            if value < least:
                raise SesameError(f"{where}: {key}={value}: a whole number of at least {least} ({why})")
        if not math.isfinite(self.length_penalty):
            raise SesameError(f"{where}: length_penalty={self.length_penalty}: a number, α of beam search's "
                              "Σ log p / length^α (1: the mean; 0: the sum)")
        if self.languages is not None and (self.cast != "text" or not LANGUAGES.fullmatch(str(self.languages))):
            raise SesameError(f"{where}: languages={self.languages}: the suffixes of parallel files, "
                              "SOURCE-TARGET (e.g. en-de), with cast=text")
        if self.label_words is not None and not (cast.classes and isinstance(self.label_words, dict)):
            raise SesameError(f"{where}: label_words={self.label_words}: a JSON object of label → word, e.g. "
                              '\'{"0": "negative", "1": "positive"}\', with cast=classify or pair')
        if self.pair_column is not None and len(cast.inputs) < 2:
            raise SesameError(f"{where}: pair_column={self.pair_column}: cast={self.cast} reads one input; "
                              "use cast=pair or regress for two")
        if not cast.squad:  # SQuAD JSON has fixed fields
            self.source_column = self.source_column or cast.inputs[0]
            self.pair_column = self.pair_column or (cast.inputs[1] if len(cast.inputs) > 1 else None)
            self.target_column = self.target_column or cast.column
        self.tokenizer: TextTokenizer | None = None  # the features' (scoring decodes with it); not an option

    def for_family(self, family: Family | None) -> None:
        """``bos`` not given: how the family's encoder-decoder inputs start (:attr:`Family.source_start`, BART's
        ``<s>``), recorded as the option; an explicit ``--task-option bos=...`` is kept."""
        if self.bos is None:
            self.bos = (family.source_start if family else TEXT_FIRST).bos

    @property
    def select(self) -> str:
        return CASTS[self.cast].metrics[0]

    @property
    def has_labels(self) -> bool:
        return CASTS[self.cast].classes

    def metrics(self, labels: list[str]) -> tuple[str, ...]:
        extra = ("f1",) if CASTS[self.cast].classes and len(labels) == 2 else ()
        return CASTS[self.cast].metrics + extra

    def read(self, path: str, labeled: bool = True) -> list[dict]:
        """Examples ``{"source": the model's input, "line"}`` with, when ``labeled``, ``target`` (the answer's
        text) and ``gold`` (what the metric compares: the text, the label, the score, or every SQuAD answer)."""
        cast = CASTS[self.cast]
        if cast.squad:
            rows = squad_rows(path, labeled)
        elif self.languages:
            rows = parallel_lines(path, self.languages, labeled)
        else:
            columns = {"source": self.source_column, "pair": self.pair_column,
                       "target": self.target_column if labeled else None}
            rows = read_fields(path, {key: (column, f"--task-option {key}_column") for key, column in columns.items()})
        names = self._names()
        examples = []
        for row in rows:
            fields = [(name if cast.named else None, row[key]) for name, key in zip(names, ("source", "pair"))]
            example = {"source": compose(self.prefix, fields), "line": row["line"]}
            if "id" in row:
                example["id"] = row["id"]
            if "target" in row:
                example["target"], example["gold"] = cast.target(self, row["target"], f"{path}:{row['line']}")
            examples.append(example)
        return examples

    def _names(self) -> list[str]:
        """The names the input gives its fields: the columns', or the cast's for SQuAD and numbered columns."""
        columns = (self.source_column, self.pair_column)
        return [default if column is None or column.isdigit() else column
                for column, default in zip(columns, CASTS[self.cast].inputs)]

    def example(self, text: str) -> dict:
        cast = CASTS[self.cast]
        if len(cast.inputs) > 1:
            return super().example(text)
        return {"source": compose(self.prefix, [(self._names()[0] if cast.named else None, text)])}

    def labels(self, train: list[dict], path: str) -> list[str]:
        if not CASTS[self.cast].classes:
            return []
        return label_vocabulary((row["gold"] for row in train), path, repr(self.target_column))

    def check(self, examples: list[dict], labels: list[str], path: str) -> None:
        known = set(labels)
        for row in examples:
            if CASTS[self.cast].classes and "gold" in row and row["gold"] not in known:
                raise SesameError(f"{path}:{row['line']}: label {row['gold']!r} never occurs in the training data; "
                                  f"the known labels are {labels}")

    def check_model(self, model: ModelConfig) -> None:
        """An encoder-decoder whose decoder reads ``max_target_length`` positions, at most its ``max_positions``:
        its table's for learned positions (BART: 1024), T5's ``n_positions`` (512) for its relative position bias, as
        generation holds every decoder (:meth:`sesame.decoding.GenerationConfig.check_room`)."""
        if model.arch != "encoder_decoder":
            raise SesameError(f"--task text2text needs an encoder-decoder (the t5 or bart family), not a "
                              f"{model.arch} model: give --from a t5 or bart run")
        positions = model.max_positions
        if self.max_target_length > positions:
            raise SesameError(f"--task-option max_target_length={self.max_target_length} exceeds the model's "
                              f"{positions} positions; give at most {positions}")

    def features(self, examples: list[dict], tok: TextTokenizer, max_length: int, labels: list[str],
                 causal: bool) -> list[dict]:
        """``ids``: the source's tokens cut to ``max_length`` with ``</s>`` last (and ``<s>`` first with ``bos``);
        ``target`` likewise within ``max_target_length``, for labeled examples."""
        self.tokenizer = tok
        start, end = source_start(self.bos).tokens(tok.specials), [tok.specials.sep]
        for limit, flag in ((max_length, "--max-length"), (self.max_target_length, "--task-option max_target_length")):
            if limit < len(start) + 2:
                raise SesameError(f"{flag} {limit}: leaves no room for a token beside {len(start) + 1} special ones")

        def pieces(texts: list[str], limit: int) -> list[list[int]]:
            return [start + e.ids[: limit - len(start) - 1] + end for e in tok.encodings(texts, special=False)]

        sources = pieces([e["source"] for e in examples], max_length)
        targets = pieces([e["target"] for e in examples], self.max_target_length) if examples and "target" in \
            examples[0] else None
        return [{"example": i, "ids": ids, **({"target": targets[i]} if targets else {})}
                for i, ids in enumerate(sources)]

    def collate(self, features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
        """Padded sources (``ids``, ``padding`` True at real tokens), the end token ``eos`` for generation, and for
        training the padded ``targets`` with their ``target_padding`` and the count of real target tokens."""
        batch = {**collate([f["ids"] for f in features], pad_id), "eos": self._tokenizer().specials.sep}
        if "target" in features[0]:
            targets = collate([f["target"] for f in features], pad_id)
            batch.update(targets=targets["ids"], target_padding=targets["padding"],
                         counts={"loss": int(targets["padding"].sum())})
        return batch

    def build(self, backbone: EncoderDecoder, n_labels: int, pooling: str, dropout: float) -> TaskModel:
        return Text2TextModel(backbone, decoding=self.decoding(), generate=generate)

    def decoding(self) -> GenerationConfig:
        """How outputs are decoded: up to ``max_target_length`` tokens (the end token counts), greedy or by beam
        search, with the caches."""
        from ..decoding import GenerationConfig

        return GenerationConfig(max_new_tokens=self.max_target_length, beams=self.beams,
                                length_penalty=float(self.length_penalty))

    def texts(self, outputs: torch.Tensor) -> list[str]:
        """The text of each row of generated ids, up to its first end or pad token."""
        tok = self._tokenizer()
        ends = {tok.specials.sep, tok.specials.pad}
        texts = []
        for row in outputs.long().tolist():
            cut = next((i for i, t in enumerate(row) if t in ends), len(row))
            texts.append(tok.decode(row[:cut]).strip())
        return texts

    def _tokenizer(self) -> TextTokenizer:
        if self.tokenizer is None:
            raise RuntimeError("text2text: make the features first; batches and scores use their tokenizer")
        return self.tokenizer

    def score(self, examples: list[dict], features: list[dict], outputs: torch.Tensor, labels: list[str]) -> dict:
        return CASTS[self.cast].score(examples, self.texts(outputs), labels)

    def predictions(self, examples: list[dict], features: list[dict], outputs: torch.Tensor,
                    labels: list[str]) -> list[dict]:
        """``{"output": the generated text}`` per example (with SQuAD's question ``id``)."""
        return [{**({"id": e["id"]} if "id" in e else {}), "output": text}
                for e, text in zip(examples, self.texts(outputs), strict=True)]
