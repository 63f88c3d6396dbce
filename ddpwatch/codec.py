"""JSON for frozen dataclasses, driven by their type hints.

Snapshots are saved and replayed (`--save-snapshot`, `--replay`), so every type
a snapshot holds is a dataclass of JSON-friendly fields: numbers, strings,
bools, tuples, `dict[str, ...]`, `X | None`, and nested dataclasses.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing


def to_json(value):
    if dataclasses.is_dataclass(value):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


class DecodeError(ValueError):
    """The JSON does not have the shape of the type; the message names the path."""


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def from_json(tp, data, path: str = "$"):
    """Rebuild a value of type `tp` from `data` (as made by to_json)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise DecodeError(f"{path}: expected an object for {tp.__name__}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = from_json(hints[f.name], data[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise DecodeError(f"{path}: missing field {f.name!r} of {tp.__name__}")
        return tp(**kwargs)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return from_json(arg, data, path)
            except (DecodeError, TypeError, ValueError) as err:
                errors.append(str(err))
        raise DecodeError(f"{path}: matches none of {tp}: {'; '.join(errors)}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise DecodeError(f"{path}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
        return tuple(from_json(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        _, value_type = typing.get_args(tp)
        if not isinstance(data, dict):
            raise DecodeError(f"{path}: expected an object")
        return {k: from_json(value_type, v, f"{path}.{k}") for k, v in data.items()}
    if tp is float:
        if not isinstance(data, (int, float)) or isinstance(data, bool):
            raise DecodeError(f"{path}: expected a number, got {data!r}")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise DecodeError(f"{path}: expected {tp.__name__}, got {data!r}")
        return data
    if tp is typing.Any or tp is object:
        return data
    raise DecodeError(f"{path}: cannot decode type {tp!r}")


def read_json_file(path: str, error: type[Exception], hint: str = ""):
    """The JSON document in `path`; a file that cannot be read or parsed raises
    `error` naming the file (and the line of a syntax error), `hint` appended
    to an unreadable file's message."""
    import json
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as err:
        raise error(f"{path}: {err.strerror}{hint}") from err
    except json.JSONDecodeError as err:
        raise error(f"{path}:{err.lineno}: not JSON: {err.msg}") from err
