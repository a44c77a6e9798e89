"""Compare two runs' summary.json field by field, leaving out timings and intervals.

    .venv/bin/python scripts/compare_summaries.py RUN_A RUN_B [--all]

Prints every field (as a dotted path) whose value differs between the two summaries and is not a timing (a
latency, a duration, a rate per second, an emulator or TCP figure) or an interval; fields only one of them has
are listed apart. Exit status 0 when nothing else differs. It answers "did a change of code change what a run
computes?" for two runs of one spec and seed (a refactor's before and after). Fields that follow the machine's
timing (which transfers a slow moment cancelled, how many requests the RLD finished) differ between any two
runs; --all shows the timings too.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# A path is a timing or an interval when one of its parts matches: latencies and durations (ms, s, us), rates
# (per second, Mbit/s, rps), emulator and TCP figures, and every ci95 block.
TIMING = re.compile(
    r"(_ms|_s|_us|ms|_rps|per_s|_mbit|mbit|ci95|duration|lateness|emulator|rtt|cwnd|queue|busy|occupancy"
    r"|throughput|tcp|retrans|analysed_by|late|time|gap|open|load|similarity)",
)


def flatten(x, prefix: str = "") -> dict[str, object]:
    """{dotted.path: leaf value}; list items by index."""
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(x, list):
        out = {}
        for i, v in enumerate(x):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): x}


def is_timing(path: str) -> bool:
    return any(TIMING.search(part) for part in path.split("."))


def load(run: str) -> dict:
    p = Path(run)
    return json.loads((p / "summary.json" if p.is_dir() else p).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--all", action="store_true", help="timings and intervals too")
    args = ap.parse_args(argv)
    a, b = flatten(load(args.a)), flatten(load(args.b))
    keep = (lambda p: True) if args.all else (lambda p: not is_timing(p))
    differ = [p for p in sorted(set(a) & set(b)) if keep(p) and a[p] != b[p]]
    only = [(p, "a" if p in a else "b") for p in sorted(set(a) ^ set(b)) if keep(p)]
    compared = sum(keep(p) for p in set(a) & set(b))
    for p in differ:
        print(f"differs  {p}: {a[p]!r} -> {b[p]!r}")
    for p, side in only:
        print(f"only in {side}  {p}: {(a if side == 'a' else b)[p]!r}")
    print(f"{compared} fields compared (timings and intervals left out), {len(differ)} differ, {len(only)} in one only")
    return 1 if differ or only else 0


if __name__ == "__main__":
    sys.exit(main())
