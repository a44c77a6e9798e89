"""The LAN's shaping on a kernel without netem: a token bucket (`tc-tbf(8)`) for the rate, and what it cannot do.

Responsible for: the argv that gives one LAN interface a profile's rate and queue (a tbf root qdisc with a
pfifo child), the refusal of every field a token bucket cannot apply, and the words the run's metadata
records. Not responsible for: running the commands (topology.shaping's UserspaceBackend, on both ends of
every intra-cluster link, as the tc backend puts netem there) or the WAN (the userspace forwarder).

How close it stays to the tc backend's LAN (netem with the same LinkParams):
- rate: tbf charges each frame its length from the Ethernet header on, as netem's rate does, plus
  rate_packet_overhead_bytes as tbf's `overhead` (0..65535 bytes; netem's may be negative, tbf's not).
  TCP between two hosts of one site on a 50 Mbit/s LAN: 47.8 Mbit/s, the payload ceiling 50 x 1448/1514.
- burst: netem paces every frame at the rate; a token bucket lets a full bucket leave at the veth's own
  speed, so a transfer after a pause ends up to BURST_S sooner than under netem. The bucket must hold
  what the rate earns while the qdisc waits for its timer, or the rate is not reached. TCP at 1 Gbit/s
  (payload ceiling 956): two frames 561-636, 0.25 ms 627-866, 1 ms 919-952, 4 ms (tc-tbf(8)'s rate/HZ, a
  rule from jiffy timers; HZ 250 here) 947-956, the lower figures at a load average of 10; at 50 Mbit/s
  two frames already give the full 47.8 (benchmarks/bench_lan.py, two namespaces through a bridge, a
  two-core VM). 1 ms keeps the rate within 4% at a quarter of rate/HZ's head start.
- queue: netem's limit counts packets (LinkParams.effective_limit_pkts, 1000 for the `lan` profile);
  tbf's own queue counts bytes, so a pfifo with that many packets takes its place.
- delay: a token bucket adds none. The path a LAN frame takes, host veth -> Linux bridge -> host veth,
  has a one-way latency of its own: 5 us (median) with a datagram every 200 us, 9-13 us every 1 ms,
  25-52 us every 10 ms, 55-62 us every 100 ms (benchmarks/bench_lan.py and ad hoc runs of the same
  probe on the dev machine: docs/network.md). A LAN delay up to VETH_BASE_ONE_WAY_MS is recorded as met
  by that path, not added; a larger one is refused. (The tc backend adds it on each end a frame leaves
  through: host to host, twice the delay on top of the path.)
Everything else netem does (loss, duplicates, corruption, reordering, jitter, slots, cells, rate traces)
has no mechanism in this kernel (no netem, gact, fq or etf; an eBPF classifier could drop, none is
written): a LAN profile that asks for it is refused, naming the field; the tc backend applies it (a stock
kernel with netem: `make vm-test`).
"""

from __future__ import annotations

import dataclasses
import math

from topology.profiles import FRAME_BYTES, LinkParams

# The bucket holds this long at the rate (s): the qdisc's timer may fire late by up to this without the
# rate being lost (see the module docstring's measurements).
BURST_S = 0.001
# ... and never less than this many full frames: tbf drops a frame larger than its bucket.
MIN_BURST_FRAMES = 2
# The veth path's one-way latency with the CPU idle between frames (ms): a LAN delay up to this is met by
# the path itself (the module docstring's figures; 0.05 ms sits under the 55-62 us medians).
VETH_BASE_ONE_WAY_MS = 0.05
# tbf's `overhead` is an unsigned 16-bit count of bytes.
MAX_OVERHEAD_BYTES = 65535
# The fields a token bucket applies; every other LinkParams field must keep its default.
APPLIED = ("rate_mbit", "rate_packet_overhead_bytes", "limit_pkts", "delay_ms")
TBF_HANDLE = "1:"
FIFO_HANDLE = "10:"


