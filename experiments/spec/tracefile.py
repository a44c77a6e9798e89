"""Trace files read safely: one JSON value per line; hostile lines fail with file:line, never a raw Python error.

Responsible for: reading a JSON-lines file line by line (bytes that are not
UTF-8, JSON that does not parse, nesting too deep for the parser, integers too
long to be a count or a time are refused naming the line), and showing a bad
value in an error message at a bounded length (a 2 MiB list is shown as its
first items, a 5,000-digit number as its digit count).
Not responsible for: what the keys of a line mean (experiments.spec.mooncake
for the FAST'25 format, experiments.spec.workload for the testbed's own).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterator
from pathlib import Path

MAX_INT_DIGITS = 18  # below 2**63 and exact enough as a float: longer is no count, length or time in ms


class Huge:
    """An integer of more than MAX_INT_DIGITS digits in a line: kept as its digit count, never converted."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"a {self.digits}-digit number"


def _int(text: str) -> int | Huge:
    return Huge(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 40, 40


def shown(value) -> str:
    """value's repr, cut to about a hundred characters whatever its size or nesting."""
    return _SHOW.repr(value)


def lines(path: Path, error: type[Exception]) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of path; `error` names the file (unreadable) or the line (not UTF-8)."""
    try:
        with Path(path).open("rb") as f:
            for no, raw in enumerate(f, 1):
                try:
                    yield no, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise error(f"{path}:{no}: not UTF-8 (byte {err.start + 1} of the line)") from None
    except OSError as err:
        raise error(f"{path}: cannot read the trace: {err.strerror}") from None


def parse(raw: str, where: str, error: type[Exception]):
    """The JSON value of one line; an integer over MAX_INT_DIGITS digits becomes a Huge, which every int
    check refuses by its field; `error` names `where` (file:line) for JSON that cannot be read."""
    try:
        return json.loads(raw, parse_int=_int)
    except json.JSONDecodeError as err:
        raise error(f"{where}: not JSON: {err.msg} (column {err.colno})") from None
    except RecursionError:
        raise error(f"{where}: not JSON this loader reads: nested too deep") from None
