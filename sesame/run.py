"""A run directory at the bottom of the house: the schema of its ``config.json`` (:class:`RunConfig`, its version
and kinds), reading and writing it, and its tokenizer and backbone. Everything above (data, tasks, interop,
pipelines, applications) reads a run through here; claiming a directory for a new run is :mod:`sesame.rundir`'s.

``config.json`` names the kind (``pretrained`` or ``finetuned``), the family and the backbone configuration;
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
from .version import __version__

SCHEMA_VERSION = 1  # config.json's layout; runs written before versioning (sesame 0.1.0) read as version 0
KINDS = ("pretrained", "finetuned")


@dataclass(kw_only=True)
class RunConfig:
    """A run's ``config.json``, read and checked once (:meth:`parse`). Common to every run: its kind, family,
    size, backbone configuration (``model``: the architecture's own config dataclass, parsed once from its JSON
    object here and changed only with ``dataclasses.replace``), what a fine-tuning
    recipe inserted into the backbone (``additions``, inserted again by :func:`build_backbone`) and pooling; then the
    fields of a pretrained run, of a fine-tuned one, of CoVe's MT-LSTM, and of an import from
    transformers (``hf``, what exports it back)."""
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
    # pretrained
    objective: str | None = None
    objective_options: dict = field(default_factory=dict)
    seq_len: int | None = None
    static_masks: int = 0
    final_seq_len: int | None = None
    added_words: int = 0  # continued pre-training: the new corpus's words added to the vocabulary
    discriminative: float = 1.0
    shards: str | None = None
    valid_shards: str | None = None
    valid_size: dict | None = None  # bytes and characters of --valid's text (bits per byte)
    setup: dict = field(default_factory=dict)  # what made the run that no other field records (sesame.resume.SETUP)
    sizing: Sizing | None = None  # --size auto: the size and batch chosen, and the throughput measured
    # finetuned
    task: str | None = None
    task_options: dict = field(default_factory=dict)
    select: str | None = None
    max_length: int | None = None  # also CoVe's sentence length
    recipe: dict | None = None  # sesame.train.recipes.Recipe
    epochs: int | None = None
    batching: str = "bucketed"
    train_file: str | None = None
    dev_file: str | None = None
    mixture: dict | None = None  # text2text over a mixture of tasks: each task's files, options and labels
    # CoVe's MT-LSTM (sesame cove)
    lowercase: bool | None = None
    vectors: str | None = None
    vector_coverage: float | None = None
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
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
        known = {f.name for f in fields(cls)} - {"read_model"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SesameError(f"{where}: unknown fields {', '.join(unknown)}; this run was not written by this sesame "
                              f"(config version {version}); upgrade sesame or recreate the run")
        missing = [name for name in ("kind", "family", "model") if name not in data]
        if missing or data["kind"] not in KINDS or not isinstance(data["model"], dict):
            raise SesameError(f"{where}: a broken run config (missing {', '.join(missing) or 'nothing'}, kind "
                              f"{data.get('kind')!r}); recreate the run")
        sizing = data.get("sizing")
        try:
            sizing = Sizing.of(sizing) if isinstance(sizing, dict) else sizing
        except TypeError:
            raise SesameError(f"{where}: a broken sizing record {json.dumps(sizing)}; recreate the run") from None
        read, additions = _additions(data, where)  # version 0 has the same fields
        try:
            model = model_config(read)
        except (KeyError, TypeError, ValueError) as err:
            raise SesameError(f"{where}: its model config does not describe a backbone ({err}); recreate the "
                              "run") from None
        return cls(**{**data, "model": model, "read_model": read, "additions": additions, "version": SCHEMA_VERSION,
                      "sizing": sizing})

    def to_json(self) -> dict:
        """The JSON object written to config.json: the common fields and those of its kind, and any other
        field that is not at its default. ``model`` is its ``to_dict()``, or, unchanged since it was read, the JSON
        it was read from (an older run's, which may lack fields added since, keeps its JSON when rewritten)."""
        always = SECTIONS["common"] | SECTIONS[self.kind]
        unset = {f.name: f.default if f.default_factory is MISSING else f.default_factory() for f in fields(self)}
        unset = {k: asdict(v) if is_dataclass(v) else v for k, v in unset.items()}
        as_read = self.read_model is not None and model_config(self.read_model) == self.model
        written = {**asdict(self), "model": self.read_model if as_read else self.model.to_dict()}
        return {k: v for k, v in written.items() if k != "read_model" and (k in always or v != unset[k])}

    @property
    def causal(self) -> bool:
        return bool(self.model.causal)


SECTIONS = {
    "common": {"version", "sesame_version", "kind", "family", "size", "model", "pooling", "base", "train"},
    "pretrained": {"objective", "objective_options", "seq_len", "static_masks", "final_seq_len", "added_words",
                   "discriminative", "shards", "valid_shards", "valid_size"},
    "finetuned": {"task", "task_options", "select", "max_length", "recipe", "epochs", "train_file", "dev_file"},
}


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
