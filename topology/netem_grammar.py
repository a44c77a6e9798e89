"""netem's argument grammar (tc-netem(8)): a netem line parsed into LinkParams fields, and LinkParams rendered as one.

Responsible for: reading the arguments after `netem` in a `tc qdisc ... netem ARGS` command with
iproute2's rules (keywords and their prefixes, the `latency`/`drop` aliases, optional numbers taken only
when the next token starts like a number, tc's time, rate and percent units), refusing what LinkParams
cannot hold ("not supported yet: ...") instead of dropping it, and rendering any LinkParams as the netem
line the tc backend applies (topology.tc builds its argv with `render_netem`).
Not responsible for: the LinkParams model and profile files (topology.profiles, which calls `parse_netem`
for a direction written as `netem: "..."`), running tc (topology.shaping).

Resolution (what a rendered line carries, so a parsed line renders back to the same values): times in
whole microseconds, rates in whole bit/s, percentages in 6 significant digits; finer values are refused.
A bare number is a percentage, as in tc; a time or a rate needs its unit. An omitted `limit` is this
testbed's derived queue (LinkParams.effective_limit_pkts, at least netem's 1000), not a fixed 1000.

This module sits below topology.profiles (which imports it), so it returns plain field dicts and renders
any object with LinkParams' attributes.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Protocol

from topology.netem_options import is_table_file

# Bounds of LinkParams' fields (topology.profiles uses them in its annotations; one home).
MAX_TIME_MS = 60_000
MAX_RATE_MBIT = 100_000
MAX_LIMIT_PKTS = 10_000_000
MAX_GAP = 1_000_000
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")

# iproute2 tries the keywords in this order, each matching any non-empty prefix of itself (`matches()`).
_KEYWORDS = ("limit", "latency", "delay", "loss", "drop", "ecn", "reorder", "corrupt", "gap", "duplicate",
             "distribution", "rate", "slot")  # fmt: skip
_ALIASES = {"latency": "delay", "drop": "loss"}
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_STARTS_LIKE_NUMBER = re.compile(r"[+-]?\.?\d", re.ASCII)  # strtod's view: what tc takes as an optional number
_TIME_US = {  # get_time's units, case-insensitive, in microseconds
    **dict.fromkeys(("s", "sec", "secs"), Decimal(1_000_000)),
    **dict.fromkeys(("ms", "msec", "msecs"), Decimal(1000)),
    **dict.fromkeys(("us", "usec", "usecs"), Decimal(1)),
    **dict.fromkeys(("ns", "nsec", "nsecs"), Decimal("0.001")),
}
_RATE_BIT = {  # get_rate's units, case-insensitive (so `mbps` is megaBYTES per second, as in tc), in bit/s
    "bit": 1, "kibit": 1024, "kbit": 10**3, "mibit": 1024**2, "mbit": 10**6, "gibit": 1024**3, "gbit": 10**9,
    "tibit": 1024**4, "tbit": 10**12, "bps": 8, "kibps": 8 * 1024, "kbps": 8 * 10**3, "mibps": 8 * 1024**2,
    "mbps": 8 * 10**6, "gibps": 8 * 1024**3, "gbps": 8 * 10**9, "tibps": 8 * 1024**4, "tbps": 8 * 10**12,
}  # fmt: skip


class NetemSyntaxError(ValueError):
    """A netem line that cannot be read or held: the message names the token, its position and what was expected."""


class NetemParams(Protocol):
    """What the renderer reads: LinkParams' fields (topology.profiles.LinkParams)."""

    rate_mbit: float
    limit_pkts: int
    delay_ms: float
    jitter_ms: float
    delay_distribution: str
    delay_correlation_pct: float
    loss_pct: float
    loss_correlation_pct: float
    loss_ge: Any
    loss_state: Any
    duplicate_pct: float
    duplicate_correlation_pct: float
    corrupt_pct: float
    corrupt_correlation_pct: float
    reorder_pct: float
    reorder_correlation_pct: float
    reorder_gap: int
    rate_packet_overhead_bytes: int
    rate_cell_bytes: int
    rate_cell_overhead_bytes: int
    slot: Any


# ---- rendering: LinkParams -> netem arguments (the tc backend's exact argv) ----


def _pct(value: float) -> str:
    return f"{value:.6g}%"


def _us(ms: float) -> str:
    return f"{round(ms * 1000)}us"


