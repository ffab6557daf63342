"""The contract every pre-training objective fulfils."""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, fields
from typing import Callable

import torch
from torch import nn

from ..errors import SesameError
from ..models import Transformer
from ..tokenizer import SpecialIds, TextTokenizer


@dataclass(frozen=True)
class Bound:
    """The numbers an option accepts, as a check and the words that name them."""

    words: str
    holds: Callable[[float], bool]


FRACTION = Bound("above 0 and at most 1", lambda value: 0 < value <= 1)
POSITIVE = Bound("above 0", lambda value: value > 0)
AT_LEAST_ONE = Bound("at least 1", lambda value: value >= 1)
UNDER_ONE = Bound("a fraction from 0 and under 1", lambda value: 0 <= value < 1)


class Objective(nn.Module):
    """A backbone plus the head(s) one pre-training task needs.

    ``make_batch`` turns clean token windows into model inputs and targets, drawing the randomness of
    row ``i`` from ``generators[i]`` only, so an example is corrupted the same way however it is
    batched; ``forward`` returns the loss summed over ``batch["targets"]``, so the trainer can
    average over a whole global batch across micro-batches and processes. An objective with several
    losses (BERT's MLM + NSP, ELECTRA's MLM + λ·discriminator) names them in ``part_names``, returns a
    dict of their sums, and counts their terms in ``batch["counts"]``; the trainer minimises the
    weighted sum of their means over the global batch.

    Objectives with ``pairs = True`` (next-sentence and sentence-order prediction) also receive
    ``partners``: for each row, a window of the same length from another document.
    ``build`` makes an objective from the backbone, the tokenizer (for word boundaries and special
    ids) and the objective's options as recorded in the run's config.json.
    """

    name = ""
    pairs = False
    scored_by: str | None = None  # a command that scores its runs instead of `sesame evaluate`
    options: tuple[str, ...] = ()  # the options a user may give (--objective-option), recorded in config.json
    choices: dict[str, tuple[str, ...]] = {}  # the values an option of a few named ones takes (checked before a run)
    bounds: dict[str, Bound] = {}  # the numbers a numeric option takes (checked before a run)
    option_dataclass: type | None = None  # a dataclass whose fields are the options (else the constructors' keywords)
    part_names: tuple[str, ...] = ()  # several losses: their names, the language model's first
    part_weights: dict[str, float] = {}  # and their weights in the total (default 1)
    classified: tuple[str, ...] = ()  # the parts that classify, whose accuracy validation reports (score)
    # the one architecture it trains (encoder_decoder: T5's and BART's; xlnet: the permutation LM); an architecture
    # some objective names is trained by those objectives only (trains)
    arch: str | None = None
    # `sesame evaluate` reads a text whole through ``token_losses(text, seq_len)`` (left to right, with memory across
    # segments: XLNet's), rather than scoring windows with ``score``
    reads_text = False
    named_archs: set[str] = set()  # the architectures some objective names (filled as each is defined)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.arch:
            Objective.named_archs.add(cls.arch)

    def __init__(self, backbone: Transformer, specials: SpecialIds):
        super().__init__()
        self.backbone = backbone
        self.specials = specials
        # plain attributes, not buffers, as every table ``make_batch`` reads: batches are made on the CPU wherever
        # ``model.to(device)`` puts the model (docs/devices.md, the placement rule)
        self.special_ids = torch.tensor(specials.all)

    @classmethod
    def trains(cls, arch: str) -> bool:
        """Whether it can train a backbone of ``arch``: the architecture it names, or, naming none, one that no
        objective names."""
        return cls.arch == arch if cls.arch else arch not in Objective.named_archs

    @classmethod
    def option_defaults(cls) -> dict[str, object]:
        """Each option's default, whose kind (true/false, whole number, number, text) a given value must share: the
        fields of ``option_dataclass``, else the keywords of the constructors up the class tree (a subclass's wins).
        Options without a default of their own (None, or read by ``build`` alone) are left out."""
        if cls.option_dataclass is not None:
            found = {f.name: f.default for f in fields(cls.option_dataclass)}
        else:
            found = {}
            for klass in reversed(cls.__mro__):
                if "__init__" in vars(klass):
                    found |= {name: p.default for name, p in inspect.signature(klass.__init__).parameters.items()
                              if p.default is not inspect.Parameter.empty}
        return {name: found[name] for name in cls.options if found.get(name) is not None}

    @classmethod
    def check_option(cls, key: str, value: object) -> None:
        """Refuse, in one line, a value of another kind than ``key``'s default (``rate=abc`` for a fraction), outside
        its named ``choices`` or out of its ``bounds`` (``rate=1.5``): caught before the run is written, not at its
        first batch."""
        default, accepted, bound = cls.option_defaults().get(key), cls.choices.get(key), cls.bounds.get(key)
        if isinstance(default, bool):
            kind, fits = "true or false", isinstance(value, bool)
        elif isinstance(default, int):
            kind, fits = "a whole number", isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            kind, fits = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
        else:  # text, or no default to go by
            kind, fits = "text", default is None or isinstance(value, str)
        if not fits:
            given = value if isinstance(value, str) else json.dumps(value)  # as written on the command line
            raise SesameError(f"--objective-option {key}={given}: the {cls.name} objective's {key} is {kind} "
                              f"(default {json.dumps(default)})")
        if accepted and value not in accepted:
            raise SesameError(f"--objective-option {key}={value}: the {cls.name} objective's {key} is one of "
                              f"{', '.join(accepted)}")
        if bound and not bound.holds(value):
            raise SesameError(f"--objective-option {key}={json.dumps(value)}: the {cls.name} objective's {key} is "
                              f"{bound.words} (default {json.dumps(default)})")

    @classmethod
    def build(cls, backbone: Transformer, tokenizer: TextTokenizer, **options) -> "Objective":
        return cls(backbone, tokenizer.specials, **options)

    @staticmethod
    def window_length(seq_len: int, **options) -> int:
        """How many corpus tokens one example of ``seq_len`` model positions consumes, under the run's objective
        ``options`` (as ``build`` takes them; only span corruption's window depends on them)."""
        raise NotImplementedError

    @staticmethod
    def sentinels_needed(seq_len: int, **options) -> int:
        """How many of the tokenizer's sentinel tokens one example of ``seq_len`` positions uses (T5's span
        corruption: one per noise span; the others none)."""
        return 0

    def make_batch(self, windows: torch.Tensor, generators: list[torch.Generator],
                   partners: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def score(self, batch: dict[str, torch.Tensor]
              ) -> tuple[torch.Tensor | dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """For validation: ``forward``'s summed loss(es), and for each part of ``classified`` how many of its
        counted terms (NSP's pairs) it predicts right, which validation reports as ``<part>_accuracy``."""
        return self(batch), {}

    def tied_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.backbone.embed.tokens.weight.t()
