"""Check a stored event payload against its code's typed definition at run time.

``audit/payloads.py`` gives each event code one ``TypedDict``; mypy holds the
services' writers to it, but rows written another way (the scale loader's COPY,
``config/scale_data``) are plain JSON that mypy never sees. :func:`problems` reads
a payload as stored (JSON: a datetime is its ISO text) and lists each difference:
a required key missing, a key the definition does not have, a value of another
type (nested ``TypedDict``, ``list``, ``dict``, ``Mapping``, unions and ``None``
included; ``Any`` takes anything; ``bool`` is not an ``int``).

Which keys are required is read from ``NotRequired[...]`` and ``total=False``
here, not from ``__required_keys__``: on Python 3.11 a class-based ``TypedDict``
in a module with ``from __future__ import annotations`` lists its ``NotRequired``
keys as required.
"""

from __future__ import annotations

import collections.abc
import datetime as dt
import types
import typing
from typing import Any, NotRequired

from audit import payloads
from audit.models import EventCode


def _is_typed_dict(kind: Any) -> bool:
    return isinstance(kind, type) and typing.is_typeddict(kind)


def _keys(definition: type) -> tuple[dict[str, Any], set[str]]:
    """The definition's keys with their types, and which of them are required."""
    hints = typing.get_type_hints(definition, include_extras=True)
    optional = set(getattr(definition, "__optional_keys__", ()))
    types_of: dict[str, Any] = {}
    required: set[str] = set()
    for key, hint in hints.items():
        if typing.get_origin(hint) is NotRequired:
            types_of[key] = typing.get_args(hint)[0]
            continue
        types_of[key] = hint
        if key not in optional:
            required.add(key)
    return types_of, required


def _check(kind: Any, value: Any, path: str) -> list[str]:
    if kind is Any:
        return []
    if _is_typed_dict(kind):
        if not isinstance(value, dict):
            return [f"{path or 'payload'}: {type(value).__name__}, not an object"]
        types_of, required = _keys(kind)
        found = [f"{path}{key}: missing" for key in sorted(required - value.keys())]
        found += [
            f"{path}{key}: not in {kind.__name__}"
            for key in sorted(value.keys() - types_of.keys())
        ]
        for key in sorted(value.keys() & types_of.keys()):
            found += _check(types_of[key], value[key], f"{path}{key}.")
        return found
    where = path.rstrip(".") or "payload"
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if any(not _check(option, value, path) for option in options):
            return []
        return [f"{where}: {value!r:.60} is none of {kind}"]
    if kind is type(None):
        return [] if value is None else [f"{where}: {value!r:.60}, not null"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        (item,) = typing.get_args(kind) or (Any,)
        return [p for i, v in enumerate(value) for p in _check(item, v, f"{path}{i}.")]
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        _, item = typing.get_args(kind) or (str, Any)
        return [p for k, v in value.items() for p in _check(item, v, f"{path}{k}.")]
    if kind is dt.datetime:
        try:
            dt.datetime.fromisoformat(value)
        except (TypeError, ValueError):
            return [f"{where}: {value!r:.60}, not an ISO date-time"]
        return []
    if kind is bool:
        return [] if isinstance(value, bool) else [f"{where}: {value!r:.60}, not bool"]
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return []
        return [f"{where}: {value!r:.60}, not int"]
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return []
        return [f"{where}: {value!r:.60}, not a number"]
    if kind is str:
        return [] if isinstance(value, str) else [f"{where}: {value!r:.60}, not str"]
    raise TypeError(f"payload_shapes cannot check {kind!r} (at {where}); add it")


def problems(code: str, payload: Any) -> list[str]:
    """What differs between ``payload`` (as stored) and ``code``'s definition;
    empty when it is in the live shape."""
    definition = payloads.PAYLOADS.get(EventCode(code))
    if definition is None:
        return [f"{code}: no definition in audit/payloads.py"]
    return _check(definition, payload, "")
