"""One way to validate configuration: YAML mappings -> frozen pydantic dataclasses, with one error form.

Responsible for: the `@schema` decorator (a frozen pydantic dataclass that refuses
unknown keys), the strict scalar types every schema uses (a bool is not an int,
a string is not a number; an int is a float), `Range` bounds, `build` (validate
a mapping and turn pydantic's errors into the form below) and `check_range` /
`check_choice` for the rules that depend on other fields. Netem profiles
(topology.profiles), the roles' deployment config (workers.roles.config) and
experiment specs (experiments.spec.experiment) all validate through here; each raises
its own error class.
Not responsible for: what a field means or its default (the schema classes),
reading files (their loaders prefix the file name).

The error form (a caller's `where` and, at the top, the file name prefix `path`):

    path: unknown key(s) ['x']; allowed: ['a', 'b']
    path: expected int, got 'many'
    path='c'; allowed: ['a', 'b']
    path=-1 out of range [0, 100]
    path: required
    path: expected 2 values, got [3]
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import annotated_types
import pydantic
from pydantic import ConfigDict, Strict, TypeAdapter, ValidationError

# Strict scalars: YAML's `yes` or a quoted "5" is a mistake to report, not a value to coerce.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # strict floats still take ints
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]

_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}


def schema(cls: type) -> type:
    """A frozen pydantic dataclass that refuses unknown keys (construction validates, also in replace())."""
    return pydantic.dataclasses.dataclass(frozen=True, config=_CONFIG)(cls)


def Range(lo: float, hi: float | None = None) -> annotated_types.Interval:
    """Bounds of a numeric field, both inclusive (hi None: unbounded above); use as Annotated[Int, Range(0, 9)]."""
    return annotated_types.Interval(ge=lo, le=hi)


@functools.cache
def _adapter(cls: Any) -> TypeAdapter:
    return TypeAdapter(cls)


def build(cls: Any, data: Any, where: str, error: type[Exception]) -> Any:
    """data validated as cls; on failure raise error(message) in the module's one form, `where` prefixing paths."""
    if dataclasses.is_dataclass(cls) and not isinstance(data, dict):
        raise error(f"{where or 'config'}: expected a mapping, got {data!r}")
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as err:
        raise error(describe(cls, err, where)) from None


def describe(cls: Any, err: ValidationError, where: str = "") -> str:
    """The first problem pydantic found, in the module's form (unknown keys are reported first)."""
    problems = err.errors(include_url=False)
    extras = [p for p in problems if p["type"] in ("unexpected_keyword_argument", "extra_forbidden")]
    if extras:
        parent = extras[0]["loc"][:-1]
        names = sorted(str(p["loc"][-1]) for p in extras if p["loc"][:-1] == parent)
        allowed = [f.name for f in dataclasses.fields(_resolve(cls, parent)[0])]
        return f"{_path(where, parent) or 'config'}: unknown key(s) {names}; allowed: {allowed}"
    return _one(cls, problems[0], where)


def _one(cls: Any, p: dict, where: str) -> str:
    loc, kind, value = p["loc"], p["type"], p.get("input")
    path = _path(where, loc) or where or "config"
    tp, meta = _resolve(cls, loc)
    if kind == "literal_error":
        return f"{path}={value!r}; allowed: {list(get_args(tp))}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        lo, hi = _bounds(meta)
        return f"{path}={value!r} out of range [{lo}, {'inf' if hi is None else hi}]"
    if kind in ("too_long", "too_short") or (kind == "missing" and loc and isinstance(loc[-1], int)):
        whole = loc if kind != "missing" else loc[:-1]
        return f"{_path(where, whole)}: expected {len(get_args(_resolve(cls, whole)[0]))} values, got {value!r}"
    if kind == "missing":
        return f"{path}: required"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{path}: {_expected(tp)}, got {value!r}"
    if kind in ("value_error", "assertion_error"):
        message = p["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return f"{path}: {message}" if loc else f"{where}: {message}" if where else message
    return f"{path}: {p['msg']}"


def _expected(tp: Any) -> str:
    if dataclasses.is_dataclass(tp) or tp is dict or get_origin(tp) is dict:
        return "expected a mapping"
    if get_origin(tp) is tuple or tp is tuple:
        return "expected a list"
    return f"expected {_TYPE_NAMES.get(tp, getattr(tp, '__name__', str(tp)))}"


def _path(where: str, loc: tuple) -> str:
    out = where
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else f"{out}.{part}" if out else str(part)
    return out


def _unwrap(tp: Any) -> tuple[Any, list]:
    """(the type without Annotated and Optional, the Annotated metadata)."""
    meta: list = []
    while True:
        if get_origin(tp) is Annotated:
            meta += list(tp.__metadata__)
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp, meta


def _resolve(cls: Any, loc: tuple) -> tuple[Any, list]:
    """The declared type (and its metadata) at loc inside cls; (None, []) where loc leaves the schema."""
    tp, meta = _unwrap(cls)
    for part in loc:
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            hints = get_type_hints(tp, include_extras=True)
            if part not in hints:
                return None, []
            tp, meta = _unwrap(hints[part])
        elif get_origin(tp) is dict and isinstance(part, str):  # a mapping's value at its key
            tp, meta = _unwrap(get_args(tp)[1])
        elif get_origin(tp) is tuple and isinstance(part, int):
            args = get_args(tp)
            tp, meta = _unwrap(args[0] if len(args) == 2 and args[1] is Ellipsis else args[min(part, len(args) - 1)])
        else:
            return None, []
    return tp, meta


def _bounds(meta: list) -> tuple[Any, Any]:
    lo = hi = None
    for m in meta:
        for name in ("ge", "gt"):
            lo = getattr(m, name, None) if getattr(m, name, None) is not None else lo
        for name in ("le", "lt"):
            hi = getattr(m, name, None) if getattr(m, name, None) is not None else hi
    return lo, hi


def check_range(path: str, value: float, lo: float, hi: float, error: type[Exception]) -> None:
    """A bound that depends on other fields (a capacity of at least one block, a length within the context)."""
    if not lo <= value <= hi:
        raise error(f"{path}={value!r} out of range [{lo}, {hi}]")


def check_choice(path: str, value: Any, allowed: tuple | list, error: type[Exception]) -> None:
    """A choice from a registry known only at run time (model configs, variants)."""
    if value not in allowed:
        raise error(f"{path}={value!r}; allowed: {list(allowed)}")


def literal_values(tp: Any) -> tuple:
    """The values of a Literal type (the one home of a set of names: MODES = literal_values(Mode))."""
    assert get_origin(tp) is Literal, tp
    return get_args(tp)
