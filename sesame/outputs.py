"""Where a command may write: one rule, so that nothing a user types destroys their work.

- A directory is written only when it is new or empty, or is a sesame directory of the kind the command makes
  (:func:`check_dir`): a run to ``--resume``, a ``compare`` or ``ulmfit`` folder to continue. Anything else is
  refused, so a command never writes into, or deletes from, a folder of someone else's files.
- A file is written only where none is (:func:`new_file`): sesame never replaces an existing file, so it never
  replaces one it did not write, nor one of the command's own inputs.
- A missing parent folder is created; a parent that is a file, or a folder that cannot be created, is an error
  naming the flag.
- An output is claimed for the command's life (:func:`hold`): an advisory lock the process holds, which the system
  drops when it ends or dies, so two commands never write one output at once, and what a killed command left is
  known to be nobody's. A second command is refused, naming the flag and the output.

The kind of a directory is what it says of itself (:func:`directory_kind`): a run's ``config.json``, a shard
directory's ``meta.json``, an application folder's marker (:data:`MARKER`).
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

try:
    import fcntl
except ImportError:  # Windows: outputs go unlocked
    fcntl = None

from .version import __version__
from .errors import SesameError

MARKER = "sesame.json"  # an application's folder: {"kind": "compare" | "ulmfit" | "demo", "sesame_version"}
APPLICATIONS = ("compare", "ulmfit", "demo")
# folders made before the marker existed, known by the records of their stages (sesame.pipelines.stages.RECORD)
LEGACY = {"compare": "*/*/compare.json", "ulmfit": "*/compare.json"}
# the entries of a run directory (rundir, train.checkpoint and .metrics_log, a stage's record, CoVe's 2nd tokenizer)
RUN_NAMES = ("config.json", "tokenizer.json", "target_tokenizer.json", "model.safetensors", "labels.json",
             "metrics.jsonl", "tensorboard", "checkpoint", "shards", "valid-shards", "compare.json")


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def directory_kind(path: str | Path) -> str | None:
    """What sesame directory ``path`` is: a run's kind (``pretrained``, ``finetuned``), ``shards``, or an
    application's folder (``compare``, ``ulmfit``, ``demo``); None for anything else."""
    path = Path(path)
    for name, key in (("config.json", "kind"), (MARKER, "kind")):
        data = _read_json(path / name)
        if isinstance(data, dict) and isinstance(data.get(key), str):
            return data[key]
    meta = _read_json(path / "meta.json")
    if isinstance(meta, dict) and "format" in meta and "fingerprint" in meta:
        return "shards"
    return next((kind for kind, pattern in LEGACY.items() if any(path.glob(pattern))), None)


def only_run_files(path: str | Path) -> bool:
    """Whether every entry of the folder ``path`` is one a run writes (:data:`RUN_NAMES`, or a temporary of one,
    ``.NAME.*``): a run that died before its config.json, which sesame may delete to start it again."""
    def ours(name: str) -> bool:
        return name in RUN_NAMES or name.startswith(".") and any(name[1:].startswith(f"{n}.") for n in RUN_NAMES)

    return all(ours(entry.name) for entry in Path(path).iterdir())


def _describe(kind: str | None) -> str:
    if kind is None:
        return "other files"
    return {"pretrained": "a pretrained run", "finetuned": "a fine-tuned run", "shards": "token shards"}.get(
        kind, f"a {kind} folder")


def _check_parent(path: Path, flag: str) -> None:
    """The nearest existing folder above ``path`` is a folder, not a file."""
    for above in path.absolute().parents:
        if above.exists():
            if not above.is_dir():
                raise SesameError(f"{flag} {path}: {above} is a file, not a folder; choose another path")
            return


def check_dir(path: str | Path, flag: str, kind: str | None = None, *,
              fix: str = "choose a new or empty folder") -> bool:
    """Whether ``path`` already holds a sesame directory of ``kind`` (to continue); False when it is new or
    empty. Anything else (a file; a folder holding other files, or a directory of another kind) is refused
    with an error naming ``flag`` and saying ``fix``. Writes nothing."""
    path = Path(path)
    _check_parent(path, flag)
    if not path.exists():
        return False
    if not path.is_dir():
        raise SesameError(f"{flag} {path}: is a file, not a folder; {fix}")
    if not any(path.iterdir()):
        return False
    found = directory_kind(path)
    if kind is not None and found == kind:
        return True
    raise SesameError(f"{flag} {path}: exists and holds {_describe(found)}; {fix}")


def _cannot_write(path: Path, flag: str, err: OSError) -> SesameError:
    return SesameError(f"{flag} {path}: cannot write there ({err.strerror}); choose a folder you can write to")


