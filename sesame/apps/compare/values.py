"""The values of compare's ``KEY=VALUE`` items, typed like their defaults (approaches' and tasks' alike)."""
from __future__ import annotations

import json

from ...errors import SesameError


def typed(where: str, key: str, text: str, default: object, shown: bool = True) -> object:
    """``text`` read as JSON when it parses (else as a string), checked against the type of ``default``
    (named in the error when ``shown``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    return checked(where, key, value, default, shown)


def checked(where: str, key: str, value: object, default: object, shown: bool = True) -> object:
    """``value``, if it has the type of ``default`` (an int passes for a float); else an error naming ``where``."""
    if isinstance(default, float) and type(value) is int:
        value = float(value)
    if default is not None and type(value) is not type(default):
        raise SesameError(f"{where}: {key}={json.dumps(value)} should be a {type(default).__name__}"
                          + (f", like the default {key}={json.dumps(default)}" if shown else ""))
    return value
