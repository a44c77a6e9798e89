"""netem's added options on a live link, both backends (needs root): duplicate, corrupt, reorder and slot measured on
the receiver's packets against their binomial intervals or the slot's pattern, and a Mahimahi rate trace's goodput.

Builds its own namespace triple (`topology.wire_netns`, prefix `pddo`, 10.250.0.0/24): the userspace backend runs
`topology.userspace` in the middle namespace; the tc backend bridges the middle namespace's two ends and puts netem
(the argv topology.tc builds, the rate trace played by topology.trace_player) on the B side's egress, so A -> B
crosses it. tc tests skip where the kernel has no netem. Namespaces are deleted by name, processes stopped by PID,
the bridge goes with its namespace, also when a test fails.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest

from experiments.analysis.linkstats import GOODPUT_MAX_FRAC, TCP_PAYLOAD_SHARE
from topology import iperf, tc
from topology.emulator import UserspaceEmulator
from topology.netem_grammar import parse_netem
from topology.profiles import PROFILE_DIR, LinkParams, link_params_from_dict
from topology.shaping import TcBackend
from topology.trace_player import TracePlayer
from topology.wire_netns import NetnsWire, WireNames, in_ns, run

pytestmark = [pytest.mark.emulation, pytest.mark.slow]

MISSING = [tool for tool in ("ip", "ethtool", "iperf3", "tc") if shutil.which(tool) is None]
if os.geteuid() != 0:
    pytest.skip("needs root: creates network namespaces and AF_PACKET sockets", allow_module_level=True)
if MISSING:
    pytest.skip(f"needs {', '.join(MISSING)} (make setup installs them)", allow_module_level=True)

NAMES = WireNames(prefix="pddo")
BACKENDS = ["userspace", "tc"]
# Two-sided 99% normal quantile for the binomial intervals.
Z99 = 2.576
# Share of a probe frame's bits whose flip a receiver does not notice: the source MAC (48 of 106 x 8 bits for a
# 64-byte payload); every other flipped bit fails a MAC match or a checksum, and the datagram is lost.
PROBE_FRAME_BITS = (64 + 8 + 20 + 14) * 8
UNNOTICED_SHARE = 48 / PROBE_FRAME_BITS
CONST_TRACE = str(PROFILE_DIR / "traces" / "const-12mbit.trace")


def binomial_interval(n: int, p: float) -> tuple[float, float]:
    """99% interval of the number of hits in n trials (normal approximation, +-1 for discreteness)."""
    sd = math.sqrt(n * p * (1 - p))
    return n * p - Z99 * sd - 1, n * p + Z99 * sd + 1


def params(line: str, **fields) -> LinkParams:
    return link_params_from_dict({**parse_netem(line), **fields}, "<test>")


@pytest.fixture(scope="module")
def wire():
    with NetnsWire(NAMES) as w:
        yield w


@pytest.fixture
def link(wire, tmp_path):
    """Factory: impair A -> B with params on the named backend (B -> A plain); undone at teardown."""
    emulators: list[UserspaceEmulator] = []
    players: list[TracePlayer] = []
    bridged: list[bool] = []

    def start(backend: str, a_to_b: LinkParams, seed: int = 1) -> UserspaceEmulator | None:
        if backend == "userspace":
            emu = UserspaceEmulator(
                NAMES.wire_a,
                NAMES.wire_b,
                a_to_b,
                LinkParams(),
                tmp_path / "ctl.sock",
                seed=seed,
                prefix=in_ns(NAMES.ns_w, []),
                log_path=tmp_path / "emulator.log",
            )
            emulators.append(emu)
            return emu.start()
        if not tc.kernel_has_netem():
            pytest.skip("this kernel has no sch_netem")
        w = lambda argv: run(in_ns(NAMES.ns_w, argv))  # noqa: E731
        w(["ip", "link", "add", "br0", "type", "bridge"])
        bridged.append(True)
        for dev in (NAMES.wire_a, NAMES.wire_b):
            w(["ip", "link", "set", dev, "master", "br0"])
        w(["ip", "link", "set", "br0", "up"])
        if a_to_b.rate_trace:
            player = TracePlayer(NAMES.wire_b, a_to_b, w)
            w(player.install_cmd())
            players.append(player.start())
        else:
            w(tc.netem_cmd(NAMES.wire_b, a_to_b))
        return None

    yield start
    for player in players:
        player.stop()
    for emu in emulators:
        emu.stop()
    if bridged:
        run(in_ns(NAMES.ns_w, tc.delete_root_cmd(NAMES.wire_b)))
        run(in_ns(NAMES.ns_w, ["ip", "link", "del", "br0"]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_on_the_wire_within_the_binomial_interval(wire, link, backend):
    n, p = 10_000, 0.05
    emu = link(backend, params("delay 2ms duplicate 5%"))
    probe = wire.udp_probe(count=n, interval_us=200)
    lo, hi = binomial_interval(n, p)
    assert probe.received == n and lo <= probe.duplicates <= hi, probe.duplicates
    if emu:
        assert emu.stats()["a_to_b"].duplicated == probe.duplicates


@pytest.mark.parametrize("backend", BACKENDS)
def test_correlated_duplicates_come_in_longer_runs(wire, link, backend):
    link(backend, params("delay 2ms duplicate 50% 90%"))
    probe = wire.udp_probe(count=4000, interval_us=500)
    seen: set[int] = set()
    doubled = {s for s in probe.seqs if s in seen or seen.add(s)}
    runs, length = [], 0
    for s in range(4000):
        if s in doubled:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    assert 0.4 < len(doubled) / 4000 < 0.6 and sum(runs) / len(runs) > 4  # uncorrelated: 2
    if backend == "tc":  # the kernel got the correlation (tc alone would drop it: topology.tc._sends_correlations)
        assert "duplicate 50% 90%" in run(in_ns(NAMES.ns_w, ["tc", "qdisc", "show", "dev", NAMES.wire_b]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_live_change_keeps_nothing_of_the_line_before(wire, link, backend):
    first, plain = params("delay 2ms corrupt 30% slot 20ms packets 2"), params("delay 2ms")
    emu = link(backend, first)
    if emu:
        emu.set_params("a_to_b", plain)
        probe = wire.udp_probe(count=2000, interval_us=500)
    else:  # TcBackend.apply: netem_change would keep corrupt and slot, so the backend reinstalls netem
        ends = {"a_to_b": (None, NAMES.wire_b), "b_to_a": (None, NAMES.wire_a)}
        shaper = TcBackend(lambda host, argv: run(in_ns(NAMES.ns_w, argv)), ends)
        try:
            shaper.start(first, LinkParams())
            shaper.apply("a_to_b", plain)
            probe = wire.udp_probe(count=2000, interval_us=500)
        finally:
            run(in_ns(NAMES.ns_w, tc.delete_root_cmd(NAMES.wire_a)))  # the link fixture removes wire_b's
    assert probe.received == 2000, probe.received  # no corruption left
    # no 20 ms slots left: 2 frames a slot would queue nearly every probe (40 arrive a slot) for ever longer; a
    # lone late probe is the machine's (one of 2,000 at 15.8 ms under qemu TCG)
    late = sum(d >= 10_000_000 for d in probe.delays_ns)
    assert late <= 20, (late, max(probe.delays_ns))


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupted_datagrams_are_lost_within_the_binomial_interval(wire, link, backend):
    n, p = 10_000, 0.05
    emu = link(backend, params("delay 2ms corrupt 5%"))
    probe = wire.udp_probe(count=n, interval_us=200)
    lost = n - probe.received
    lo, _ = binomial_interval(n, p * (1 - UNNOTICED_SHARE))
    _, hi = binomial_interval(n, p)
    assert lo <= lost <= hi, lost
    if emu:
        assert lost <= emu.stats()["a_to_b"].corrupted


@pytest.mark.parametrize("backend", BACKENDS)
def test_reordered_datagrams_skip_the_delay_within_the_binomial_interval(wire, link, backend):
    n, p = 5_000, 0.25
    link(backend, params("delay 10ms reorder 25%"))
    probe = wire.udp_probe(count=n, interval_us=1000)
    at_once = sum(d < 5_000_000 for d in probe.delays_ns)  # sent at once, not after the 10 ms
    lo, hi = binomial_interval(n, p)
    assert probe.received == n and lo <= at_once <= hi, at_once
    assert probe.reordered > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_slots_release_bursts_of_their_budget_10ms_apart(wire, link, backend):
    link(backend, params("slot 10ms packets 5"))
    probe = wire.udp_probe(count=500, interval_us=1000, idle_timeout_s=5)
    assert probe.received == 500
    # Arrival (ns after the first send) = send time + delay; frames of one slot arrive together.
    arrivals = sorted(seq * 1_000_000 + d for seq, d in zip(probe.seqs, probe.delays_ns))
    bursts, start = [[arrivals[0]]], arrivals[0]
    for t in arrivals[1:]:
        if t - start < 2_000_000:
            bursts[-1].append(t)
        else:
            bursts.append([t])
            start = t
    assert max(len(b) for b in bursts) <= 5
    gaps = sorted(b[0] - a[0] for a, b in zip(bursts, bursts[1:]))
    assert abs(gaps[len(gaps) // 2] - 10_000_000) < 1_000_000, gaps[:10]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rate_trace_carries_its_rate(wire, link, backend):
    link(backend, LinkParams(delay_ms=5, rate_trace=CONST_TRACE, limit_pkts=2000))
    tries = [iperf.steady_mbit(wire.iperf3(5, warmup_s=1), warmup_s=1) for _ in range(2)]
    # 12 Mbit/s of 1500-byte opportunities, each carrying one 1514-byte frame (the userspace backend counts the
    # frame, Mahimahi the IP packet; tc's rate counts the frame): TCP's payload share of that, at least 85 % of it.
    ceiling = 12 * TCP_PAYLOAD_SHARE * 1514 / 1500
    assert 0.85 * ceiling <= max(tries) <= GOODPUT_MAX_FRAC / TCP_PAYLOAD_SHARE * ceiling, (tries, ceiling)