def _delay_args(p: NetemParams) -> list[str]:
    if not p.delay_ms and not p.jitter_ms:
        return []
    args = ["delay", _us(p.delay_ms)]
    if p.jitter_ms:
        args.append(_us(p.jitter_ms))
        if p.delay_correlation_pct:
            args.append(_pct(p.delay_correlation_pct))
        if p.delay_distribution != "uniform":
            args += ["distribution", p.delay_distribution]
    return args


def _loss_args(p: NetemParams) -> list[str]:
    if p.loss_state:
        st = p.loss_state
        return ["loss", "state", *map(_pct, (st.p13_pct, st.p31, st.p32_pct, st.p23_pct, st.p14_pct))]
    if p.loss_ge:
        ge = p.loss_ge
        return ["loss", "gemodel", _pct(ge.p_pct), _pct(ge.r_pct), _pct(ge.bad_loss_pct), _pct(ge.good_loss_pct)]
    if not p.loss_pct:
        return []
    args = ["loss", "random", _pct(p.loss_pct)]
    if p.loss_correlation_pct:
        args.append(_pct(p.loss_correlation_pct))
    return args


def _with_corr(option: str, pct: float, corr: float) -> list[str]:
    return [option, _pct(pct), *([_pct(corr)] if corr else [])] if pct else []


def _rate_args(p: NetemParams) -> list[str]:
    if not p.rate_mbit:
        return []
    extra = [p.rate_packet_overhead_bytes, p.rate_cell_bytes, p.rate_cell_overhead_bytes]
    while extra and not extra[-1]:
        extra.pop()
    return ["rate", f"{round(p.rate_mbit * 1e6)}bit", *map(str, extra)]


def _slot_args(p: NetemParams) -> list[str]:
    s = p.slot
    if s is None:
        return []
    if s.distribution:
        args = ["slot", "distribution", s.distribution, _us(s.delay_ms), _us(s.jitter_ms)]
    else:
        args = ["slot", _us(s.delay_ms), *([_us(s.max_delay_ms)] if s.max_delay_ms is not None else [])]
    return [*args, *(["packets", str(s.packets)] if s.packets else []), *(["bytes", str(s.bytes)] if s.bytes else [])]


def _other_args(p: NetemParams) -> list[str]:
    args = _with_corr("duplicate", p.duplicate_pct, p.duplicate_correlation_pct)
    args += _with_corr("corrupt", p.corrupt_pct, p.corrupt_correlation_pct)
    if p.reorder_pct:
        args += _with_corr("reorder", p.reorder_pct, p.reorder_correlation_pct)
        if p.reorder_gap:
            args += ["gap", str(p.reorder_gap)]
    return args + _rate_args(p) + _slot_args(p)


def render_netem(p: NetemParams, limit_pkts: int | None = None) -> list[str]:
    """netem's arguments for one direction; `limit` is limit_pkts if given, else p.limit_pkts (0: none)."""
    limit = p.limit_pkts if limit_pkts is None else limit_pkts
    return [*(["limit", str(limit)] if limit else []), *_delay_args(p), *_loss_args(p), *_other_args(p)]


# ---- parsing: a netem line -> LinkParams fields ----


class _Tokens:
    """The line's tokens with a cursor; every error names the token and its 1-based position."""

    def __init__(self, line: str) -> None:
        self.items = line.split()
        self.i = 0

    def fail(self, expected: str, at: int | None = None) -> NetemSyntaxError:
        at = self.i if at is None else at
        if at >= len(self.items):
            return NetemSyntaxError(f"end of line after {self.items[-1]!r}: expected {expected}")
        return NetemSyntaxError(f"token {at + 1} {self.items[at]!r}: expected {expected}")

    def unsupported(self, what: str, at: int) -> NetemSyntaxError:
        return NetemSyntaxError(f"token {at + 1} {self.items[at]!r}: not supported yet: {what}")

    def take(self, expected: str) -> str:
        """The next token (moving past it); an error naming `expected` at the end of the line."""
        if self.i >= len(self.items):
            raise self.fail(expected)
        self.i += 1
        return self.items[self.i - 1]

    def next_is_number(self) -> bool:
        """tc's NEXT_IS_NUMBER: the next token exists and starts like a number."""
        return self.i < len(self.items) and bool(_STARTS_LIKE_NUMBER.match(self.items[self.i]))

    def value(self, convert: Any, expected: str) -> Any:
        """The next token converted; a refusal naming it and `expected` when convert returns None."""
        token = self.take(expected)
        out = convert(token)
        if out is None:
            raise self.fail(expected, self.i - 1)
        return out


