"""The strict loader behind every config section: params.yaml -> frozen dataclasses.

``params.yaml`` is the single source of every pipeline parameter: no config field has a default.
:func:`load_section` reads one section and builds its dataclass recursively, failing with the key
path and the file named when a key is unknown, missing or of the wrong type.

Supported field types: ``int``, ``float``, ``str``, ``bool``, ``Literal[...]``, ``X | None``,
``list[X]``, ``dict[str, X]``, nested dataclasses, and unions of dataclasses told apart by their
``Literal`` tag fields (``source``, ``asset``, ``format``, ``kind``, ``student``): a tagged union.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from distillpipe.errors import UserError

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    """A params.yaml value is missing, unknown or of the wrong type."""


def load_params(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found (run from the repository root or pass --params)")
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def load_section(path: str | Path, name: str, cls: type[T]) -> T:
    """Load the ``name`` section of the params file ``path`` into ``cls``."""
    data = load_params(path)
    if name not in data:
        raise ConfigError(f"{path}: missing section {name!r}")
    return build(cls, data[name], name, path)


def build(tp: Any, value: Any, key: str, path: str | Path = "params.yaml") -> Any:
    """Build a value of type ``tp`` from plain YAML data, checking it strictly."""
    where = f"{path}: {key}"
    if tp is Any:  # free-form (e.g. keyword arguments handed to a library): YAML data as it is
        return value
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, key, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args:
            if value is None:
                return None
            rest = tuple(a for a in args if a is not type(None))
            return build(rest[0] if len(rest) == 1 else Union[rest], value, key, path)
        if all(dataclasses.is_dataclass(a) for a in args):
            return build(_pick_variant(args, value, key, path), value, key, path)
        raise TypeError(f"unsupported union {tp}")  # programming error, not a user error
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [build(item, v, f"{key}[{i}]", path) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        _, item = typing.get_args(tp)
        return {str(k): build(item, v, f"{key}.{k}", path) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp}")


TAG_KEYS = ("source", "asset", "format", "kind", "student")


def _literal_fields(cls: type) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {k: typing.get_args(t) for k, t in hints.items() if k in TAG_KEYS and typing.get_origin(t) is Literal}


def _pick_variant(variants: tuple, value: Any, key: str, path: str | Path) -> type:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {value!r}")
    matches = []
    for cls in variants:
        tags = _literal_fields(cls)
        if all(value.get(k) in allowed for k, allowed in tags.items()):
            matches.append(cls)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # Name the tag keys, with the values each variant accepts, so the fix is obvious.
        options = [
            ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in _literal_fields(cls).items())
            for cls in variants
        ]
        got = {k: value.get(k) for cls in variants for k in _literal_fields(cls)}
        raise ConfigError(f"{path}: {key}: {got} matches no known kind; expected one of: {'; '.join(options)}")
    raise TypeError(f"{key}: ambiguous config variants {matches}")


def _build_dataclass(cls: type, value: Any, key: str, path: str | Path) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping for {cls.__name__}, got {value!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(f"{path}: {key}: unknown key(s) {unknown}; expected {names}")
    missing = [n for n in names if n not in value]
    if missing:
        raise ConfigError(f"{path}: {key}: missing key(s) {missing}")
    kwargs = {n: build(hints[n], value[n], f"{key}.{n}", path) for n in names}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None
