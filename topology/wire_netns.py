"""A minimal a <-> wire <-> b namespace triple for testing the userspace emulator.

Responsible for: creating, and always removing by name, three network
namespaces joined by two veth pairs, with offloads off and IPv6 off, so the
userspace emulator can be tested and benchmarked without Mininet; and
running traffic across them (UDP delay probes, iperf3) from A to B:

    NS_A (IF_A 10.250.0.1/24) == veth == (WIRE_A) NS_W (WIRE_B) == veth == (IF_B 10.250.0.2/24) NS_B

Both ends share one /24: the wire is layer 2, the emulator bridges WIRE_A and
WIRE_B. Not responsible for: the testbed's topology (see `topology.net`) or
the emulator itself (see `topology.userspace`). Needs root.
"""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import dataclass
from typing import Any, Sequence

from topology import iperf, udp_probe
from topology.proc import check_output, reap, wait_listening
from topology.udp_probe import ProbeResult
from topology.userspace import REPO_ROOT, offload_off_cmds

log = logging.getLogger(__name__)

IPERF_PORT = iperf.DEFAULT_PORT
# How long a server may take to start listening (s).
SERVER_READY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WireNames:
    """Names and addresses of one namespace triple (defaults: the tests' `pddt-` prefix)."""

    prefix: str = "pddt"
    if_a: str = "a0"
    wire_a: str = "wa"
    wire_b: str = "wb"
    if_b: str = "b0"
    addr_a: str = "10.250.0.1"
    addr_b: str = "10.250.0.2"
    prefix_len: int = 24
    # Fixed MACs, so ARP entries can be permanent: no ARP crosses the emulator
    # (it would delay the first probes by a round trip, and a lossy profile drops it).
    mac_a: str = "02:50:00:00:00:01"
    mac_b: str = "02:50:00:00:00:02"

    @property
    def ns_a(self) -> str:
        return f"{self.prefix}-a"

    @property
    def ns_w(self) -> str:
        return f"{self.prefix}-w"

    @property
    def ns_b(self) -> str:
        return f"{self.prefix}-b"

    @property
    def namespaces(self) -> tuple[str, str, str]:
        return (self.ns_a, self.ns_w, self.ns_b)


def in_ns(ns: str, cmd: Sequence[str]) -> list[str]:
    """`cmd` run inside namespace `ns`."""
    return ["ip", "netns", "exec", ns, *cmd]


def setup_cmds(n: WireNames) -> list[list[str]]:
    """Commands that build the triple (run in order, as root)."""
    cmds = [["ip", "netns", "add", ns] for ns in n.namespaces]
    cmds += [
        ["ip", "link", "add", n.if_a, "netns", n.ns_a, "type", "veth", "peer", "name", n.wire_a, "netns", n.ns_w],
        ["ip", "link", "add", n.if_b, "netns", n.ns_b, "type", "veth", "peer", "name", n.wire_b, "netns", n.ns_w],
    ]
    ends = [(n.ns_a, n.if_a), (n.ns_w, n.wire_a), (n.ns_w, n.wire_b), (n.ns_b, n.if_b)]
    for ns, ifname in ends:
        cmds.append(in_ns(ns, ["sysctl", "-q", "-w", f"net.ipv6.conf.{ifname}.disable_ipv6=1"]))
        cmds += offload_off_cmds([ifname], netns=ns)
    for ns, ifname, addr, mac, peer_addr, peer_mac in [
        (n.ns_a, n.if_a, n.addr_a, n.mac_a, n.addr_b, n.mac_b),
        (n.ns_b, n.if_b, n.addr_b, n.mac_b, n.addr_a, n.mac_a),
    ]:
        cmds.append(in_ns(ns, ["ip", "link", "set", ifname, "address", mac]))
        cmds.append(in_ns(ns, ["ip", "addr", "add", f"{addr}/{n.prefix_len}", "dev", ifname]))
        cmds.append(
            in_ns(ns, ["ip", "neigh", "replace", peer_addr, "lladdr", peer_mac, "dev", ifname, "nud", "permanent"])
        )
    for ns, ifname in [*ends, (n.ns_a, "lo"), (n.ns_b, "lo")]:
        cmds.append(in_ns(ns, ["ip", "link", "set", ifname, "up"]))
    return cmds


def teardown_cmds(n: WireNames) -> list[list[str]]:
    """Commands that remove the triple by name (the veths go with their namespaces)."""
    return [["ip", "netns", "del", ns] for ns in n.namespaces]


def run(cmd: Sequence[str]) -> str:
    """Run a command; raise with its stderr on failure."""
    return check_output(cmd, timeout_s=None)


def existing_namespaces() -> set[str]:
    """Names of the network namespaces that exist now."""
    return {line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()}


class NetnsWire:
    """Context manager: the namespace triple exists inside the `with` block only."""

    def __init__(self, names: WireNames = WireNames()):
        """names: the triple's names and addresses."""
        self.names = names

    def __enter__(self) -> "NetnsWire":
        stale = existing_namespaces() & set(self.names.namespaces)
        if stale:
            log.warning("removing namespaces left by an earlier run: %s", sorted(stale))
            self.teardown()
        try:
            for cmd in setup_cmds(self.names):
                run(cmd)
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> None:
        """Delete the namespaces we own, by name; never raises."""
        present = existing_namespaces()
        for cmd in teardown_cmds(self.names):
            if cmd[-1] in present:
                try:
                    run(cmd)
                except RuntimeError as exc:
                    log.error("teardown: %s", exc)

    def __exit__(self, *exc_info) -> None:
        self.teardown()

    # -- traffic from A to B -------------------------------------------------

    def udp_probe(
        self, count: int, interval_us: float, size_bytes: int = 64, idle_timeout_s: float = 3.0
    ) -> ProbeResult:
        """Send `count` timestamped datagrams A -> B; the receiver's view of them."""
        n = self.names
        recv_cmd = in_ns(n.ns_b, udp_probe.recv_argv(count, idle_timeout_s))
        send_cmd = in_ns(n.ns_a, udp_probe.send_argv(n.addr_b, count, interval_us, size_bytes))
        log.debug("run: %s", " ".join(recv_cmd))
        receiver = subprocess.Popen(recv_cmd, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        try:
            if receiver.stdout.readline().strip() != "ready":
                raise RuntimeError("udp probe receiver failed to start")
            subprocess.run(send_cmd, check=True, cwd=REPO_ROOT)
            data = json.loads(receiver.stdout.readline())
        finally:
            reap(receiver)
        return ProbeResult(**data)

    def iperf3(
        self, duration_s: float, warmup_s: float = 0.0, udp_mbit: float | None = None, extra: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Run an iperf3 client in A against a one-off server in B; the client's JSON report, the
        server's inside it (read the goodput with `iperf.receiver_mbit(report, warmup_s)`)."""
        n = self.names
        server_cmd = in_ns(n.ns_b, iperf.server_argv(IPERF_PORT))
        log.debug("run: %s", " ".join(server_cmd))
        server = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(
                lambda argv: run(in_ns(n.ns_b, argv)),
                IPERF_PORT,
                f"iperf3 server in {n.ns_b}",
                SERVER_READY_TIMEOUT_S,
                lambda: server.poll() is None,
            )
            argv = iperf.client_argv(n.addr_b, duration_s, IPERF_PORT, warmup_s, udp_mbit, extra)
            return json.loads(run(in_ns(n.ns_a, argv)))
        finally:
            reap(server)
