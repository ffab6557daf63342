"""A run directory at the bottom of the house: the schema of its ``config.json`` (:class:`RunConfig`, its version
and kinds), reading and writing it, and its tokenizer and backbone. Everything above (data, tasks, interop,
pipelines, applications) reads a run through here; claiming a directory for a new run is :mod:`sesame.rundir`'s.

``config.json`` names the kind (``pretrained`` or ``finetuned``), the family and the backbone configuration, and
holds the fields of its kind; read, it is a :class:`RunConfig` of common fields and one typed part per kind of run
(:class:`PretrainedPart`, :class:`FinetunedPart`, :class:`CovePart`), written back as the same flat JSON object. The
config and its parts are frozen: a change is a new config (``dataclasses.replace``), which :func:`write_config` writes.
``tokenizer.json`` and ``model.safetensors`` sit beside it.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

from torch import nn

from .budget import Sizing
from .errors import SesameError
from .models import ModelConfig, build_model, model_config
from .models.additions import Additions
from .tokenizer import TextTokenizer
from .train.checkpoint import TEMPORARY, load_weights, read_json, write_json
from .train.recipes import Recipe
from .version import __version__

SCHEMA_VERSION = 1  # config.json's layout; runs written before versioning (sesame 0.1.0) read as version 0
KINDS = ("pretrained", "finetuned")


@dataclass(frozen=True)
class CorpusMixing:
    """config.json's ``corpus_mixing``: ``sesame pretrain --mixing-temperature T`` draws each training window from
    one of the ``--corpus`` arguments (``sources``, as given) at its ``rate`` (:mod:`sesame.data.mixing`: windows^(1/T),
    normalised), from ``windows`` training windows each; ``files`` maps each file of the shards (meta.json's
    ``sources``, in order) to its source."""
    temperature: float
    sources: list[str]
    windows: list[int]
    rates: list[float]
    files: list[int]

    def line(self) -> str:
        """The one line ``sesame pretrain`` prints."""
        shares = ", ".join(f"{Path(source).name} {rate:.0%} ({n:,} windows)"
                           for source, rate, n in zip(self.sources, self.rates, self.windows))
        return f"--mixing-temperature {self.temperature:g}: each window drawn from {shares}"


@dataclass(frozen=True, kw_only=True)
class PretrainedPart:
    """What a pretrained run adds (``sesame pretrain``; ``sesame cove`` and an import from transformers fill some):
    its objective and options, the windows it trained on (``seq_len``, ``static_masks``, ``final_seq_len``), the
    words continued pre-training added, the shards, and ``--size auto``'s record."""
    objective: str | None = None
    objective_options: dict = field(default_factory=dict)
    seq_len: int | None = None
    static_masks: int = 0
    final_seq_len: int | None = None
    added_words: int = 0  # continued pre-training: the new corpus's words added to the vocabulary
    discriminative: float = 1.0
    embedding_init: str = "random"  # --embedding-init: how a new model's token embeddings started (runs before: random)
    embedding_rate: float = 1.0  # --embedding-rate: the token table's share of the peak rate (runs before: 1)
    shards: str | None = None
    valid_shards: str | None = None
    valid_size: dict | None = None  # bytes and characters of --valid's text (bits per byte)
    sizing: Sizing | None = None  # --size auto: the size and batch chosen, and the throughput measured
    corpus_mixing: CorpusMixing | None = None  # --mixing-temperature: each --corpus argument's rate


@dataclass(frozen=True, kw_only=True)
class FinetunedPart:
    """What a fine-tuned run adds: its task and reading options, the metric that selects its checkpoint, the
    recipe, epochs and batching it trained with, and its files (or, on a ``--mixture``, each task's)."""
    task: str | None = None
    task_options: dict = field(default_factory=dict)
    select: str | None = None
    recipe: Recipe | None = None
    epochs: int | None = None
    batching: str = "bucketed"
    train_file: str | None = None
    dev_file: str | None = None
    mixture: dict | None = None  # text2text over a mixture of tasks: each task's files, options and labels