def make_dir(path: str | Path, flag: str) -> Path:
    """Create ``path`` and its parents (after :func:`check_dir`)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SesameError(f"{flag} {path}: cannot create it ({err.strerror}); choose a folder you can write to") \
            from None
    return path


def claim_dir(path: str | Path, flag: str, kind: str | None = None, *, fix: str = "choose a new or empty folder"
              ) -> bool:
    """``path`` as this command's ``kind`` folder from now on (an application's gets its marker): checked
    (:func:`check_dir`), made (:func:`make_dir`), held (:func:`hold`), and checked again, since another command may
    have written there in between. Returns whether it already was one (the command continues it)."""
    path = Path(path)
    check_dir(path, flag, kind, fix=fix)
    make_dir(path, flag)
    hold(path, flag)
    existed = check_dir(path, flag, kind, fix=fix)
    if kind in APPLICATIONS and not (path / MARKER).exists():
        try:
            (path / MARKER).write_text(json.dumps({"kind": kind, "sesame_version": __version__}) + "\n")
        except OSError as err:
            raise _cannot_write(path, flag, err) from None
    return existed


def publish_dir(tmp: Path, out: Path, flag: str) -> None:
    """Move the finished folder ``tmp`` to ``out`` in one rename, which claims an output written whole beside it
    (shards, a decontaminated corpus): ``out`` absent or an empty folder; one another command filled meanwhile is
    refused, naming ``flag``."""
    try:
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as err:
        if out.is_dir() and any(out.iterdir()):
            raise SesameError(f"{flag} {out}: another command wrote there meanwhile; choose another {flag}") from None
        raise _cannot_write(out, flag, err) from None


_HELD: dict[Path, tuple[int, Path | None]] = {}  # this process's outputs: path → (locked descriptor, lock file)


def _lock_target(path: Path) -> Path | None:
    """What locks ``path``: the folder itself, or for a file the lock file ``.NAME.lock`` beside it (the file is
    written, under another name, only at the end); None where nothing can (no ``fcntl``: Windows)."""
    if fcntl is None:
        return None
    return path if path.is_dir() else path.with_name(f".{path.name}.lock")


def hold(path: str | Path, flag: str) -> bool:
    """Lock the output ``path`` (an existing folder, or a file to be written) for this process, until
    :func:`release` (or :func:`held`'s end) or the process's: an advisory ``flock`` on the folder, or on
    ``.NAME.lock`` beside the file, which the system drops when the process dies. Returns False where this process
    holds it already, or nothing can be locked (Windows, a filesystem without locks). Held by another process:
    refused, naming ``flag``."""
    key = Path(path).absolute()
    target = _lock_target(key)
    if target is None or key in _HELD:
        return False
    try:
        fd = os.open(target, os.O_RDONLY if target == key else os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise _cannot_write(Path(path), flag, err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = not _same_file(fd, target)  # a lock file its owner removed, ending, as we opened it
    except BlockingIOError:
        busy = True
    except OSError:  # a filesystem without locks (some network ones): unlocked, as on Windows
        os.close(fd)
        if target != key:
            target.unlink(missing_ok=True)
        return False
    if busy:
        os.close(fd)
        raise SesameError(f"{flag} {path}: another sesame command is writing there now; wait for it to end, or "
                          f"choose another {flag}")
    _HELD[key] = (fd, None if target == key else target)
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def release(path: str | Path) -> None:
    """Give up this process's lock on ``path`` (:func:`hold`), removing a file's lock file."""
    fd, lock_file = _HELD.pop(Path(path).absolute())
    if lock_file is not None:
        lock_file.unlink(missing_ok=True)  # before the lock goes: whoever opened it finds it gone (_same_file)
    os.close(fd)


@contextmanager
def held() -> Iterator[None]:
    """Release, at the end, the outputs held (:func:`hold`) inside: a command's life (sesame.cli.main)."""
    before = set(_HELD)
    try:
        yield
    finally:
        for path in [path for path in _HELD if path not in before]:
            release(path)


def _paths(given: str | Path | Iterable[str | Path] | None) -> list[Path]:
    if given is None:
        return []
    return [Path(given)] if isinstance(given, (str, Path)) else [Path(p) for p in given]


def _exists(path: Path, flag: str) -> SesameError:
    return SesameError(f"{flag} {path}: exists; sesame never replaces an existing file, so choose a new name (or move "
                       "that file away)")


def new_file(path: str | Path, flag: str, inputs: dict[str, str | Path | Iterable[str | Path] | None] | None = None
             ) -> Path:
    """``path`` checked as a file this command will write: not one of its ``inputs`` (``{flag: path or paths}``),
    not an existing file or folder; its missing parent folders are created, and it is held (:func:`hold`), which
    also finds a folder it cannot be written to before the command's work."""
    path = Path(path)
    for other, paths in (inputs or {}).items():
        if any(p.absolute().resolve() == path.absolute().resolve() for p in _paths(paths)):
            raise SesameError(f"{flag} {path}: is also {other}; a command never writes over its own input, so choose "
                              f"another {flag}")
    if path.is_dir():
        raise SesameError(f"{flag} {path}: is a folder; give the name of a new file")
    if path.exists() or path.is_symlink():
        raise _exists(path, flag)
    _check_parent(path, flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SesameError(f"{flag} {path}: cannot create its folder ({err.strerror}); choose a folder you can write "
                          "to") from None
    if hold(path, flag) and (path.exists() or path.is_symlink()):  # written meanwhile, by a command now ended
        release(path)
        raise _exists(path, flag)
    return path
