"""Config validation: bind every config group to the signature of what it configures, without building anything.

Hydra already refuses unknown keys given on the command line (the composed config is in struct mode). What it
cannot see is a typo inside a YAML file, a wrong type, or a value out of range. `bind()` checks a mapping against a
dataclass or a class's `__init__` signature in milliseconds, so a bad sweep fails before any job trains
(the torchtune way).

Ranges are declared where a value is defined, as `annotated_types` constraints on its annotation
(`Annotated[int, Ge(1)]`, the metadata pydantic reads too), and `bind` checks them, naming the key. Every float,
also inside lists and mappings, must be finite: no setting here has a meaning for NaN or infinity, and a NaN passes
every `<`/`>` check written for it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import annotated_types

from sweeplab.core.errors import ConfigError

_META_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_"})


def _accepted(cls: type) -> dict[str, Any]:
    """Parameter name -> type annotation (Any when unannotated) of a dataclass or a class's __init__."""
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, include_extras=True)
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}
    init = cls.__init__
    try:
        hints = typing.get_type_hints(init, include_extras=True)
    except Exception:
        hints = {}
    params = inspect.signature(init).parameters
    return {
        name: hints.get(name, Any)
        for name, p in params.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _matches(value, typing.get_args(tp)[0])
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (list, tuple, typing.Sequence):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return isinstance(value, (list, tuple)) and all(_matches(v, item_tp) for v in value)
    if origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def bind(cls: type, values: Mapping[str, Any], where: str, ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Check `values` against `cls`'s parameters: unknown keys, wrong types. Returns the keyword arguments."""
    return check_values(_accepted(cls), values, where, ignore)


def check_values(accepted: Mapping[str, Any], values: Mapping[str, Any], where: str,
                 ignore: frozenset[str] = frozenset(), unknown_keys: bool = True) -> dict[str, Any]:
    """`bind` against parameter name -> annotation; `unknown_keys=False` lets keys `accepted` lacks pass unchecked."""
    kwargs = {}
    for key, value in values.items():
        if key in _META_KEYS or key in ignore or (not unknown_keys and key not in accepted):
            continue
        if key not in accepted:
            close = [k for k in accepted if k.startswith(key[:3])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}.{key}", f"unknown key{hint}; accepted: {', '.join(sorted(accepted))}")
        if not _matches(value, accepted[key]):
            raise ConfigError(f"{where}.{key}", f"expected {_type_name(accepted[key])}, got {value!r}")
        problem = _non_finite(value) or _out_of_range(value, accepted[key])
        if problem:
            raise ConfigError(f"{where}.{key}", problem)
        kwargs[key] = value
    return kwargs


@functools.cache
def source_accepted(target: str) -> dict[str, Any]:
    """Parameter name -> annotation of the class a "package.module:Name" target names, read from its module's source
    without importing the module (which may import torch: seconds), so a wrong value fails in milliseconds. Only
    annotations made of builtins, `Literal`, `Annotated` and `annotated_types` bounds are read; any other is `Any`
    (the full check, `bind`, sees it when the job is planned). {} when the source cannot be found."""
    module_name, _, name = target.partition(":")
    try:
        spec = importlib.util.find_spec(module_name)
        tree = ast.parse(Path(spec.origin).read_text()) if spec is not None and spec.origin else None
    except (ImportError, OSError, SyntaxError, ValueError):
        return {}
    node = next((n for n in getattr(tree, "body", ()) if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        return {}
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        arguments = [*init.args.args[1:], *init.args.kwonlyargs]
        return {a.arg: _annotation(a.annotation) for a in arguments}
    return {n.target.id: _annotation(n.annotation) for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and "ClassVar" not in ast.unparse(n.annotation)}


@functools.cache
def source_keys(target: str) -> tuple[str, ...] | None:
    """The string keys of the dict literal a "package.module:NAME" target names (a family's model SIZES), read from
    the module's source without importing it; None where it is no such literal (the plan checks it then)."""
    module_name, _, name = target.partition(":")
    try:
        spec = importlib.util.find_spec(module_name)
        tree = ast.parse(Path(spec.origin).read_text()) if spec is not None and spec.origin else None
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in getattr(tree, "body", ()):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Dict):
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.value.keys]
            return tuple(keys) if all(isinstance(k, str) for k in keys) else None
    return None


def shown(value: Any, limit: int = 60) -> str:
    """A value as an error line shows it: its repr, cut to `limit` characters (a 5,000-character size is no line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


_ANNOTATION_NAMES = {
    "int": int, "float": float, "bool": bool, "str": str, "None": type(None), "Any": Any, "Literal": Literal,
    "Annotated": Annotated, "list": list, "tuple": tuple, "dict": dict, "Mapping": Mapping,
    **{name: getattr(annotated_types, name) for name in ("Ge", "Gt", "Le", "Lt", "Interval", "Len", "MinLen", "MaxLen")},
}


def _annotation(node: ast.expr | None) -> Any:
    if node is None:
        return Any
    try:
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ast.unparse(node)
        return eval(compile(text, "<annotation>", "eval"), {"__builtins__": {}}, _ANNOTATION_NAMES)  # noqa: S307
    except Exception:  # a name this reader does not know (a class, a type alias): checked when the job is planned
        return Any


def build(cls: type, values: Mapping[str, Any], where: str, ignore: frozenset[str] = frozenset()) -> Any:
    """`bind`, then construct; a ValueError raised by the constructor's own checks is re-raised naming `where`."""
    kwargs = bind(cls, values, where, ignore)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(where, str(exc)) from None


def build_sized(cls: type, sizes: Mapping[str, Mapping[str, Any]], values: Mapping[str, Any], where: str) -> Any:
    """Build a model config dataclass from `size` (a named preset) plus explicit keys; null keys come from the size.

    `family` and `size` are the config group's own keys, not the dataclass's.
    """
    size = values.get("size", "default")
    if size not in sizes:
        # debug=smoke asks every family for `tiny`: a family without one hears why it is asked
        smoke = " (debug=smoke sets model.size=tiny: give the family a `tiny` size for quick checks)" if size == "tiny" else ""
        raise ConfigError(f"{where}.size", f"unknown size {shown(size)}; accepted: {', '.join(sizes)}{smoke}")
    explicit = {k: v for k, v in values.items() if v is not None}
    kwargs = {**sizes[size], **bind(cls, explicit, where, ignore=frozenset({"family", "size"}))}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(where, str(exc)) from None


def _non_finite(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number, got {value!r}"
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return next((problem for v in value if (problem := _non_finite(v))), None)
    return None


_HOLDS = {"gt": (">", float.__gt__), "ge": (">=", float.__ge__), "lt": ("<", float.__lt__), "le": ("<=", float.__le__)}


def _out_of_range(value: Any, tp: Any) -> str | None:
    """The first `annotated_types` constraint of `tp` (or of the union member or list items `value` is) that
    `value` breaks, as "must be ..., got ..."; None when it keeps them all (or `tp` declares none)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *metadata = typing.get_args(tp)
        for constraint in metadata:
            if problem := _breaks(value, constraint):
                return problem
        return _out_of_range(value, base)
    if origin in (Union, types.UnionType):
        member = next((a for a in typing.get_args(tp) if _matches(value, a)), None)
        return _out_of_range(value, member) if member is not None else None
    if origin in (list, tuple, typing.Sequence) and isinstance(value, (list, tuple)):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        for i, item in enumerate(value):
            if problem := _out_of_range(item, item_tp):
                return f"item {i} {problem}"
    return None


def _breaks(value: Any, constraint: Any) -> str | None:
    """What `value` breaks of one constraint: a bound (Gt, Ge, Lt, Le), an Interval of them, or a length."""
    if isinstance(constraint, (annotated_types.Len, annotated_types.MinLen, annotated_types.MaxLen)):
        low = getattr(constraint, "min_length", 0)
        high = getattr(constraint, "max_length", None)
        if isinstance(value, str):  # a name, a path: its length in characters
            if len(value) < low:
                return "empty" if not value else f"needs at least {low} characters, got {value!r}"
            return f"longer than {high} characters ({len(value)})" if high is not None and len(value) > high else None
        if len(value) < low or (high is not None and len(value) > high):
            wanted = f"{low}" if low == high else f"{low} to {high}" if high is not None else f"at least {low}"
            return f"needs {wanted} values, got {value!r}"
        return None
    bounds = [(attr, bound) for attr in _HOLDS if (bound := getattr(constraint, attr, None)) is not None]
    if not bounds or all(_HOLDS[attr][1](float(value), float(bound)) for attr, bound in bounds):
        return None
    if isinstance(constraint, annotated_types.Interval) and len(bounds) == 2:
        (low_attr, low), (high_attr, high) = bounds
        return f"must be in {'[' if low_attr == 'ge' else '('}{low}, {high}{']' if high_attr == 'le' else ')'}, got {value!r}"
    return " and ".join(f"must be {_HOLDS[attr][0]} {bound}" for attr, bound in bounds) + f", got {value!r}"
