"""Benchmark of the userspace link emulator (needs root).

Responsible for: measuring (1) the emulator's maximum forwarding rate at
20 ms delay with 1500-byte IP packets (1514-byte frames) and the CPU its
process uses, and (2) configured-vs-measured delay, jitter, loss, reordering
and TCP goodput for a few profiles, on a throwaway namespace triple
(`topology.wire_netns`). Prints what it measured, whether or not a target is met.
Not responsible for: the tc backend or the Mininet topology.

    sudo .venv/bin/python -m benchmarks.bench_shaper [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.analysis.linkstats import TCP_PAYLOAD_SHARE
from topology import iperf
from topology.netem_model import periodic_delays_ns
from topology.profiles import LinkParams
from topology.emulator import UserspaceEmulator
from topology.wire_netns import NetnsWire, WireNames, in_ns

log = logging.getLogger(__name__)

FRAME_BYTES = 1514  # 1472 UDP payload + 8 UDP + 20 IP + 14 Ethernet
UDP_PAYLOAD_BYTES = 1472
TARGET_GBIT = 1.0  # the target: 1 Gbit/s on one core
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONTROL_PATH = "/tmp/pddb-bench-ctl.sock"
SAMPLE_PERIOD_S = 0.25
PROBE_COUNT = 5000
PROBE_INTERVAL_US = 1000
PROBE_PAYLOAD_BYTES = 64
PROBE_FRAME_BYTES = PROBE_PAYLOAD_BYTES + 8 + 20 + 14  # + UDP + IP + Ethernet headers


@dataclass
class ForwardingResult:
    """Max forwarding rate run: frames through the emulator and its CPU."""

    seconds: float  # steady window the rate and CPU are measured over (s)
    frames_in: int
    frames_out: int
    dropped_limit: int
    rx_drops: int  # frames the kernel dropped before the emulator read them
    tx_errors: int
    out_gbit: float  # frames_out * FRAME_BYTES * 8 / seconds (Gbit/s)
    out_kpps: float
    cpu_pct: float  # (utime + stime) / wall, 100 = one core
    sender_gbit: float  # what iperf3's sender offered (UDP payload, Gbit/s)
    receiver_gbit: float  # what iperf3's receiver counted (UDP payload, Gbit/s)


@dataclass
class FidelityRow:
    """Configured vs measured for one profile (A -> B)."""

    profile: str
    delay_ms: float
    delay_model_ms: float  # what netem's semantics give this probe (rate + jitter queue up)
    delay_measured_ms: float
    jitter_sd_ms: float
    jitter_sd_model_ms: float
    jitter_sd_measured_ms: float
    loss_pct: float
    loss_measured_pct: float
    reordered: int
    rate_mbit: float
    goodput_mbit: float | None


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process (clock ticks), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)


class Sampler(threading.Thread):
    """Samples (time, frames sent a_to_b, CPU ticks) of a running emulator."""

    def __init__(self, emu: UserspaceEmulator, period_s: float = SAMPLE_PERIOD_S):
        super().__init__(daemon=True)
        self.emu, self.period_s = emu, period_s
        self.samples: list[tuple[float, int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            self.samples.append((time.monotonic(), self.emu.stats()["a_to_b"].sent, cpu_ticks(self.emu.pid)))

    def busy_window(self) -> tuple[float, int, int]:
        """(seconds, frames, ticks) between the first and last sample that saw traffic, one period trimmed each side."""
        s = self.samples
        moving = [i for i in range(1, len(s)) if s[i][1] > s[i - 1][1]]
        if len(moving) < 3:
            raise RuntimeError("too little traffic reached the emulator to measure a rate")
        first, last = s[moving[1] - 1], s[moving[-2]]
        return last[0] - first[0], last[1] - first[1], last[2] - first[2]


def forwarding_rate(wire: NetnsWire, seconds: float) -> ForwardingResult:
    """Blast 1472-byte UDP from A to B through a 20 ms, unlimited-rate emulator."""
    n = wire.names
    # 20 ms at ~100 kpps keeps ~2000 frames queued: the limit must exceed that.
    params = LinkParams(delay_ms=20, limit_pkts=1_000_000)
    with UserspaceEmulator(n.wire_a, n.wire_b, params, params, CONTROL_PATH, seed=1, prefix=in_ns(n.ns_w, [])) as emu:
        before = emu.stats()["a_to_b"]
        sampler = Sampler(emu)
        sampler.start()
        report = wire.iperf3(seconds, extra=["-u", "-b", "0", "-l", str(UDP_PAYLOAD_BYTES)])
        time.sleep(0.1)  # let the last 20 ms of frames leave the queue
        sampler.done.set()
        sampler.join()
        after = emu.stats()["a_to_b"]
    wall, out, ticks = sampler.busy_window()
    return ForwardingResult(
        seconds=wall,
        frames_in=after.received - before.received,
        frames_out=after.sent - before.sent,
        dropped_limit=after.dropped_limit - before.dropped_limit,
        tx_errors=after.tx_errors - before.tx_errors,
        rx_drops=after.rx_drops - before.rx_drops,
        out_gbit=out * FRAME_BYTES * 8 / wall / 1e9,
        out_kpps=out / wall / 1e3,
        cpu_pct=100 * ticks / CLK_TCK / wall,
        sender_gbit=report["end"]["sum"]["bits_per_second"] / 1e9,
        receiver_gbit=iperf.receiver_mbit(report) / 1e3,
    )


PROFILES = {
    "wan-30ms-5ms-loss0.1": LinkParams(delay_ms=30, jitter_ms=5, loss_pct=0.1),
    "rated-200mbit-30ms": LinkParams(rate_mbit=200, delay_ms=30, jitter_ms=5),
    # Same with a queue of 3,000 frames (about the delay line plus 1.5 x BDP; the derived limit is now 2 x BDP).
    "rated-200mbit-30ms-limit3000": LinkParams(rate_mbit=200, delay_ms=30, jitter_ms=5, limit_pkts=3000),
    "regional-100mbit-10ms-normal": LinkParams(rate_mbit=100, delay_ms=10, jitter_ms=2, delay_distribution="normal"),
}


def fidelity(wire: NetnsWire, name: str, params: LinkParams, seconds: float) -> FidelityRow:
    """Probe one profile: 5000 UDP probes for delay/jitter/loss, iperf3 TCP for goodput."""
    n = wire.names
    reverse = params.replace(loss_pct=0)  # ACK path: same delay, no loss
    with UserspaceEmulator(n.wire_a, n.wire_b, params, reverse, CONTROL_PATH, seed=2, prefix=in_ns(n.ns_w, [])):
        probe = wire.udp_probe(count=PROBE_COUNT, interval_us=PROBE_INTERVAL_US, size_bytes=PROBE_PAYLOAD_BYTES)
        goodput = None
        if params.rate_mbit:
            goodput = iperf.steady_mbit(wire.iperf3(seconds, warmup_s=2), warmup_s=2)
    delays_ms = [d / 1e6 for d in probe.delays_ns]
    model_ms = [d / 1e6 for d in periodic_delays_ns(params, PROBE_COUNT, PROBE_INTERVAL_US * 1000, PROBE_FRAME_BYTES)]
    sd = params.jitter_ms / 3**0.5 if params.delay_distribution == "uniform" else params.jitter_ms
    return FidelityRow(
        profile=name,
        delay_ms=params.delay_ms,
        delay_model_ms=statistics.fmean(model_ms),
        delay_measured_ms=statistics.fmean(delays_ms),
        jitter_sd_ms=sd,
        jitter_sd_model_ms=statistics.pstdev(model_ms),
        jitter_sd_measured_ms=statistics.pstdev(delays_ms),
        loss_pct=params.loss_pct,
        loss_measured_pct=100 * probe.loss_fraction,
        reordered=probe.reordered,
        rate_mbit=params.rate_mbit,
        goodput_mbit=goodput,
    )


def print_report(fwd: ForwardingResult, rows: list[FidelityRow]) -> None:
    """The human-readable result table."""
    verdict = "meets" if fwd.out_gbit >= TARGET_GBIT else "BELOW"
    print(
        f"max forwarding rate at 20 ms delay, {FRAME_BYTES}-byte frames: "
        f"{fwd.out_gbit:.3f} Gbit/s ({fwd.out_kpps:.1f} kpps) {verdict} the {TARGET_GBIT} Gbit/s target; "
        f"emulator CPU {fwd.cpu_pct:.0f}% of one core; in {fwd.frames_in} out {fwd.frames_out} "
        f"limit-drops {fwd.dropped_limit} rx-drops {fwd.rx_drops} tx-errors {fwd.tx_errors}; "
        f"iperf3 payload: sender {fwd.sender_gbit:.3f}, "
        f"receiver {fwd.receiver_gbit:.3f} Gbit/s"
    )
    print(
        "delay and jitter sd: configured / netem model for this probe / measured (ms); "
        f"TCP goodput ceiling {100 * TCP_PAYLOAD_SHARE:.1f}% of the rate (1448 payload bytes per 1514-byte frame)"
    )
    print(f"{'profile':30} {'delay ms':>26} {'jitter sd ms':>24} {'loss %':>14} {'reord':>6} {'goodput Mbit/s':>22}")
    for r in rows:
        goodput = (
            "-"
            if r.goodput_mbit is None
            else f"{r.goodput_mbit:.1f} ({100 * r.goodput_mbit / r.rate_mbit:.1f}% of {r.rate_mbit:g})"
        )
        print(
            f"{r.profile:30} {r.delay_ms:6.2f}/{r.delay_model_ms:7.3f}/{r.delay_measured_ms:<8.3f} "
            f"{r.jitter_sd_ms:6.2f}/{r.jitter_sd_model_ms:6.3f}/{r.jitter_sd_measured_ms:<7.3f} "
            f"{r.loss_pct:6.2f}/{r.loss_measured_pct:<7.3f} {r.reordered:6d} {goodput:>22}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run both benchmarks; returns 1 when not root."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_shaper", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each iperf3 run (s)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--skip-fidelity", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if os.geteuid() != 0:
        print("bench_shaper needs root (network namespaces, AF_PACKET)", file=sys.stderr)
        return 1
    with NetnsWire(WireNames(prefix="pddb")) as wire:
        fwd = forwarding_rate(wire, args.seconds)
        rows = [] if args.skip_fidelity else [fidelity(wire, k, p, args.seconds) for k, p in PROFILES.items()]
    print_report(fwd, rows)
    if args.json:
        args.json.write_text(json.dumps({"forwarding": asdict(fwd), "fidelity": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
