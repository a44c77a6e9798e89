"""iperf3 command lines for the testbed's throughput tests, and the receiver's goodput from a report.

Responsible for: the server and client argv every TCP/UDP throughput test
here uses (calibration, the namespace triple, benchmarks), and reading what
the *receiver* counted after a warm-up. Not responsible for: where the
processes run (namespaces, hosts) or waiting for the server to listen.

Why the receiver's own seconds, and their median: TCP hands bytes to the
application in order, so after a loss (slow start overflowing the queue) the
receiver holds everything behind the hole and delivers it in one burst when
the retransmission lands. A window that starts during that recovery counts
bytes that crossed the wire before it began. Measured on wan-congested's
20 Mbit/s line (payload ceiling 19.13): the server read 11.2, 26.96, then
19.13 Mbit/s every second; iperf3's `--omit 2` total (and the same window
summed) said 20.39, over what the wire can carry, failing the fidelity check
now and then (esnet/iperf#236 reports the same over-optimistic `-O` totals).
The median second is the steady rate and a single burst cannot move it; the
mean over the window is kept for capacity, where only a lower bound matters.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Sequence

DEFAULT_PORT = 5201
# Interval boundaries fall a few microseconds after each whole second of the server's clock.
BOUNDARY_SLACK_S = 0.05
# The last interval is the remainder of the test: shorter ones are left out of the median.
MIN_INTERVAL_S = 0.9


class IperfReportError(ValueError):
    """The report lacks what a goodput needs (no server output, or nothing after the warm-up)."""


UDP_PAYLOAD_BYTES = 1400  # one datagram per 1500-byte frame: no IP fragments on the WAN


def server_argv(port: int = DEFAULT_PORT, bind: str | None = None, report: bool = True) -> list[str]:
    """A one-off server (`-1`); report: in JSON, for a client that asks for it (`--get-server-output`)."""
    argv = ["iperf3", "-s", "-1", *(["-J"] if report else []), "-p", str(port)]
    return argv + (["-B", bind] if bind else [])


def client_argv(
    addr: str,
    seconds: float,
    port: int = DEFAULT_PORT,
    warmup_s: float = 0.0,
    udp_mbit: float | None = None,
    extra: Sequence[str] = (),
    bind: str | None = None,
    streams: int = 1,
    logfile: str | Path | None = None,
    server_report: bool = True,
) -> list[str]:
    """A client that sends for warmup_s + seconds, its JSON report on stdout (or to logfile), from bind
    if given, on `streams` parallel connections; server_report: with the server's report in it."""
    total = round(warmup_s + seconds, 3)
    argv = ["iperf3", "-c", addr, *(["-B", bind] if bind else []), "-p", str(port), "-t", f"{total:g}"]
    argv += ["-P", str(streams)] if streams > 1 else []
    argv += ["-J", *(["--logfile", str(logfile)] if logfile else [])]
    argv += ["--get-server-output"] if server_report else []
    if udp_mbit:
        argv += ["-u", "-b", f"{udp_mbit:g}M", "-l", str(UDP_PAYLOAD_BYTES)]
    return argv + list(extra)


def receiver_seconds(report: dict[str, Any], warmup_s: float = 0.0) -> list[tuple[float, int]]:
    """(seconds, bytes) of each interval the server reported from warmup_s on."""
    server = report.get("server_output_json")
    if not isinstance(server, dict):
        raise IperfReportError("no server_output_json: run the client with --get-server-output, the server with -J")
    kept = [i["sum"] for i in server.get("intervals", []) if i["sum"]["start"] >= warmup_s - BOUNDARY_SLACK_S]
    if not kept or sum(s["seconds"] for s in kept) <= 0:
        raise IperfReportError(f"the server reported no interval after the {warmup_s:g} s warm-up")
    return [(s["seconds"], s["bytes"]) for s in kept]


def receiver_mbit(report: dict[str, Any], warmup_s: float = 0.0) -> float:
    """Mean goodput (Mbit/s) the server read from warmup_s on: its bytes over its seconds."""
    kept = receiver_seconds(report, warmup_s)
    return sum(b for _, b in kept) * 8 / sum(s for s, _ in kept) / 1e6


def steady_mbit(report: dict[str, Any], warmup_s: float = 0.0) -> float:
    """Steady goodput (Mbit/s): the median of the server's whole seconds from warmup_s on."""
    kept = receiver_seconds(report, warmup_s)
    whole = [b * 8 / s / 1e6 for s, b in kept if s >= MIN_INTERVAL_S] or [b * 8 / s / 1e6 for s, b in kept]
    return statistics.median(whole)
