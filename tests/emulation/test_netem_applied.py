"""The tc backend applies the line it prints: every netem option installed on a real sch_netem and read back with
`tc qdisc show` (needs root and a kernel with netem: `make vm-test` runs it in the stock-kernel VM; skipped here).

Each case installs `topology.tc.netem_cmd` for a LinkParams on a dummy device in a namespace of its own (`pddq-show`,
deleted by name) and compares what the kernel reports with LinkParams.netem_line(), option by option; the change cases
do it after the TcBackend changed one line into another. `tc qdisc show`
does not print a distribution table's name, so a distribution is checked only as far as its delay and jitter.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from topology import tc
from topology.netem_grammar import parse_netem
from topology.profiles import LinkParams, link_params_from_dict
from topology.shaping import TcBackend
from topology.wire_netns import run

pytestmark = [pytest.mark.emulation]

if os.geteuid() != 0:
    pytest.skip("needs root: creates a network namespace", allow_module_level=True)
if shutil.which("tc") is None:
    pytest.skip("needs tc (make setup installs iproute2)", allow_module_level=True)
if not tc.kernel_has_netem():
    pytest.skip("this kernel has no sch_netem (make vm-test runs these in a stock kernel)", allow_module_level=True)

NS, DEV, OTHER = "pddq-show", "pddq0", "pddq1"  # OTHER: the TcBackend's second direction, plain
# Every option the grammar reads, spread over a few lines (one loss model per line, as netem takes).
LINES = [
    "limit 500 delay 40ms 8ms 25% distribution pareto loss random 1% 30% duplicate 5% 50% corrupt 1% 20% "
    "reorder 10% 25% gap 3 rate 100mbit 20 48 -4",
    "delay 10ms loss gemodel 1% 25% 50% 0% duplicate 50% 90%",  # the duplicate's correlation alone: tc's quirk
    "loss state 1% 30% 2% 80% 0.5% slot 10ms 20ms packets 5 bytes 3000",
    "delay 5ms 1ms distribution normal slot distribution pareto 5ms 1ms rate 12mbit",
    "duplicate 1% 60% corrupt 2%",
]
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(s|sec|ms|msec|us|usec|ns)$")
_SCALE = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6, "ns": 1e-9}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)(i?)bit$", re.IGNORECASE)
_LABELS = {"p", "r", "1-h", "1-k", "p13", "p31", "p32", "p23", "p14", "packetoverhead", "cellsize", "celloverhead"}


def _number(token: str) -> float | None:
    """A time (s), a percentage, a rate (bit/s) or a plain number as tc prints or takes them; None otherwise."""
    if m := _TIME.match(token):
        return round(float(m[1]) * _SCALE[m[2]], 9)
    if token.endswith("%"):
        return float(token[:-1])
    if m := _RATE.match(token):
        base = 1024 if m[3] else 1000
        return float(m[1]) * base ** "_KMGT".index(m[2].upper() or "_")
    try:
        return float(token)
    except ValueError:
        return None


def netem_values(text: str) -> dict[str, list[float]]:
    """The numbers each netem option carries, from a netem line or `tc qdisc show`'s report of one: option ->
    its values in order (labels such as gemodel's `p`/`r` and rate's `cellsize` skipped, a distribution's name
    dropped since show does not print it, zeros that mean "none" dropped)."""
    tokens = text.split()
    if "limit" in tokens:
        tokens = tokens[tokens.index("limit") :]
    out: dict[str, list[float]] = {}
    key = ""
    for token in tokens:
        if token in ("limit", "delay", "loss", "duplicate", "corrupt", "reorder", "gap", "rate", "slot"):
            key = token
            out.setdefault(key, [])
        elif token == "distribution" and key == "slot":
            key = "slot distribution"  # its delay and jitter; show prints `slot distribution D J`, without a name
            out.setdefault(key, [])
        elif token in ("random", "distribution", "ecn") or token in _LABELS:
            continue
        elif token in ("gemodel", "state", "packets", "bytes"):
            key = f"{key.split(' ')[0]} {token}"
            out.setdefault(key, [])
        elif (value := _number(token)) is not None:
            out[key].append(value)
        # else: a distribution's name
    if out.get("slot") and len(out["slot"]) == 1:
        out["slot"].append(out["slot"][0])  # `slot MIN` is MIN..MIN; show prints both
    for k in [k for k, v in out.items() if not any(v)]:
        del out[k]  # `slot 0us 0us`, a zero jitter: none
    for k, v in out.items():
        while v and v[-1] == 0 and k not in ("loss gemodel", "loss state"):
            v.pop()  # trailing zeros (a zero correlation, a zero cell overhead) are what no value means
    return out


def params(line: str) -> LinkParams:
    return link_params_from_dict(parse_netem(line), "<test>")


@pytest.fixture(scope="module")
def dummy():
    run(["ip", "netns", "add", NS])
    try:
        for dev in (DEV, OTHER):
            run(["ip", "-n", NS, "link", "add", dev, "type", "dummy"])
            run(["ip", "-n", NS, "link", "set", dev, "up"])
        yield lambda argv: run(["ip", "netns", "exec", NS, *argv])
    finally:
        run(["ip", "netns", "del", NS])


def fresh(dummy) -> None:
    """No netem on the device: a `replace` over an existing netem is a change (it would keep what it is not told)."""
    if "netem" in shown(dummy):
        dummy(tc.delete_root_cmd(DEV))


def shown(dummy) -> str:
    return dummy(["tc", "qdisc", "show", "dev", DEV])


def assert_same(report: str, p: LinkParams) -> None:
    got, want = netem_values(report), netem_values(p.netem_line())
    assert got.keys() == want.keys(), (report, p.netem_line())
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=2e-3, abs=1e-6), (key, report, p.netem_line())


def test_the_value_reader_understands_both_forms():
    # Pure: what show prints for LINES[1] and the line itself give the same numbers.
    report = "qdisc netem 8001: root refcnt 2 limit 1000 delay 10.0ms loss gemodel p 1% r 25% 1-h 50% 1-k 0% "
    report += "duplicate 50% 90%"
    assert netem_values(report) == netem_values(params(LINES[1]).netem_line())
    assert netem_values("limit 1000 rate 12Mbit packetoverhead 20 cellsize 48 celloverhead -4") == {
        "limit": [1000], "rate": [12e6, 20, 48, -4]}  # fmt: skip


@pytest.mark.parametrize("line", LINES)
def test_each_option_is_applied_as_printed(dummy, line):
    p = params(line)
    fresh(dummy)
    dummy(tc.netem_cmd(DEV, p))
    assert_same(shown(dummy), p)


@pytest.mark.parametrize(
    "before,after",
    [*((line, "delay 30ms") for line in LINES), *zip(LINES, LINES[1:] + LINES[:1])],
)
def test_a_live_change_leaves_only_the_new_line(dummy, before, after):
    # TcBackend.apply: a plain `tc qdisc change` where nothing the kernel keeps would stay in use, a reinstall
    # where something would (topology.tc.stale_after_change); either way the kernel shows the new line alone.
    fresh(dummy)
    shaper = TcBackend(lambda host, argv: dummy(argv), {"a_to_b": (None, DEV), "b_to_a": (None, OTHER)})
    shaper.start(params(before), LinkParams())
    try:
        shaper.apply("a_to_b", params(after))
        assert_same(shown(dummy), params(after))
    finally:
        shaper.stop()