def _split_number(token: str) -> tuple[Decimal, str] | None:
    """(the leading number, the rest); None without one, or beyond a float's range or 1e100 (no netem value is)."""
    m = _NUMBER.match(token)
    number = Decimal(m.group()) if m else None
    return (number, token[m.end() :]) if m and number is not None and -400 <= number.adjusted() <= 100 else None


def _percent(token: str) -> float | None:
    """get_percent: a number in [0, 100], bare or with `%`, kept to the renderer's 6 significant digits."""
    parts = _split_number(token)
    if not parts or parts[1] not in ("", "%") or parts[0] > 100:
        return None
    value = float(parts[0])
    return value if float(_pct(value)[:-1]) == value else None


def _time_ms(token: str) -> float | None:
    """get_time: a number with a unit, in whole microseconds, at most MAX_TIME_MS; returned in ms."""
    parts = _split_number(token)
    if not parts or parts[1].lower() not in _TIME_US:
        return None
    us = parts[0] * _TIME_US[parts[1].lower()]
    if us != us.to_integral_value() or us > MAX_TIME_MS * 1000:
        return None
    return int(us) / 1000


def _rate_mbit(token: str) -> float | None:
    """get_rate: a number with a unit, in whole bit/s, at most MAX_RATE_MBIT; returned in Mbit/s."""
    parts = _split_number(token)
    if not parts or parts[1].lower() not in _RATE_BIT:
        return None
    bits = parts[0] * _RATE_BIT[parts[1].lower()]
    if bits != bits.to_integral_value() or bits > MAX_RATE_MBIT * 10**6:
        return None
    return int(bits) / 1e6


def _count(lo: int, hi: int) -> Any:
    return lambda token: int(token) if re.fullmatch(r"\d+", token, re.ASCII) and lo <= int(token) <= hi else None


PCT = "a percentage in [0, 100] with at most 6 significant digits (e.g. 1% or 0.25)"
TIME = f"a time in whole microseconds up to {MAX_TIME_MS // 1000}s with its unit (us, ms, s; e.g. 40ms)"
RATE = f"a rate in whole bit/s up to {MAX_RATE_MBIT // 1000}gbit with its unit (bit, kbit, mbit, gbit, bps, ...)"


def _correlation(t: _Tokens, option: str) -> float:
    """An optional correlation after `option`'s percentage: 0 when absent."""
    return t.value(_percent, f"{option}'s correlation: {PCT}") if t.next_is_number() else 0.0


def _limit(t: _Tokens, out: dict) -> None:
    out["limit_pkts"] = t.value(_count(1, MAX_LIMIT_PKTS), f"a queue limit in packets, 1 to {MAX_LIMIT_PKTS}")


def _delay(t: _Tokens, out: dict) -> None:
    out["delay_ms"] = t.value(_time_ms, TIME)
    if t.next_is_number():
        out["jitter_ms"] = t.value(_time_ms, f"a jitter: {TIME}")
        if t.next_is_number():
            out["delay_correlation_pct"] = t.value(_percent, f"the delay's correlation: {PCT}")
            if out["delay_correlation_pct"] and not out["jitter_ms"]:
                raise t.fail("no correlation with a zero jitter (it would change nothing)", t.i - 1)


