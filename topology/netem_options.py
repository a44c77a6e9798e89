"""netem's structured options, typed: 4-state loss (`loss state`), packet slotting (`slot`), distribution tables.

Responsible for: the validated shape of `loss state p13 p31 p32 p23 p14` (FourStateLoss, with iproute2's
defaults and the chain's stationary loss rate), of `slot` (Slot: uniform MIN MAX or a distribution's DELAY
JITTER, with its packets/bytes budget), and of a distribution table named in a profile (a shipped name or
a user's .dist file in iproute2's format: found, parsed and checked here).
Not responsible for: the other LinkParams fields (topology.profiles), reading or rendering netem lines
(topology.netem_grammar), applying them (topology.netem_model).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from schema import Float, Int, Range, Str, schema

MAX_TIME_MS = 60_000
Pct = Annotated[Float, Range(0, 100)]
Ms = Annotated[Float, Range(0, MAX_TIME_MS)]
# netem's shipped tables (iproute2 installs NAME.dist); uniform needs none.
SHIPPED_TABLES = ("normal", "pareto", "paretonormal")
# iproute2 (tc/q_netem.c): a table holds at most this many s16 values.
NETEM_DIST_MAX = 16384
# Where iproute2 installs its tables (TC_LIB_DIR overrides, as in tc).
TC_LIB_DIRS = (Path("/usr/lib/x86_64-linux-gnu/tc"), Path("/usr/lib/tc"), Path("/usr/lib64/tc"), Path("/usr/share/tc"))


class DistTableError(ValueError):
    """A distribution table that cannot be found or read: the message names the file and the line."""


@schema
class FourStateLoss:
    """netem's 4-state Markov loss (`loss state p13 p31 p32 p23 p14`, tc-netem(8); states as in the kernel).

    State 1 is good reception, 2 good reception inside a burst, 3 a loss inside a burst, 4 an isolated loss.
    p13_pct: 1 -> 3, a burst starts (%)
    p31_pct: 3 -> 1, the burst ends (%); None = 100 - p13, iproute2's default
    p32_pct: 3 -> 2, a received packet inside the burst (%)
    p23_pct: 2 -> 3, back to losing inside the burst (%)
    p14_pct: 1 -> 4, an isolated loss (%)
    """

    p13_pct: Pct
    p31_pct: Pct | None = None
    p32_pct: Pct = 0.0
    p23_pct: Pct = 100.0
    p14_pct: Pct = 0.0

    @property
    def p31(self) -> float:
        """p31 resolved (%)."""
        return 100.0 - self.p13_pct if self.p31_pct is None else self.p31_pct

    def transitions(self) -> list[list[float]]:
        """The chain's transition matrix P[i][j] (probabilities, states 1..4 as indices 0..3)."""
        p13, p31, p32, p23, p14 = (v / 100 for v in (self.p13_pct, self.p31, self.p32_pct, self.p23_pct, self.p14_pct))
        return [
            [max(0.0, 1 - p13 - p14), 0.0, p13, p14],
            [0.0, 1 - p23, p23, 0.0],
            [p31, p32, max(0.0, 1 - p31 - p32), 0.0],
            [1.0, 0.0, 0.0, 0.0],
        ]

    def stationary(self) -> list[float]:
        """The chain's long-run state shares starting in state 1: pi P = pi, sum 1 (solved exactly), or, when that
        has no single answer (a state 1 that never leaves), the long-run average from state 1."""
        p = self.transitions()
        # Rows: (P^T - I) pi = 0 for states 2..4, and sum(pi) = 1.
        rows = [[1.0] * 4 + [1.0]] + [[p[i][j] - (i == j) for i in range(4)] + [0.0] for j in range(1, 4)]
        for col in range(4):
            pivot = max(range(col, 4), key=lambda r: abs(rows[r][col]))
            if abs(rows[pivot][col]) < 1e-12:
                return self._average_from_good()
            rows[col], rows[pivot] = rows[pivot], rows[col]
            for r in range(4):
                if r != col:
                    f = rows[r][col] / rows[col][col]
                    rows[r] = [a - f * b for a, b in zip(rows[r], rows[col])]
        return [rows[i][4] / rows[i][i] for i in range(4)]

    def _average_from_good(self, steps: int = 100_000) -> list[float]:
        p, dist, total = self.transitions(), [1.0, 0.0, 0.0, 0.0], [0.0] * 4
        for _ in range(steps):
            dist = [sum(dist[i] * p[i][j] for i in range(4)) for j in range(4)]
            total = [t + d for t, d in zip(total, dist)]
        return [t / steps for t in total]

    def mean_loss_pct(self) -> float:
        """Stationary loss rate (%): the share of time in the lossy states 3 and 4."""
        share = self.stationary()
        return 100 * (share[2] + share[3])


