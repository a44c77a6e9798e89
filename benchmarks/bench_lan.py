"""The LAN path's own one-way latency, and TCP goodput under the userspace backend's LAN token bucket (needs root).

Responsible for: measuring, on the path a LAN frame takes in the testbed (host veth -> Linux bridge -> host
veth, offloads off), (1) the one-way delay of small datagrams at several send intervals (topology.udp_probe:
one monotonic clock across namespaces, the kernel's arrival timestamp), without and with the `lan`
profile's token bucket, and (2) TCP goodput A -> B with topology.lan_tbf's token bucket on both egress
ends, at a few rates and bucket sizes, and unshaped. Prints what it measured: the figures behind
topology/lan_tbf.py's constants and docs/network.md's LAN section.
Not responsible for: the Mininet topology (tests/emulation/test_lan_shaping.py checks the bucket there).

    sudo .venv/bin/python -m benchmarks.bench_lan [--prefix pddl] [--tcp-seconds 4]

The namespace triple of topology.wire_netns (A, W, B), its two wire ends joined by a bridge in W; removed by
name at exit.
"""

from __future__ import annotations

import argparse
import logging
import sys

from experiments.analysis.linkstats import TCP_PAYLOAD_SHARE
from topology import iperf, lan_tbf
from topology.profiles import LinkParams, load_profile
from topology.wire_netns import NetnsWire, WireNames, in_ns, run

BRIDGE = "br0"
# (send interval us, datagrams): from back-to-back traffic to a CPU idle between frames.
PROBE_PLANS = ((200, 2000), (1000, 2000), (10_000, 200), (100_000, 100))
PROBE_BYTES = 64
# (rate Mbit/s, bucket s): the minimum bucket (two frames), 0.25 ms, the chosen 1 ms, tc-tbf(8)'s rate/HZ at HZ 250.
TBF_PLANS = ((50, 0.0), (50, 0.001), (1000, 0.0), (1000, 0.00025), (1000, 0.001), (1000, 0.004), (10_000, 0.001))
WARMUP_S = 1.0
# The best of a few TCP tests: a busy host only ever takes goodput away (experiments.analysis.linkstats).
TCP_TRIES = 2


def bridge_the_wire(n: WireNames) -> None:
    """Join the wire namespace's two ends with a Linux bridge, as the testbed's switches join a site's hosts."""
    run(in_ns(n.ns_w, ["ip", "link", "add", BRIDGE, "type", "bridge"]))
    for dev in (n.wire_a, n.wire_b):
        run(in_ns(n.ns_w, ["ip", "link", "set", dev, "master", BRIDGE]))
    run(in_ns(n.ns_w, ["ip", "link", "set", BRIDGE, "up"]))


def one_way_us(wire: NetnsWire, interval_us: int, count: int) -> list[float]:
    """Each datagram's one-way delay A -> B (us), sorted."""
    probe = wire.udp_probe(count=count, interval_us=interval_us, size_bytes=PROBE_BYTES)
    return sorted(d / 1000 for d in probe.delays_ns)


def shape(n: WireNames, params: LinkParams | None, burst_s: float) -> None:
    """The token bucket on A's egress and the bridge's port towards B (None: none)."""
    for ns, dev in ((n.ns_a, n.if_a), (n.ns_w, n.wire_b)):
        if params is None:
            run(in_ns(ns, ["tc", "qdisc", "del", "dev", dev, "root"]))
            continue
        for argv in lan_tbf.tbf_cmds(dev, params, burst_s):
            run(in_ns(ns, argv))


def goodput_mbit(wire: NetnsWire, seconds: float) -> float:
    """TCP A -> B: the receiver's steady goodput (topology.iperf) after a warm-up."""
    return iperf.steady_mbit(wire.iperf3(seconds, WARMUP_S), WARMUP_S)


def main() -> int:
    """Build the bridged triple, measure, print, remove it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default="pddl", help="the namespaces' name prefix")
    ap.add_argument("--tcp-seconds", type=float, default=4.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = WireNames(prefix=args.prefix)
    with NetnsWire(names) as wire:
        bridge_the_wire(names)
        print("| path | send interval | datagrams | one-way min us | p10 | p50 | p90 | p99 |")
        print("|---|---|---|---|---|---|---|---|")
        for path, params in (("veth", None), ("veth + the lan bucket", load_profile("lan").a_to_b)):
            if params:
                shape(names, params, lan_tbf.BURST_S)
            for interval_us, count in PROBE_PLANS:
                d = one_way_us(wire, interval_us, count)
                q = [d[min(len(d) - 1, int(f * len(d)))] for f in (0.1, 0.5, 0.9, 0.99)]
                cells = [f"{x:.1f}" for x in (d[0], *q)]
                print(f"| {path} | {interval_us} us | {len(d)} | " + " | ".join(cells) + " |")
        print("\n| rate Mbit/s | bucket | TCP goodput Mbit/s | payload ceiling |\n|---|---|---|---|")
        for rate, burst_s in TBF_PLANS:
            shape(names, LinkParams(rate_mbit=rate), burst_s)
            got = max(goodput_mbit(wire, args.tcp_seconds) for _ in range(TCP_TRIES))
            bucket = f"{lan_tbf.burst_bytes(rate, burst_s)} B ({burst_s * 1e3:g} ms)"
            print(f"| {rate} | {bucket} | {got:.1f} | {rate * TCP_PAYLOAD_SHARE:.1f} |")
        shape(names, None, 0.0)
        print(f"| unshaped | - | {goodput_mbit(wire, args.tcp_seconds):.1f} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
