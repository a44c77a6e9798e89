"""Cross traffic on the WAN: competing iperf3 flows between the cross hosts, described, built and read back.

Responsible for: the spec's `cross_traffic:` entries (`CrossFlow`) and their
validation against the link and the variant window; expanding a flow into
its directed runs (`FlowRun`: sender, receiver, port, output file); the pure
builders of the iperf3 command lines; a run's entry in metadata.json (built
here, its layout experiments.rundir.metadata.CrossTrafficEntry).
Not responsible for: reading iperf3's results back (experiments.analysis.crosstraffic), starting or stopping
anything (experiments.run.window plays
the flows in each variant's window through `Testbed.popen`), or the hosts
(topology.naming: `xa` in cluster A, `xb` in cluster B).

Times are on each variant's clock: `start_s` is seconds after the variant's
window opened (the load generator's t0), as for the spec's `schedule:`.
A flow `a_to_b` runs xa -> xb (iperf3 client in xa, server in xb); `both` is
one run each way, with its own port and file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from schema import Float, Int, Str, schema
from experiments.rundir.metadata import CrossTrafficEntry
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
