"""What ``--from`` and ``--model`` name, decided once: :func:`resolve_source` turns the text a user gave
into one typed :class:`Source`, which every pipeline and application asks instead of looking again.

* a sesame run directory (config.json with a ``kind``): ``kind == "run"``, with its :class:`RunConfig`;
* a transformers model directory (config.json with a ``model_type``), or ``minilm`` (the installed
  all-MiniLM-L6-v2): ``kind == "transformers"``, converted into a temporary run by :meth:`Source.open`, of the family
  its ``model_type`` imports as (:func:`sesame.interop.hf_import.transformers_family`);
* ``scratch:FAMILY:SIZE``: ``kind == "scratch"``, a new model of that family and size;
* ``scratch:RUN``: ``kind == "scratch"`` with the pretrained run's directory and config, its twin: the run's family,
  shape and tokenizer with new weights, so that what pre-training bought can be measured;
* ``counts:RUN``: that twin with ``counted`` set: its token table from the PPMI-SVD of the run's shards, as a new
  run of them starts with ``--embedding-init ppmi`` (:func:`sesame.pipelines.starts.counted_table`), so that what
  the training steps bought over the counts can be measured.

Every source has its family's registry row, resolved here once, which the pipelines pass along.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from .errors import SesameError
from .families import Family, get_family, get_size, run_family
from .interop.hf_import import transformers_family
from .interop.sources import MINILM, converted, minilm_dir, transformers_config
from .run import RunConfig, read_config

SCRATCH, COUNTS = "scratch:", "counts:"


@dataclass(frozen=True)
class Source:
    given: str  # as the user wrote it
    flag: str  # the flag that named it, for error messages
    kind: str  # run | transformers | scratch
    family: Family  # its registry row
    path: Path | None = None  # the directory (for scratch, the run it twins, if any)
    config: RunConfig | None = None  # a run's config.json
    size: str | None = None
    hf: dict | None = None  # a transformers directory's config.json, read once here and passed to its conversion
    counted: bool = False  # counts:RUN, a scratch twin whose token table starts from the run's counts

    @property
    def scratch(self) -> bool:
        return self.kind == "scratch"

    def open(self, *, classifier: bool = False):
        """A context giving the run directory: the run itself, or a transformers directory converted into a
        temporary run (``classifier``: it must import as a fine-tuned classifier); for a scratch model, the run it
        twins (its config and tokenizer; its weights are not read), if any."""
        if self.kind == "transformers":
            return converted(self.path, self.hf, self.path, self.flag, classifier=classifier)
        return nullcontext(self.path)

    def require(self, *kinds: str) -> RunConfig:
        """The run's config, which must be of ``kinds`` (a transformers directory is converted to check it)."""
        if self.config is None:
            raise SesameError(f"{self.flag} {self.given}: not a sesame run directory")
        if self.config.kind not in kinds:
            raise SesameError(f"{self.flag} {self.given}: holds a {self.config.kind!r} run, but a "
                              f"{' or '.join(kinds)} run is needed")
        return self.config


def resolve_source(given: str | Path, flag: str) -> Source:
    """The :class:`Source` ``given`` names (module docstring); an unusable name is an error naming ``flag``."""
    given = str(given)
    if given.startswith(SCRATCH) and Path(given[len(SCRATCH):]).is_dir():
        return _twin(given, flag)
    if given.startswith(COUNTS):
        return _counted_twin(given, flag)
    if given.startswith(SCRATCH):
        parts = given.split(":")
        if len(parts) != 3:
            raise SesameError(f"{flag} {given}: write scratch:FAMILY:SIZE (e.g. scratch:bert:mini), or scratch:RUN "
                              "with a pretrained run's directory")
        family = get_family(parts[1])
        get_size(parts[2])
        return Source(given, flag, "scratch", family, size=parts[2])
    path = minilm_dir() if given == MINILM else Path(given)
    hf = transformers_config(path)
    if hf is not None:
        return Source(given, flag, "transformers", transformers_family(hf, str(path / "config.json")), path, hf=hf)
    if not path.is_dir():
        raise SesameError(f"{flag} {given}: no such run directory")
    config = read_config(path, flag)
    return Source(given, flag, "run", run_family(config, f"{flag} {given}"), path, config, config.size)


def _twin(given: str, flag: str, *, prefix: str = SCRATCH) -> Source:
    """``scratch:RUN`` (``prefix`` the other twin's, ``counts:``): the pretrained run's family, shape and tokenizer, to
    be given new weights."""
    folder = given[len(prefix):]
    if not Path(folder).is_dir():
        raise SesameError(f"{flag} {given}: no such run directory; write {prefix}RUN with a pretrained run's directory")
    run = resolve_source(folder, flag)
    if run.kind != "run" or run.config.kind != "pretrained":
        holds = "a transformers model" if run.kind == "transformers" else f"a {run.config.kind!r} run"
        raise SesameError(f"{flag} {given}: {prefix}RUN twins a run that `sesame pretrain` made, and this folder "
                          f"holds {holds}; give a pretrained run{', or scratch:FAMILY:SIZE' * (prefix == SCRATCH)}")
    return replace(run, given=given, kind="scratch")


def _counted_twin(given: str, flag: str) -> Source:
    """``counts:RUN``: the run's scratch twin with its token table from the counts of the run's shards, which must
    still be there; a family that spells its tokens from characters (ELMo) has no table to count into."""
    twin = _twin(given, flag, prefix=COUNTS)
    if not twin.family.token_table:
        raise SesameError(f"{flag} {given}: {twin.family.name} spells its tokens from characters and has no table of "
                          f"token embeddings to count into; use scratch:{given[len(COUNTS):]}")
    shards = twin.config.pretrained.shards
    if shards is None or not Path(shards).is_dir():
        raise SesameError(f"{flag} {given}: the run's config.json names no shards folder that is still there "
                          f"({shards}); counts:RUN counts the run's shards, so give a run whose shards are kept")
    return replace(twin, counted=True)


@contextmanager
def opened(given: str | Path, flag: str, *, classifier: bool = False) -> Iterator[tuple[Source, Path]]:
    """``(source, run directory)`` for a model that must be a run or a transformers directory."""
    source = resolve_source(given, flag)
    if source.scratch:
        raise SesameError(f"{flag} {given}: a scratch model has no weights to use; train it first")
    with source.open(classifier=classifier) as run:
        yield source, run