@schema
class Slot:
    """netem's packet slotting (tc-netem(8) `slot`): frames leave only in slots, each holding a budget.

    delay_ms: the uniform form's MIN_DELAY, or the distribution form's mean DELAY (ms)
    max_delay_ms: the uniform form's MAX_DELAY (ms); None = delay_ms (fixed slots)
    distribution: "" = uniform in [delay_ms, max_delay_ms); else a table (normal, pareto, paretonormal, a .dist)
    jitter_ms: the distribution form's JITTER (ms)
    packets: frames per slot; 0 = unlimited
    bytes: bytes per slot; 0 = unlimited
    """

    delay_ms: Ms = 0.0
    max_delay_ms: Ms | None = None
    distribution: Str = ""
    jitter_ms: Ms = 0.0
    packets: Annotated[Int, Range(0, 2**31 - 1)] = 0
    bytes: Annotated[Int, Range(0, 2**31 - 1)] = 0

    def __post_init__(self) -> None:
        if self.distribution and self.max_delay_ms is not None:
            raise ValueError("slot: a distribution takes DELAY JITTER, not MIN_DELAY MAX_DELAY")
        if not self.distribution and self.jitter_ms:
            raise ValueError("slot: jitter_ms needs a distribution (the uniform form is MIN_DELAY MAX_DELAY)")
        if self.max_delay_ms is not None and self.max_delay_ms < self.delay_ms:
            raise ValueError(f"slot: max_delay_ms {self.max_delay_ms} < delay_ms {self.delay_ms} (tc refuses it)")
        if self.distribution == "uniform":
            raise ValueError("slot: distribution uniform is the form `slot MIN_DELAY MAX_DELAY`")
        if self.distribution:
            check_distribution(self.distribution)
            if not self.jitter_ms:
                raise ValueError("slot: a distribution needs jitter_ms > 0 (tc: Non-positive jitter)")

    @property
    def max_ms(self) -> float:
        """MAX_DELAY resolved (ms)."""
        return self.delay_ms if self.max_delay_ms is None else self.max_delay_ms


def is_table_file(name: str) -> bool:
    """True when a distribution is named by a file path (a user's table), not by a shipped name."""
    return "/" in name or name.endswith(".dist")


def tc_lib_dirs() -> list[Path]:
    """Where tc looks for NAME.dist: $TC_LIB_DIR first (as tc does), then the usual install places."""
    env = os.environ.get("TC_LIB_DIR")
    return [*([Path(env)] if env else []), *TC_LIB_DIRS]


def table_path(name: str) -> Path:
    """The file of a distribution table: a path as given, or NAME.dist in tc's lib dirs; DistTableError if none."""
    if is_table_file(name):
        path = Path(name)
        if not path.is_file():
            raise DistTableError(f"distribution table {name}: no such file")
        return path
    for directory in tc_lib_dirs():
        if (directory / f"{name}.dist").is_file():
            return directory / f"{name}.dist"
    raise DistTableError(f"distribution table {name}.dist not found in {[str(d) for d in tc_lib_dirs()]}")


def parse_dist_table(text: str, source: str = "<table>") -> tuple[int, ...]:
    """An iproute2 .dist file: whitespace-separated s16 integers, '#' starts a comment line (tc/q_netem.c)."""
    values: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for word in line.split():
            try:
                value = int(word)
            except ValueError:
                raise DistTableError(f"{source}:{number}: {word!r} is not an integer") from None
            if not -32768 <= value <= 32767:
                raise DistTableError(f"{source}:{number}: {value} does not fit netem's 16-bit table entries")
            values.append(value)
    if not values:
        raise DistTableError(f"{source}: empty distribution table")
    if len(values) > NETEM_DIST_MAX:
        raise DistTableError(f"{source}: {len(values)} entries, netem takes at most {NETEM_DIST_MAX}")
    return tuple(values)


def read_table(name: str) -> tuple[int, ...]:
    """The values of distribution table `name` (a shipped name or a .dist path), checked."""
    path = table_path(name)
    return parse_dist_table(path.read_text(), str(path))


def check_distribution(name: str) -> None:
    """Refuse a distribution that is neither uniform, a shipped table, nor a readable .dist file (a user's)."""
    if name == "uniform" or name in SHIPPED_TABLES:
        return
    if not is_table_file(name):
        raise ValueError(f"distribution {name!r}: expected uniform, {', '.join(SHIPPED_TABLES)} or a .dist file path")
    try:
        read_table(name)
    except (OSError, DistTableError) as err:
        raise ValueError(str(err)) from None