@dataclass(frozen=True, kw_only=True)
class CovePart:
    """What CoVe's MT-LSTM (``sesame cove``, a pretrained run of the ``translation`` objective) adds: its
    parallel files, and the word vectors its embedding started from and how many words they covered."""
    lowercase: bool | None = None
    vectors: str | None = None
    vector_coverage: float | None = None
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run's ``config.json``, read and checked once (:meth:`parse`), as typed parts. Common to every run: its
    kind, family, size, backbone configuration (``model``: the architecture's own config dataclass, parsed once from
    its JSON object here and changed only with ``dataclasses.replace``), what a fine-tuning recipe inserted into the
    backbone (``additions``, inserted again by :func:`build_backbone`), pooling, the longest input it reads, its
    TrainConfig and runtime, and an import's record (``hf``, what exports it back). Then one part per kind of run:
    ``pretrained`` (:class:`PretrainedPart`), ``finetuned`` (:class:`FinetunedPart`) and ``cove``
    (:class:`CovePart`), so the type says which fields each kind has. Every run holds all three, a run of one kind
    leaving the others' at their defaults; the parts are split by kind, as config.json's :data:`SECTIONS` are, rather
    than by concern (data, training, ...), because a field's kind is what decides whether a run has it.

    config.json stays one flat object: :meth:`parse` hands each key to its part and :meth:`to_json` flattens them
    back, key for key in the order of :data:`KEYS`."""
    kind: str
    family: str
    model: ModelConfig
    additions: Additions = field(default_factory=Additions)
    size: str | None = None
    pooling: str | None = None
    base: str | None = None  # the run or model it started from
    train: dict | None = None  # its TrainConfig
    hf: dict | None = None  # imported from transformers: the source's model type, config and tokenizer record
    runtime: dict | None = None  # the sesame.runtime.Runtime it last trained with (resumable on any device)
    version: int = SCHEMA_VERSION
    sesame_version: str = __version__
    setup: dict = field(default_factory=dict)  # what made the run that no other field records (sesame.resume.SETUP)
    max_length: int | None = None  # the longest input it reads: a fine-tuned run's --max-length, CoVe's sentences'
    pretrained: PretrainedPart = field(default_factory=PretrainedPart)
    finetuned: FinetunedPart = field(default_factory=FinetunedPart)
    cove: CovePart = field(default_factory=CovePart)
    # not written: config.json's model as read (None: made here), written back as it was while ``model`` is unchanged
    read_model: dict | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, data: object, where: str) -> RunConfig:
        """A config from its JSON object; ``where`` names the file in errors."""
        if not isinstance(data, dict):
            raise SesameError(f"{where}: not a sesame run config (a JSON object is expected)")
        version = data.get("version", 0)
        if type(version) is not int or version < 0:
            raise SesameError(f"{where}: config version {json.dumps(version)} is none sesame writes (whole numbers "
                              "from 0); recreate the run")
        if version > SCHEMA_VERSION:
            raise SesameError(f"{where}: written by a newer sesame (config version {version}; this sesame "
                              f"{__version__} reads up to {SCHEMA_VERSION}); upgrade sesame "
                              "(pip install -U sesame-nlp)")
        unknown = sorted(set(data) - set(KEYS))
        if unknown:
            raise SesameError(f"{where}: unknown fields {', '.join(unknown)}; this run was not written by this sesame "
                              f"(config version {version}); upgrade sesame or recreate the run")
        missing = [name for name in ("kind", "family", "model") if name not in data]
        if missing or data["kind"] not in KINDS or not isinstance(data["model"], dict):
            raise SesameError(f"{where}: a broken run config (missing {', '.join(missing) or 'nothing'}, kind "
                              f"{data.get('kind')!r}); recreate the run")
        data = {**data, "sizing": _record(Sizing, data.get("sizing"), "sizing", where),
                "corpus_mixing": _record(CorpusMixing, data.get("corpus_mixing"), "corpus_mixing", where),
                "recipe": _record(Recipe, data.get("recipe"), "recipe", where)}
        read, additions = _additions(data, where)  # version 0 has the same fields
        try:
            model = model_config(read)
        except (KeyError, TypeError, ValueError) as err:
            raise SesameError(f"{where}: its model config does not describe a backbone ({err}); recreate the "
                              "run") from None
        parts = {name: part(**{k: data[k] for k in _names(part) if k in data}) for name, part in PARTS.items()}
        common = {k: v for k, v in data.items() if k in _names(cls)}
        return cls(**{**common, **parts, "model": model, "read_model": read, "additions": additions,
                      "version": SCHEMA_VERSION})

    def to_json(self) -> dict:
        """The JSON object written to config.json, flat: the common fields and those of its kind's section, and any
        other field that is not at its default. ``model`` is its ``to_dict()``, or, unchanged since it was read, the
        JSON it was read from (an older run's, which may lack fields added since, keeps its JSON when rewritten)."""
        always = SECTIONS["common"] | SECTIONS[self.kind]
        unset = {k: v for schema in (RunConfig, *PARTS.values()) for k, v in _defaults(schema).items()}
        records = (self, *(getattr(self, name) for name in PARTS))
        written = {k: v for record in records for k, v in _values(record).items()}
        as_read = self.read_model is not None and model_config(self.read_model) == self.model
        written["model"] = self.read_model if as_read else self.model.to_dict()
        return {k: written[k] for k in KEYS if k in always or written[k] != unset[k]}

    @property
    def causal(self) -> bool:
        return bool(self.model.causal)


PARTS = {"pretrained": PretrainedPart, "finetuned": FinetunedPart, "cove": CovePart}  # RunConfig's field → its type
# config.json's keys in the order they are written (as when RunConfig was one flat dataclass): the common fields'
# and each part's, pinned to be exactly those by tests/test_run_schema.py
KEYS = ("kind", "family", "model", "additions", "size", "pooling", "base", "train", "hf", "runtime", "version",
        "sesame_version", "objective", "objective_options", "seq_len", "static_masks", "final_seq_len", "added_words",
        "discriminative", "embedding_init", "embedding_rate", "shards", "valid_shards", "valid_size", "setup", "sizing",
        "corpus_mixing", "task", "task_options", "select", "max_length", "recipe", "epochs", "batching", "train_file",
        "dev_file", "mixture", "lowercase", "vectors", "vector_coverage", "train_src", "train_tgt", "valid_src",
        "valid_tgt")
# the keys config.json always holds for a run of each kind (any other only when not at its default)
SECTIONS = {
    "common": {"version", "sesame_version", "kind", "family", "size", "model", "pooling", "base", "train"},
    "pretrained": {"objective", "objective_options", "seq_len", "static_masks", "final_seq_len", "added_words",
                   "discriminative", "shards", "valid_shards", "valid_size"},
    "finetuned": {"task", "task_options", "select", "max_length", "recipe", "epochs", "train_file", "dev_file"},
}


def _names(cls: type) -> list[str]:
    """The config.json keys a dataclass of the schema holds (RunConfig's: its common fields)."""
    return [f.name for f in fields(cls) if f.name not in PARTS and f.name != "read_model"]


def _values(record: object) -> dict:
    """Its config.json keys' values, a dataclass among them as its JSON object."""
    return {name: _json(getattr(record, name)) for name in _names(type(record))}


def _defaults(cls: type) -> dict:
    """Its config.json keys' values when not given (as JSON)."""
    return {f.name: _json(f.default if f.default_factory is MISSING else f.default_factory()) for f in fields(cls)
            if f.name in _names(cls)}


def _json(value: object) -> object:
    return asdict(value) if is_dataclass(value) else value


def _record(kind: type, value: object, key: str, where: str) -> object:
    """config.json's ``key``, a JSON object of the dataclass ``kind`` or null, as one."""
    if value is None:
        return None
    try:
        return kind(**value)
    except TypeError:
        raise SesameError(f"{where}: a broken {key} record {json.dumps(value)}; recreate the run") from None


def _additions(data: dict, where: str) -> tuple[dict, Additions]:
    """The backbone configuration and the :class:`Additions` of config.json's object ``data``. Before issue 34 a
    Transformer stack's configuration recorded them itself (``adapter_size``, ``scalar_mix``); such a run's are
    moved out of it. ``where`` names the file in errors."""
    model = dict(data["model"])
    if "adapter_size" in model:  # only a Transformer stack's config had it (ELMo's own scalar_mix stays)
        return model, Additions(adapter_size=model.pop("adapter_size"), scalar_mix=model.pop("scalar_mix", False))
    recorded = data.get("additions", {})
    try:
        return model, Additions(**recorded)
    except TypeError:
        raise SesameError(f"{where}: a broken additions record {json.dumps(recorded)}; recreate the run") from None


SETTING_UP = ".setting-up" + TEMPORARY  # in a new run directory until its config.json is written (then a leftover)


def read_config(run: str | Path, flag: str, kinds: tuple[str, ...] = KINDS) -> RunConfig:
    """The run's config.json, checked against the schema (:class:`RunConfig`) and to be one of
    ``kinds``."""
    run = Path(run)
    if not run.is_dir():
        raise SesameError(f"{flag} {run}: no such run directory")
    if not (run / "config.json").is_file():
        raise SesameError(f"{flag} {run}: not a sesame run directory (no config.json)")
    data = read_json(run / "config.json")
    if isinstance(data, dict) and data.get("kind") not in kinds:  # another kind of directory, before its fields
        raise SesameError(f"{flag} {run}: holds a {data.get('kind')!r} run, but a {' or '.join(kinds)} run is needed")
    return RunConfig.parse(data, f"{flag} {run / 'config.json'}")


def describe(config: RunConfig) -> dict:
    """What a run is, as ``sesame serve``'s /info says it: its kind, family, size, whether it is causal, and
    ``export`` None (a run; an ONNX export's predictor says its format and quantisation there)."""
    return {"kind": config.kind, "family": config.family, "size": config.size, "causal": config.causal,
            "export": None}


def write_config(run: Path, config: RunConfig) -> None:
    write_json(run / "config.json", config.to_json())
    (run / SETTING_UP).unlink(missing_ok=True)


def build_backbone(config: RunConfig) -> nn.Module:
    """The backbone a run's config.json describes (:func:`sesame.models.build_model`) with its ``additions`` inserted
    (:mod:`sesame.models.additions`), without weights."""
    return config.additions.insert(build_model(config.model))


def load_backbone(run: str | Path, flag: str = "--model") -> nn.Module:
    """The backbone of a pretrained or fine-tuned run, with its weights (heads left behind), in eval mode."""
    run = Path(run)
    backbone = build_backbone(read_config(run, flag, ("pretrained", "finetuned")))
    weights = load_weights(run / "model.safetensors")
    backbone.load_state_dict({k[len("backbone."):]: v for k, v in weights.items() if k.startswith("backbone.")})
    return backbone.eval()


def load_tokenizer(path: str | Path, flag: str = "--tokenizer") -> TextTokenizer:
    """A tokenizer from a tokenizer.json file, or from the run or shard directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise SesameError(f"{flag} {path}: no tokenizer.json there")
    return TextTokenizer.load(path)
