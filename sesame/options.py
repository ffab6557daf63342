"""Typed options: a spec's dataclass fields declare, once, their default, help, choices and flag.

The command line's flags (:func:`add_flags`, :func:`given`), ``compare``'s ``KEY=VALUE`` items
(:func:`parse_value`) and the Python API's keywords are all read from these declarations, so a
default is written in one place and renaming a field renames its flag everywhere.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import MISSING, Field, field, fields
from typing import Any, Callable, Iterable

from .errors import SesameError

SCALARS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict}  # dict: JSON objects
RATE = (0.0, 1.0)  # a dropout rate: 0 ≤ p < 1


def option(default: Any = MISSING, *, help: str, factory: Callable[[], Any] | None = None,
           choices: Iterable[str] | None = None, metavar: str | None = None, flag: str | None = None,
           cli: bool = True, within: tuple[float, float] | None = None) -> Any:
    """A spec field with its command-line declaration; ``cli=False`` keeps it out of the flags (set by
    another flag, by a pipeline that calls this one, or only from Python); ``within=(low, high)``: the values
    low ≤ v < high, which :func:`check_ranges` holds the spec to."""
    metadata = {"help": help, "choices": tuple(choices) if choices is not None else None, "metavar": metavar,
                "flag": flag, "cli": cli, "within": within}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def scalar_type(f: Field) -> tuple[type | None, bool, bool]:
    """(scalar type, optional, list) of a field annotated ``T``, ``T | None``, ``list[T]`` or ``list[T] | None``."""
    text = str(f.type).replace(" ", "")
    optional = text.endswith("|None")
    text = text.removesuffix("|None")
    many = text.startswith("list[")
    return SCALARS.get(text.removeprefix("list[").removesuffix("]")), optional, many


def flag_name(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def cli_fields(cls: type) -> list[Field]:
    """The fields of ``cls`` that are flags: declared so, and not among the ``no_flags`` names of a subclass that
    inherits fields it has no use for."""
    no_flags = getattr(cls, "no_flags", ())
    return [f for f in fields(cls) if f.metadata.get("cli", False) and f.name not in no_flags]


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
              required: Iterable[str] = ()) -> None:
    """One flag per command-line field of ``cls``; each defaults to None, so :func:`given` tells what was typed."""
    required = set(required)
    for f in cli_fields(cls):
        kind, _, many = scalar_type(f)
        meta = f.metadata
        extra: dict[str, Any] = {"help": meta["help"], "dest": f.name, "default": None}
        if f.name in required:
            extra["required"] = True
        if kind is bool:
            parser.add_argument(flag_name(f), action="store_true", **extra)
            continue
        if meta["choices"] is not None:
            extra["choices"] = meta["choices"]
        if meta["metavar"]:
            extra["metavar"] = meta["metavar"]
        parser.add_argument(flag_name(f), type=kind, nargs="+" if many else None, **extra)


def check_ranges(spec: Any) -> None:
    """Refuse a field of ``spec`` outside the range its option declares (``within``), naming the flag."""
    for f in fields(spec):
        within, value = f.metadata.get("within"), getattr(spec, f.name)
        if within is None or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not within[0] <= value < within[1]:
            below = f" and below {within[1]:g}" if math.isfinite(within[1]) else ""
            raise SesameError(f"{flag_name(f)} {value}: must be at least {within[0]:g}{below}")


def given(args: argparse.Namespace, cls: type) -> dict:
    """The command-line fields of ``cls`` that were given on the command line."""
    return {f.name: getattr(args, f.name) for f in cli_fields(cls) if getattr(args, f.name, None) is not None}


def defaults(cls: type) -> dict:
    """Every field of ``cls`` that has a default, with it."""
    found = {}
    for f in fields(cls):
        if f.default is not MISSING:
            found[f.name] = f.default
        elif f.default_factory is not MISSING:
            found[f.name] = f.default_factory()
    return found


def parse_value(cls: type, key: str, text: str, where: str) -> Any:
    """``text`` as the value of field ``key`` of ``cls``: read as JSON where it parses (strings stay as written),
    checked against the field's type (an int passes for a float); else an error naming ``where``."""
    f = {f.name: f for f in fields(cls)}[key]
    kind, _, many = scalar_type(f)
    if kind is str and not many:
        value: Any = text
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
    value = typed_value(f, value, where=where, shown=text)
    choices = f.metadata.get("choices")
    if choices is not None and value is not None and value not in choices:
        raise SesameError(f"{where}: {key}={text}: choose one of {', '.join(choices)}")
    return value


def typed_value(f: Field, value: Any, *, where: str, shown: str | None = None) -> Any:
    """``value`` held to field ``f``'s annotation (``T``, ``T | None``, ``list[T]``; an int passes for a float and
    becomes one; a bool is no number); else an error naming ``where``, the field and the value (``shown``: as the user
    wrote it)."""
    kind, optional, many = scalar_type(f)
    if kind is float and type(value) is int:
        value = float(value)
    ok = (value is None and optional) or (isinstance(value, list) if many else type(value) is kind) or kind is None
    if not ok:
        wanted = f"a list of {kind.__name__}" if many else f"a {kind.__name__}"
        if kind is bool and not many:
            wanted += " (true or false)"
        raise SesameError(f"{where}: {f.name}={json.dumps(value) if shown is None else shown} should be {wanted}")
    return value


def split_known(options: dict, *classes: type) -> list[dict]:
    """``options`` split by which of ``classes`` has a field of that name (the first that has); a name none
    has is a TypeError naming the known ones, as a misspelt keyword argument is."""
    names = [{f.name for f in fields(cls)} for cls in classes]
    parts: list[dict] = [{} for _ in classes]
    for key, value in options.items():
        for part, known in zip(parts, names):
            if key in known:
                part[key] = value
                break
        else:
            raise TypeError(f"unknown option {key!r}; known: {sorted(set().union(*names))}")
    return parts