def burst_bytes(rate_mbit: float, burst_s: float = BURST_S) -> int:
    """The bucket's size (bytes): burst_s at the rate, at least MIN_BURST_FRAMES full frames."""
    return max(MIN_BURST_FRAMES * FRAME_BYTES, math.ceil(rate_mbit * 1e6 / 8 * burst_s))


def _why_not(p: LinkParams) -> list[str]:
    """`field = value (reason)` for each field of p a token bucket cannot apply."""
    reasons = []
    if p.delay_ms > VETH_BASE_ONE_WAY_MS:
        reasons.append(f"delay_ms = {p.delay_ms:g} (above the veth path's own {VETH_BASE_ONE_WAY_MS:g} ms)")
    if not 0 <= p.rate_packet_overhead_bytes <= MAX_OVERHEAD_BYTES:
        reasons.append(
            f"rate_packet_overhead_bytes = {p.rate_packet_overhead_bytes} (tbf's overhead is 0..{MAX_OVERHEAD_BYTES})"
        )
    for f in dataclasses.fields(LinkParams):
        value = getattr(p, f.name)
        if f.name not in APPLIED and value != f.default:
            reasons.append(f"{f.name} = {value!r}")
    return reasons


def refusal(p: LinkParams) -> str | None:
    """Why the LAN profile p cannot be applied without netem (one message naming every field), or None."""
    reasons = _why_not(p)
    if not reasons:
        return None
    return (
        f"the LAN profile asks for {', '.join(reasons)}, which only netem applies. The userspace backend shapes "
        f"the LAN with a token bucket: rate_mbit, rate_packet_overhead_bytes, limit_pkts, and a delay_ms up to "
        f"{VETH_BASE_ONE_WAY_MS:g} (the veth path's own). The tc backend applies every field: run it on a kernel "
        f"with netem (--backend tc; `make vm-test` runs a stock kernel under qemu)."
    )


def tbf_cmds(dev: str, p: LinkParams, burst_s: float = BURST_S) -> list[list[str]]:
    """argvs that shape dev's egress to p's rate and queue (run in order, in dev's host); [] without a rate.
    burst_s: the bucket in seconds at the rate (other than BURST_S only to measure it: benchmarks/bench_lan.py)."""
    if not p.rate_mbit:
        return []
    limit_pkts = p.effective_limit_pkts
    overhead = ["overhead", str(p.rate_packet_overhead_bytes)] if p.rate_packet_overhead_bytes else []
    tbf = ["tbf", "rate", f"{round(p.rate_mbit * 1e6)}bit", "burst", str(burst_bytes(p.rate_mbit, burst_s))]
    # tbf's own limit (bytes) holds until the pfifo replaces its queue: the same packets, full-sized.
    tbf += ["limit", str(limit_pkts * FRAME_BYTES), *overhead]
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", TBF_HANDLE, *tbf],
        ["tc", "qdisc", "replace", "dev", dev, "parent", f"{TBF_HANDLE}1", "handle", FIFO_HANDLE, "pfifo",
         "limit", str(limit_pkts)],
    ]  # fmt: skip


def describe(p: LinkParams) -> str:
    """What the LAN gets, in words (the run's metadata `lan_shaping`)."""
    if p.rate_mbit:
        overhead = f", +{p.rate_packet_overhead_bytes} B/frame" if p.rate_packet_overhead_bytes else ""
        rate = (
            f"tbf {p.rate_mbit:g} Mbit/s{overhead} (burst {burst_bytes(p.rate_mbit)} B = {BURST_S * 1e3:g} ms at "
            f"the rate; pfifo of {p.effective_limit_pkts} packets) on both ends of every LAN link"
        )
    else:
        rate = "no rate limit"
    delay = (
        f"delay {p.delay_ms:g} ms not added: met by the veth path's own one-way latency "
        f"(5-60 us median on the dev machine, docs/network.md)"
        if p.delay_ms
        else "no delay added"
    )
    return f"{rate}; {delay}"
