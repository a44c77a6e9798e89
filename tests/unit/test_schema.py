"""The one validation approach: every kind of mistake in the one error form, and construction that validates."""

import dataclasses
from typing import Annotated, Literal

import pytest

from schema import Bool, Float, Int, Range, Str, build, check_choice, check_range, schema


class Bad(ValueError):
    pass


@schema
class Inner:
    n: Annotated[Int, Range(0, 10)] = 0
    kind: Literal["a", "b"] = "a"
    on: Bool = False

    def __post_init__(self):
        if self.kind == "b" and self.n == 0:
            raise ValueError("kind b needs n > 0")


@schema
class Outer:
    name: Str
    inner: Inner = Inner()
    pair: tuple[Int, Int] = (1, 2)
    rate: Annotated[Float, Range(0)] = 0.0


@pytest.mark.parametrize(
    "data, message",
    [
        ({"name": "x", "inner": {"m": 1, "z": 2}}, "f: inner: unknown key(s) ['m', 'z']; allowed: ['n', 'kind', 'on']"),
        ({"name": "x", "inner": {"n": "5"}}, "f: inner.n: expected int, got '5'"),
        ({"name": "x", "inner": {"n": True}}, "f: inner.n: expected int, got True"),
        ({"name": "x", "inner": {"on": "yes"}}, "f: inner.on: expected bool, got 'yes'"),
        ({"name": "x", "inner": {"n": 11}}, "f: inner.n=11 out of range [0, 10]"),
        ({"name": "x", "rate": -1}, "f: rate=-1 out of range [0, inf]"),
        ({"name": "x", "inner": {"kind": "c"}}, "f: inner.kind='c'; allowed: ['a', 'b']"),
        ({"name": "x", "inner": {"kind": "b"}}, "f: inner: kind b needs n > 0"),
        ({"name": "x", "pair": [1]}, "f: pair: expected 2 values, got [1]"),
        ({"name": "x", "pair": [1, 2, 3]}, "f: pair: expected 2 values, got [1, 2, 3]"),
        ({"name": "x", "pair": 3}, "f: pair: expected a list, got 3"),
        ({"name": "x", "inner": 3}, "f: inner: expected a mapping, got 3"),
        ({}, "f: name: required"),
    ],
)
def test_each_mistake_in_the_one_form(data, message):
    with pytest.raises(Bad) as err:
        build(Outer, data, "", Bad)
    assert f"f: {err.value}" == message


def test_a_good_mapping_builds_and_ints_are_floats():
    out = build(Outer, {"name": "x", "rate": 3, "pair": [4, 5]}, "", Bad)
    assert out == Outer("x", Inner(), (4, 5), 3.0) and isinstance(out.rate, float)


def test_construction_and_replace_validate():
    with pytest.raises(ValueError):
        Inner(n=-1)
    with pytest.raises(ValueError):
        dataclasses.replace(Inner(), n=99)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Inner().n = 3


def test_rules_that_depend_on_other_fields_use_the_same_form():
    with pytest.raises(Bad, match=r"^capacity=8 out of range \[16, 64\]$"):
        check_range("capacity", 8, 16, 64, Bad)
    with pytest.raises(Bad, match=r"^model='huge'; allowed: \['tiny'\]$"):
        check_choice("model", "huge", ("tiny",), Bad)