def _loss(t: _Tokens, out: dict) -> None:
    start = t.i
    if start >= len(t.items):
        raise t.fail(f"a loss model (random, state, gemodel) or {PCT}")
    model = "random" if t.next_is_number() else t.items[start]
    if model in ("random", "gemodel") and not t.next_is_number():
        t.i += 1
    if model == "gemodel":
        ge = {"p_pct": t.value(_percent, f"gemodel's p: {PCT}")}
        for name, what in (("r_pct", "r"), ("bad_loss_pct", "1-h"), ("good_loss_pct", "1-k")):
            if not t.next_is_number():
                break
            ge[name] = t.value(_percent, f"gemodel's {what}: {PCT}")
        out["loss_ge"] = ge
    elif model == "random":
        out["loss_pct"] = t.value(_percent, f"the loss: {PCT}")
        if t.next_is_number():
            out["loss_correlation_pct"] = t.value(_percent, f"the loss's correlation: {PCT}")
            if out["loss_correlation_pct"] and not out["loss_pct"]:
                raise t.fail("no correlation with a zero loss (it would change nothing)", t.i - 1)
    elif model == "state":
        t.i += 1
        p13 = t.value(_percent, f"4-state loss's p13: {PCT}")
        # iproute2's defaults for what is left out: p31 = 100% - p13 (to the line's 6 digits), p32 = 0, p23 = 100%,
        # p14 = 0.
        p31 = float(_pct(100.0 - p13)[:-1])
        state = {"p13_pct": p13, "p31_pct": p31, "p32_pct": 0.0, "p23_pct": 100.0, "p14_pct": 0.0}
        for name in ("p31", "p32", "p23", "p14"):
            if not t.next_is_number():
                break
            state[f"{name}_pct"] = t.value(_percent, f"4-state loss's {name}: {PCT}")
        out["loss_state"] = state
    else:
        raise t.fail(f"a loss model (random, state, gemodel) or {PCT}", start)


def _with_correlation(field: str, option: str) -> Any:
    def parse(t: _Tokens, out: dict) -> None:
        out[field] = t.value(_percent, f"{option}: {PCT}")
        corr = _correlation(t, option)
        if corr and not out[field]:
            raise t.fail(f"no correlation with a zero {option} (it would change nothing)", t.i - 1)
        if corr:
            out[field.replace("_pct", "_correlation_pct")] = corr

    return parse


def _gap(t: _Tokens, out: dict) -> None:
    out["reorder_gap"] = t.value(_count(0, MAX_GAP), f"a reorder gap in packets, 0 to {MAX_GAP}")


DIST = f"a distribution: {', '.join(DISTRIBUTIONS)} or a .dist file's path (iproute2's format)"


def _table_name(t: _Tokens) -> str:
    """A shipped table's name, or a file's path (read when LinkParams is built: a profile's are relative to it)."""
    name = t.take(DIST)
    if name not in DISTRIBUTIONS and not is_table_file(name):
        raise t.fail(DIST, t.i - 1)
    return name


def _distribution(t: _Tokens, out: dict) -> None:
    out["delay_distribution"] = _table_name(t)


def _rate(t: _Tokens, out: dict) -> None:
    if t.i < len(t.items) and t.items[t.i].endswith("%"):
        raise t.unsupported("a rate as a share of the device's speed", t.i)
    out["rate_mbit"] = t.value(_rate_mbit, RATE)
    extras = (("rate_packet_overhead_bytes", "packet overhead", -(2**31)), ("rate_cell_bytes", "cell size", 0),
              ("rate_cell_overhead_bytes", "cell overhead", -(2**31)))  # fmt: skip
    for field, what, lo in extras:
        if not t.next_is_number():
            break
        hi = 2**32 - 1 if lo == 0 else 2**31 - 1
        out[field] = t.value(_signed_int(lo, hi), f"the rate's {what} in bytes (an integer, {lo} to {hi})")
    if out.get("rate_cell_overhead_bytes") and not out.get("rate_cell_bytes"):
        raise t.fail("a cell size > 0 before a cell overhead (it is added to each cell)", t.i - 1)
    if (out.get("rate_packet_overhead_bytes") or out.get("rate_cell_bytes")) and not out["rate_mbit"]:
        raise t.fail("a rate > 0 with an overhead or a cell size (rate 0 is no rate at all)", t.i - 1)


def _signed_int(lo: int, hi: int) -> Any:
    return lambda token: int(token) if re.fullmatch(r"[+-]?\d+", token, re.ASCII) and lo <= int(token) <= hi else None


_SIZE = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def _size_bytes(token: str) -> int | None:
    """get_size's plain sizes: a whole number of bytes, optionally with b, k/kb, m/mb, g/gb (1024-based)."""
    m = re.fullmatch(r"(\d+)([a-zA-Z]*)", token, re.ASCII)
    if not m or m.group(2).lower() not in _SIZE:
        return None
    value = int(m.group(1)) * _SIZE[m.group(2).lower()]
    return value if value <= 2**31 - 1 else None


