"""Cross traffic on the WAN: competing iperf3 flows between the cross hosts, described, built and read back.

Responsible for: the spec's `cross_traffic:` entries (`CrossFlow`) and their
validation against the link and the variant window; expanding a flow into
its directed runs (`FlowRun`: sender, receiver, port, output file); the pure
builders of the iperf3 command lines; a run's entry in metadata.json (built
here, its layout experiments.metadata.CrossTrafficEntry); reading iperf3's JSON back (per-interval throughput, mean
throughput, retransmits or loss); Jain's fairness index; and `summarize`,
which turns a run directory's cross flows into numbers.
Not responsible for: starting or stopping anything (experiments.window plays
the flows in each variant's window through `Testbed.popen`), or the hosts
(topology.naming: `xa` in cluster A, `xb` in cluster B).

Times are on each variant's clock: `start_s` is seconds after the variant's
window opened (the load generator's t0), as for the spec's `schedule:`.
A flow `a_to_b` runs xa -> xb (iperf3 client in xa, server in xb); `both` is
one run each way, with its own port and file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from schema import Float, Int, Str, schema
from experiments.metadata import CrossTrafficEntry, RunMetadata
from topology import iperf, naming

KINDS = ("tcp", "udp")
FLOW_DIRECTIONS = ("a_to_b", "b_to_a", "both")
# Ports of the iperf3 servers: run k of flow i listens on PORT_BASE + 2 i + k (k = 0 a_to_b, 1 b_to_a);
# above the calibration's 5201 and below every role's port (deploy.PORTS).
PORT_BASE = 5301
MAX_STREAMS = 128
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
_CC_FILES = ("tcp_available_congestion_control", "tcp_allowed_congestion_control")


class CrossTrafficError(ValueError):
    """A cross_traffic entry is invalid; the message names the field and the allowed values."""


@schema
class CrossFlow:
    """One competing flow on the WAN (a spec's `cross_traffic:` entry).

    kind: tcp | udp
    duration_s: how long it sends (s; whole seconds: iperf3's -t)
    direction: a_to_b | b_to_a | both (one run each way)
    start_s: when it starts, seconds after the variant's window opened
    name: names its files (`<name>-<direction>.json`); default `<kind><index>`
    streams: parallel connections (iperf3 -P)
    congestion: TCP congestion control (iperf3 -C), one the kernel offers; "" = the kernel's default
    rate_mbit: udp: the flow's total sending rate, required; tcp: an optional cap (0 = none) (Mbit/s)
    """

    kind: Literal["tcp", "udp"]
    duration_s: Float
    direction: Literal["a_to_b", "b_to_a", "both"] = "a_to_b"
    start_s: Float = 0.0
    name: Str = ""
    streams: Int = 1
    congestion: Str = ""
    rate_mbit: Float = 0.0

    def directions(self) -> tuple[str, ...]:
        """The WAN directions it runs in."""
        return ("a_to_b", "b_to_a") if self.direction == "both" else (self.direction,)

    @property
    def end_s(self) -> float:
        """When it stops sending, on the variant's clock (s)."""
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class FlowRun:
    """One direction of a flow: an iperf3 server in `receiver`, its client in `sender`."""

    flow: CrossFlow
    name: str
    direction: str
    port: int
    sender: naming.HostSpec
    receiver: naming.HostSpec

    @property
    def file_name(self) -> str:
        """The iperf3 JSON's name inside the variant's cross/ folder."""
        return f"{self.name}-{self.direction}.json"


def kernel_congestion_algorithms(proc_dir: Path = Path("/proc/sys/net/ipv4")) -> tuple[str, ...]:
    """TCP congestion controls this kernel offers (available, plus allowed: root may pick any available)."""
    names: list[str] = []
    for f in _CC_FILES:
        try:
            names += [n for n in (proc_dir / f).read_text().split() if n not in names]
        except OSError:
            continue
    return tuple(names)


def flow_name(flow: CrossFlow, index: int) -> str:
    """The flow's name, or its default `<kind><index>`."""
    return flow.name or f"{flow.kind}{index}"


def _fail(where: str, message: str) -> None:
    raise CrossTrafficError(f"{where}{message}")


def _check_flow(
    flow: CrossFlow, where: str, rates: dict[str, float], window_s: float, congestions: tuple[str, ...]
) -> None:
    if not 1 <= flow.streams <= MAX_STREAMS:
        _fail(where, f".streams={flow.streams} out of range [1, {MAX_STREAMS}]")
    if flow.duration_s < 1 or not float(flow.duration_s).is_integer():
        _fail(where, f".duration_s={flow.duration_s}: allowed: a whole number of seconds >= 1 (iperf3 -t)")
    if flow.start_s < 0:
        _fail(where, f".start_s={flow.start_s:g} out of range [0, {window_s}]")
    if flow.end_s > window_s:
        _fail(
            where,
            f": start_s + duration_s = {flow.end_s:g} s lies beyond timeouts.variant_s={window_s:g}; "
            f"allowed: start_s + duration_s <= {window_s:g} (or raise timeouts.variant_s)",
        )
    if flow.kind == "tcp" and flow.congestion and flow.congestion not in congestions:
        _fail(where, f".congestion={flow.congestion!r} is not offered by this kernel; allowed: {list(congestions)}")
    if flow.kind == "udp" and flow.congestion:
        _fail(where, f".congestion={flow.congestion!r}: only for tcp flows; allowed for udp: '' (unset)")
    if flow.kind == "udp" and flow.rate_mbit <= 0:
        _fail(where, ".rate_mbit: required for udp flows; allowed: > 0 up to the link's rate")
    if flow.rate_mbit < 0:
        _fail(where, f".rate_mbit={flow.rate_mbit}: allowed: >= 0 (0 = no cap, tcp only)")
    for d in flow.directions():
        if rates.get(d) and flow.rate_mbit > rates[d]:
            _fail(
                where, f".rate_mbit={flow.rate_mbit:g} exceeds the link's {d} rate; allowed: (0, {rates[d]:g}] Mbit/s"
            )


def validate_flows(
    flows: tuple[CrossFlow, ...],
    rates: dict[str, float],
    window_s: float,
    congestions: tuple[str, ...],
    where: str = "cross_traffic",
) -> None:
    """Refuse flows that cannot run as written; rates: the profile's rate_mbit per direction (0 = unlimited),
    window_s: timeouts.variant_s, congestions: kernel_congestion_algorithms()."""
    seen: set[str] = set()
    for i, flow in enumerate(flows):
        at = f"{where}[{i}]"
        name = flow_name(flow, i)
        if not _NAME.match(name):
            _fail(at, f".name={name!r}: allowed: 1-40 letters, digits, '_', '.', '-'")
        if name in seen:
            _fail(at, f".name={name!r} is used twice; allowed: a name unique among the flows")
        seen.add(name)
        _check_flow(flow, at, rates, window_s, congestions)


def expand(flows: tuple[CrossFlow, ...]) -> list[FlowRun]:
    """Every directed run of every flow, each with its own port."""
    runs = []
    for i, flow in enumerate(flows):
        for d in flow.directions():
            sender, receiver = naming.cross_endpoints(d)
            port = PORT_BASE + 2 * i + (0 if d == "a_to_b" else 1)
            runs.append(FlowRun(flow, flow_name(flow, i), d, port, sender, receiver))
    return runs


def last_event_s(flows: tuple[CrossFlow, ...]) -> float:
    """When the last flow stops sending, on the variant's clock (s); 0 without flows."""
    return max((f.end_s for f in flows), default=0.0)


# ---- command builders (pure) ---------------------------------------------
def server_cmd(run: FlowRun) -> list[str]:
    """argv of the one-off iperf3 server for a run (in its receiver host)."""
    return iperf.server_argv(run.port, bind=run.receiver.ip, report=False)


def client_cmd(run: FlowRun, logfile: str | Path) -> list[str]:
    """argv of the iperf3 client for a run (in its sender host), JSON to logfile."""
    f = run.flow
    extra = []
    if f.rate_mbit:  # iperf3's -b applies to each stream: the flow's total is split among them
        extra += ["-b", f"{f.rate_mbit / f.streams:.6g}M"]
    if f.kind == "udp":
        extra += ["-u", "-l", str(iperf.UDP_PAYLOAD_BYTES)]
    elif f.congestion:
        extra += ["-C", f.congestion]
    return iperf.client_argv(
        run.receiver.ip,
        int(f.duration_s),  # iperf3 takes whole seconds
        run.port,
        extra=extra,
        bind=run.sender.ip,
        streams=f.streams,
        logfile=logfile,
        server_report=False,
    )


def metadata_entry(
    run: FlowRun, start_ns: int, end_ns: int | None, iperf_json: str, congestion: str | None
) -> CrossTrafficEntry:
    """The run's record in metadata.json's `variants.<v>.cross_traffic` (iperf_json relative to the run dir)."""
    f = run.flow
    return CrossTrafficEntry(
        name=run.name,
        kind=f.kind,
        direction=run.direction,
        start_ns=start_ns,
        end_ns=end_ns,
        port=run.port,
        iperf_json=iperf_json,
        streams=f.streams,
        congestion=congestion if f.kind == "tcp" else None,
        rate_mbit=f.rate_mbit or None,
    )


# ---- reading iperf3's JSON -------------------------------------------------
@dataclass(frozen=True)
class FlowResult:
    """What one iperf3 run measured.

    mean_mbit: mean throughput (Mbit/s): the receiver's where iperf3 reported it, else the sender's intervals
    retransmits: TCP retransmitted segments (None for udp); lost_pct: UDP datagrams lost (%, None for tcp)
    intervals: (start_s, end_s, mbit) per reporting interval, sender side; error: iperf3's error, if any
    stream_mbit: each stream's mean throughput (Mbit/s), receiver side where reported
    """

    mean_mbit: float
    retransmits: int | None
    lost_pct: float | None
    intervals: tuple[tuple[float, float, float], ...]
    error: str | None
    stream_mbit: tuple[float, ...] = ()


def intervals(doc: dict) -> tuple[tuple[float, float, float], ...]:
    """(start_s, end_s, Mbit/s) of every reporting interval (iperf3's `intervals[].sum`)."""
    out = []
    for iv in doc.get("intervals", []):
        s = iv.get("sum", {})
        if "start" in s and "end" in s:
            out.append((float(s["start"]), float(s["end"]), s.get("bits_per_second", 0.0) / 1e6))
    return tuple(out)


def _interval_mean_mbit(ivs: tuple[tuple[float, float, float], ...]) -> float:
    span = sum(e - s for s, e, _ in ivs)
    return sum((e - s) * m for s, e, m in ivs) / span if span > 0 else 0.0


def parse_result(doc: dict, kind: str) -> FlowResult:
    """One iperf3 client JSON (possibly cut short: then only its intervals count) as a FlowResult."""
    ivs, end = intervals(doc), doc.get("end", {})
    received = end.get("sum_received") or {}
    mean = received.get("bits_per_second", 0.0) / 1e6 if received.get("bytes") else _interval_mean_mbit(ivs)
    streams = tuple(_stream_mbit(s) for s in end.get("streams", []))
    if kind == "tcp":
        retrans = (end.get("sum_sent") or {}).get("retransmits")
        return FlowResult(mean, retrans, None, ivs, doc.get("error"), streams)
    lost = received.get("lost_percent", (end.get("sum") or {}).get("lost_percent"))
    return FlowResult(mean, None, lost, ivs, doc.get("error"), streams)


def _stream_mbit(stream: dict) -> float:
    side = (
        stream.get("udp")
        or (stream.get("receiver") if (stream.get("receiver") or {}).get("bytes") else stream.get("sender"))
        or {}
    )
    return side.get("bits_per_second", 0.0) / 1e6


def jain_index(shares: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1.0 for equal shares, 1/n when one flow has it all;
    nan for no flows or all zero (nothing to share)."""
    if any(x < 0 for x in shares):
        raise ValueError(f"shares must be >= 0, got {shares}")
    total, squares = sum(shares), sum(x * x for x in shares)
    return total * total / (len(shares) * squares) if squares > 0 else math.nan


def summarize(run_dir: Path, meta: RunMetadata) -> dict:
    """Per variant and flow run: mean Mbit/s, retransmits (tcp) or lost % (udp), Jain's index of its streams,
    error; per direction with two or more runs, Jain's index of their mean throughputs. {} when the run had
    no cross traffic."""
    out: dict = {}
    for variant, window in meta.variants.items():
        if not window.cross_traffic:
            continue
        flows, by_direction = {}, {}
        for e in window.cross_traffic:
            r = _read_result(Path(run_dir) / e.iperf_json, e.kind)
            flows[f"{e.name}-{e.direction}"] = {
                "kind": e.kind,
                "direction": e.direction,
                "mean_mbit": r.mean_mbit if r else None,
                "retransmits": r.retransmits if r else None,
                "lost_pct": r.lost_pct if r else None,
                "streams_jain_index": _finite(jain_index(list(r.stream_mbit))) if r and r.stream_mbit else None,
                "error": (r.error if r else f"no iperf3 output at {e.iperf_json}"),
            }
            if r:
                by_direction.setdefault(e.direction, []).append(r.mean_mbit)
        out[variant] = {
            "flows": flows,
            "jain_index": {d: _finite(jain_index(x)) for d, x in by_direction.items() if len(x) >= 2},
        }
    return out


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x  # summary.json stays strict JSON


def _read_result(path: Path, kind: str) -> FlowResult | None:
    try:
        return parse_result(json.loads(path.read_text()), kind)
    except (OSError, json.JSONDecodeError):
        return None
