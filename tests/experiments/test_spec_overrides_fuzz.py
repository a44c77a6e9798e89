"""`--set` overrides fuzzed (hypothesis): keys drawn from the spec's own field paths, the same paths misplaced
(under deployment., workload., a variant's definition ...) and junk, with values of every YAML shape. Each
either loads or is refused by one SpecError line naming the field: never a traceback, never another exception.
"""

from __future__ import annotations

import dataclasses
import json
from typing import get_type_hints

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.spec import experiment as spec
from experiments.spec.experiment import ExperimentSpec, SpecError

SPEC = "pdd-smoke"


def field_paths(cls: type = ExperimentSpec, prefix: str = "") -> list[str]:
    """Every dotted field path of the spec's schema (nested sections and their leaves)."""
    out = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        out.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            out += field_paths(hints[f.name], f"{path}.")
    return out


PATHS = field_paths()
# Where a real field path lands when written under the wrong section.
MISPLACED_UNDER = ("deployment.", "workload.", "pools.p.", "variant_defs.v1.", "deployment.policy.", "slo.")
JUNK_KEYS = ("", ".", "..", "a..b", "workload.", ".workload", "__class__", "name.x", "pools.p.workers.x", "x" * 80)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["../../..", "/", "-1", "1e999", "pdd", "colocated", "cuda", "ray://h:1", "0-1", "tiny"]),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)
raw_junk = st.sampled_from(["[", "{a", ": :", "!!python/object:os.system", "a: [", "'", "- - -", "*x", "&a b", "{{}}"])
values = st.one_of(json_values.map(json.dumps), raw_junk, st.text(max_size=20))
keys = st.one_of(
    st.sampled_from(PATHS),
    st.builds(lambda under, path: under + path, st.sampled_from(MISPLACED_UNDER), st.sampled_from(PATHS)),
    st.sampled_from(JUNK_KEYS),
    st.text(max_size=20),
)


def check(items: list[str]) -> None:
    """The spec loads with items, or SpecError refuses them in one line naming a field of the key."""
    try:
        spec.load(SPEC, items)
    except SpecError as err:
        message = str(err)
        assert "\n" not in message, f"--set {items}: not one line: {message!r}"
        parts = [p for item in items for p in item.partition("=")[0].strip().split(".") if p]
        keys = [item.partition("=")[0].strip() for item in items]
        named = [*parts, *(repr(p)[1:-1] for p in parts), *(k for k in keys if k), *(repr(i) for i in items)]
        assert any(n in message for n in named), f"--set {items}: the error names none of {parts}: {message!r}"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(key=keys, value=values)
def test_any_override_loads_or_is_refused_in_one_line_naming_the_field(key, value):
    check([f"{key}={value}"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(items=st.lists(st.builds(lambda k, v: f"{k}={v}", keys, values), min_size=2, max_size=3))
def test_several_overrides_together_load_or_are_refused_in_one_line(items):
    check(items)


def test_a_role_config_argument_under_deployment_is_refused_naming_it():
    """deployment.pools (and the other names roles_config takes itself) were a TypeError, not the field."""
    for key in ("deployment.pools.md=2", "deployment.capacity_tokens.p=9", "deployment.threads=2"):
        try:
            spec.load(SPEC, [key])
        except SpecError as err:
            assert key.split("=")[0].split(".")[1] in str(err)
        else:
            raise AssertionError(f"--set {key} loaded")
