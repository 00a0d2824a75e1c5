"""Typed values <-> JSON data: how inputs and expected values travel (to a rank, into ``expected.json``).

``to_data`` turns a sub-problem's frozen dataclass of inputs or expected values into JSON-able data;
``from_data`` rebuilds it from its type hints.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


def to_data(value: Any) -> Any:
    """JSON-able data for ``value``: a dataclass, container or scalar.

    Fields may be ints, floats, strings, bools, lists, tuples, dicts (also with tuple keys, e.g. ``(microbatches,
    stages)``) and nested dataclasses. A dict whose keys are not strings is stored as a list of ``[key, value]``
    pairs, so no key is ever joined into a string in one place and parsed back in another::

        Expected(waves={(4, 3): [...]})  <->  {"waves": [[[4, 3], [...]]]}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: to_data(v) for k, v in value.items()}
        return [[to_data(k), to_data(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"to_data: cannot store a {type(value).__name__}")


def from_data(kind: Any, data: Any) -> Any:
    """Rebuild a value of type ``kind`` (a dataclass or a typing hint) from ``to_data`` output."""
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{kind.__name__}: unknown fields {sorted(unknown)}")
        return kind(**{name: from_data(hints[name], value) for name, value in data.items()})
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        return from_data(next(p for p in params if p is not type(None)), data)
    if origin is dict:
        key_type, value_type = params
        pairs = data.items() if isinstance(data, dict) else data
        return {from_data(key_type, k): from_data(value_type, v) for k, v in pairs}
    if origin is list:
        return [from_data(params[0], v) for v in data]
    if origin is tuple:
        if len(params) == 2 and params[1] is Ellipsis:
            return tuple(from_data(params[0], v) for v in data)
        return tuple(from_data(p, v) for p, v in zip(params, data))
    if kind is float and isinstance(data, int):
        return float(data)
    return data
