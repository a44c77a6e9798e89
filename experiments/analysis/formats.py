"""Numbers as summary.md and sweep.md print them: thousands, kB / MB / GB, percentages, ratio ends; "–" where
there is no value (None or nan), never 0."""

from __future__ import annotations

import math


def num(x, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def pct(share) -> str:
    """A share (0..1) as a percentage with one decimal; "–" where it was not measured."""
    return "–" if share is None else f"{100 * share:,.1f}%"


def size(x) -> str:
    """Bytes, human-readable (kB / MB / GB, powers of 1000)."""
    if x is None:
        return "–"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:,.1f} {unit}"
    return f"{x:,.0f} B"


def ratio_end(x) -> str:
    return "∞" if x is None else f"{x:.2f}"