def _slot(t: _Tokens, out: dict) -> None:
    slot: dict[str, Any] = {}
    if t.next_is_number():
        slot["delay_ms"] = t.value(_time_ms, f"slot's MIN_DELAY: {TIME}")
        if t.next_is_number():
            slot["max_delay_ms"] = t.value(_time_ms, f"slot's MAX_DELAY: {TIME}")
            if slot["max_delay_ms"] < slot["delay_ms"]:
                raise t.fail("a MAX_DELAY no smaller than slot's MIN_DELAY", t.i - 1)
    elif t.take("slot's MIN_DELAY or `distribution`") != "distribution":
        raise t.fail("slot's MIN_DELAY (a time) or `distribution NAME DELAY JITTER`", t.i - 1)
    else:
        slot["distribution"] = _table_name(t)
        if slot["distribution"] == "uniform":
            raise t.fail("a table (uniform slots are `slot MIN_DELAY MAX_DELAY`)", t.i - 1)
        slot["delay_ms"] = t.value(_time_ms, f"slot's DELAY: {TIME}")
        slot["jitter_ms"] = t.value(_time_ms, f"slot's JITTER: {TIME}")
        if not slot["jitter_ms"]:
            raise t.fail("a positive slot JITTER (tc: Non-positive jitter)", t.i - 1)
    for word, convert, what in (("packets", _count(0, 2**31 - 1), "a packet count, 0 to 2147483647"),
                                ("bytes", _size_bytes, "a size in bytes (e.g. 3000, 64kb)")):  # fmt: skip
        if t.i < len(t.items) and t.items[t.i] and word.startswith(t.items[t.i]):
            t.i += 1
            slot[word] = t.value(convert, f"slot's {word}: {what}")
    out["slot"] = slot


def _refuse(what: str) -> Any:
    def parse(t: _Tokens, out: dict) -> None:
        raise t.unsupported(what, t.i - 1)

    return parse


_OPTIONS = {
    "limit": _limit,
    "delay": _delay,
    "loss": _loss,
    "ecn": _refuse("ecn (marking instead of dropping)"),
    "reorder": _with_correlation("reorder_pct", "reorder"),
    "corrupt": _with_correlation("corrupt_pct", "corrupt"),
    "gap": _gap,
    "duplicate": _with_correlation("duplicate_pct", "duplicate"),
    "distribution": _distribution,
    "rate": _rate,
    "slot": _slot,
}


def _keyword(token: str) -> str | None:
    """The option a token names, as iproute2 reads it: the first keyword it is a prefix of."""
    word = next((k for k in _KEYWORDS if token and k.startswith(token)), None)
    return _ALIASES.get(word, word) if word else None


def _check_combinations(t: _Tokens, out: dict, seen: dict[str, int]) -> None:
    """tc's own refusals of a whole line, pointing at the option that cannot stand."""
    if out.get("reorder_pct") and not out.get("delay_ms"):
        raise t.fail("a delay: reordering is not possible without some delay (add delay TIME)", seen["reorder"])
    if out.get("reorder_gap") and not out.get("reorder_pct"):
        raise t.fail("a reorder PERCENT > 0 with it: gap only spaces reordered packets", seen["gap"])
    if "delay_distribution" in out and (not out.get("delay_ms") or not out.get("jitter_ms")):
        raise t.fail("a delay and a jitter, both > 0, with a distribution", seen["distribution"])


def parse_netem(line: str) -> dict[str, Any]:
    """The LinkParams fields a netem line sets (loss_ge as a dict); NetemSyntaxError naming the offending token.

    The line is what follows `netem` in a tc command; a leading `netem`, or a whole `tc qdisc ... netem`
    command, is accepted too (its device and parent are this testbed's to choose).
    """
    t = _Tokens(line)
    if "netem" in t.items[:1] or t.items[:1] == ["tc"]:
        if "netem" not in t.items:
            raise NetemSyntaxError("a tc command without 'netem': expected the netem arguments (delay 40ms ...)")
        t.i = t.items.index("netem") + 1
    out: dict[str, Any] = {}
    seen: dict[str, int] = {}
    while t.i < len(t.items):
        at, option = t.i, _keyword(t.items[t.i])
        if option is None:
            raise t.fail(f"an option: {', '.join(_KEYWORDS)}")
        if option in seen:
            raise t.fail(f"each option once ({option} was already given as token {seen[option] + 1})")
        seen[option] = at
        t.i += 1
        _OPTIONS[option](t, out)
    _check_combinations(t, out, seen)
    return out
