"""The userspace backend's LAN shaping, live: a token bucket on both ends of every intra-cluster link that caps
TCP between two hosts of one site at the LAN profile's rate, and a LAN profile that needs netem refused.

Always the userspace backend (it runs on any kernel): the tc backend's LAN is netem, checked by the fidelity
tests' WAN counterpart. Unshaped, two hosts of one site carry ~4 Gbit/s here (offloads off), so the cap
below fails without the token bucket.
"""

import dataclasses
import json
import re
import subprocess

import pytest

from experiments.analysis.linkstats import GOODPUT_MAX_FRAC, GOODPUT_MIN_FRAC
from topology import iperf, naming
from topology.net import Testbed, TopologyConfig
from topology.proc import wait_listening
from topology.profiles import Profile, load_profile
from topology.shaping import ShapingError

LAN_RATE_MBIT = 50
SENDER, RECEIVER = "p1", "rld1"  # both in cluster A: the path is p1-eth0 -> pdd-sa -> rld1-eth0
TCP_SECONDS, TCP_WARMUP_S = 4.0, 1.0


def _lan(**changes) -> Profile:
    """The shipped `lan` profile with some fields changed, both directions alike."""
    lan = load_profile("lan")
    params = lan.a_to_b.replace(**changes)
    return dataclasses.replace(lan, name="lan-test", a_to_b=params, b_to_a=params)


def _config(lan_profile) -> TopologyConfig:
    return TopologyConfig(wan_profile=load_profile("wan-regional"), lan_profile=lan_profile, backend="userspace")


def _qdiscs(tb: Testbed, host: str | None, dev: str) -> str:
    return tb.run(host, ["tc", "qdisc", "show", "dev", dev])


def _switch_ports(tb: Testbed, bridge: str) -> list[str]:
    lines = tb.run(None, ["ip", "-o", "link", "show", "master", bridge]).splitlines()
    return [line.split(": ")[1].split("@")[0] for line in lines if line.strip()]


def _goodput_mbit(tb: Testbed) -> float:
    server = tb.popen(RECEIVER, iperf.server_argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(
        lambda argv: tb.run(RECEIVER, argv), iperf.DEFAULT_PORT, "iperf3", alive=lambda: server.poll() is None
    )
    addr = next(s.ip for s in naming.hosts() if s.name == RECEIVER)
    out = tb.run(SENDER, iperf.client_argv(addr, TCP_SECONDS, warmup_s=TCP_WARMUP_S), timeout_s=TCP_SECONDS + 60)
    server.wait(timeout=10)
    return iperf.steady_mbit(json.loads(out), TCP_WARMUP_S)


def test_a_token_bucket_on_every_lan_end_caps_tcp_between_hosts_of_one_site():
    with Testbed(_config(_lan(rate_mbit=LAN_RATE_MBIT))) as tb:
        tbf = re.compile(rf"qdisc tbf 1: root .*rate {LAN_RATE_MBIT}Mbit")
        fifo = "qdisc pfifo 10: parent 1:1 limit 1000p"  # netem's default queue, as the tc backend's
        host_ends = [(s.name, f"{s.name}-eth0") for s in naming.hosts()]
        host_ends += [(gw, f"{gw}-eth0") for gw in (naming.GATEWAY_A, naming.GATEWAY_B)]
        switch_ends = [(None, port) for br in (naming.SWITCH_A, naming.SWITCH_B) for port in _switch_ports(tb, br)]
        assert len(switch_ends) == len(host_ends)  # one switch port per host end
        for host, dev in host_ends + switch_ends:
            shown = _qdiscs(tb, host, dev)
            assert tbf.search(shown) and fifo in shown, (host, dev, shown)
        for host, dev in ((naming.GATEWAY_A, "gwa-eth1"), (naming.WIRE, f"{naming.WIRE}-eth0")):
            assert "tbf" not in _qdiscs(tb, host, dev), (host, dev)  # the WAN is the forwarder's
        assert tb.metadata()["lan_shaping"].startswith(f"tbf {LAN_RATE_MBIT} Mbit/s")
        goodput = _goodput_mbit(tb)
    # TCP's payload is 1448 of each 1514-byte frame: 47.8 Mbit/s at most (+1%), at least 90% of the rate.
    assert GOODPUT_MIN_FRAC * LAN_RATE_MBIT <= goodput <= GOODPUT_MAX_FRAC * LAN_RATE_MBIT, goodput


def test_a_lan_profile_that_needs_netem_is_refused_and_nothing_is_left():
    with pytest.raises(ShapingError, match=r"loss_pct = 0\.1.*only netem applies.*tc backend"):
        with Testbed(_config(_lan(rate_mbit=LAN_RATE_MBIT, loss_pct=0.1))):
            pass
