"""The one naming scheme of the emulated network. Every other module derives names from here.

Hosts (each a Mininet host: its own network namespace):

    cluster A (subnet 10.1.0.0/24, gateway gwa = 10.1.0.1):
        client   10.1.0.10      the load generator
        router   10.1.0.11      the client-facing PDD router
        p<i>     10.1.0.(20+i)  prefill workers,      i = 1..19
        rld<i>   10.1.0.(40+i)  relay-decode workers, i = 1..19
        xa       10.1.0.90      cross-traffic end host (only with cross hosts)
    cluster B (subnet 10.2.0.0/24, gateway gwb = 10.2.0.1):
        md<i>    10.2.0.(60+i)  main-decode workers,  i = 1..19
        xb       10.2.0.90      cross-traffic end host (only with cross hosts)
    WAN transit (10.0.0.0/30): gwa-eth1 = 10.0.0.1, gwb-eth1 = 10.0.0.2
    wan      (no address)    the userspace backend's wire: wan-eth0 faces gwa,
                             wan-eth1 faces gwb; absent with the tc backend.

Interfaces: Mininet's `<host>-eth<n>`. Each host's eth0 faces its cluster
switch; the gateways' eth1 face the WAN. Switches are Linux bridges in the
root namespace, the only root-namespace objects the topology makes, named
with the testbed prefix: `pdd-sa` (cluster A), `pdd-sb` (cluster B), with
ports `pdd-sa-eth<n>`. `make clean` finds leftovers by that prefix.

Cross-traffic hosts: `xa` and `xb` send and receive the competing flows
(iperf3) that share the WAN queue with the KV transfers; a flow `a_to_b`
runs xa -> xb, `b_to_a` xb -> xa. They exist only when the topology is asked
for them (`TopologyConfig.cross_hosts`), so every other experiment keeps its
host list, its readiness checks and its namespaces unchanged.

Directions: `a_to_b` is shaped on gwa-eth1's egress (tc) or wan-eth0 -> wan-eth1
(userspace); `b_to_a` on gwb-eth1's egress or wan-eth1 -> wan-eth0.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "pdd"
SWITCH_A = f"{PREFIX}-sa"
SWITCH_B = f"{PREFIX}-sb"
GATEWAY_A = "gwa"
GATEWAY_B = "gwb"
WIRE = "wan"
SUBNET_A = "10.1.0.0/24"
SUBNET_B = "10.2.0.0/24"
WAN_A_IP = "10.0.0.1"
WAN_B_IP = "10.0.0.2"
WAN_PREFIXLEN = 30
MAX_PER_ROLE = 19
# Host-number offsets inside each /24 (see the table above).
_HOST_OFFSETS = {"gwa": 1, "client": 10, "router": 11, "p": 20, "rld": 40, "gwb": 1, "md": 60, "xa": 90, "xb": 90}
_CLUSTER_B = ("md", "gwb", "xb")
CLUSTER_A_ROLES = ("p", "rld")
CLUSTER_B_ROLES = ("md",)
# The cross-traffic host of each cluster, and the role its HostSpec carries.
CROSS_HOSTS = {"a": "xa", "b": "xb"}
CROSS_ROLE = "cross"


@dataclass(frozen=True)
class HostSpec:
    """One host of the topology: name, cluster ('a' or 'b'), LAN address, role."""

    name: str
    cluster: str
    ip: str
    role: str


def host_number(role: str, index: int = 0) -> int:
    """A role's index-th host's number inside its subnet (index from 1; 0 for singletons): the table above."""
    if role not in _HOST_OFFSETS:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(_HOST_OFFSETS)}")
    if index < 0 or index > MAX_PER_ROLE:
        raise ValueError(f"{role} index {index} out of range 0..{MAX_PER_ROLE}")
    return _HOST_OFFSETS[role] + index


def host_ip(role: str, index: int = 0) -> str:
    """LAN address of a role's index-th host (index from 1; 0 for singletons)."""
    net = "10.2.0" if role in _CLUSTER_B else "10.1.0"
    return f"{net}.{host_number(role, index)}"


def host_name(role: str, index: int) -> str:
    """`p1`, `rld2`, `md1`, ...: role plus its index (from 1)."""
    return f"{role}{index}"


def hosts(n_p: int = 1, n_rld: int = 1, n_md: int = 1, cross: bool = False) -> list[HostSpec]:
    """Every end host (gateways excluded) for the given counts, in a stable order; cross: add xa, xb."""
    for role, n in (("p", n_p), ("rld", n_rld), ("md", n_md)):
        if not 1 <= n <= MAX_PER_ROLE:
            raise ValueError(f"count of {role} hosts must be 1..{MAX_PER_ROLE}, got {n}")
    specs = [HostSpec("client", "a", host_ip("client"), "client"), HostSpec("router", "a", host_ip("router"), "router")]
    specs += [HostSpec(host_name("p", i), "a", host_ip("p", i), "p") for i in range(1, n_p + 1)]
    specs += [HostSpec(host_name("rld", i), "a", host_ip("rld", i), "rld") for i in range(1, n_rld + 1)]
    specs += [HostSpec(host_name("md", i), "b", host_ip("md", i), "md") for i in range(1, n_md + 1)]
    if cross:
        specs += [HostSpec(name, cluster, host_ip(name), CROSS_ROLE) for cluster, name in CROSS_HOSTS.items()]
    return specs


def cross_endpoints(direction: str) -> tuple[HostSpec, HostSpec]:
    """(sender, receiver) of a cross-traffic flow in a WAN direction: xa -> xb for a_to_b."""
    if direction not in ("a_to_b", "b_to_a"):
        raise ValueError(f"direction {direction!r}; allowed: a_to_b, b_to_a")
    a, b = (HostSpec(name, cluster, host_ip(name), CROSS_ROLE) for cluster, name in CROSS_HOSTS.items())
    return (a, b) if direction == "a_to_b" else (b, a)


def gateway_lan_ip(cluster: str) -> str:
    """The gateway address inside a cluster's subnet."""
    return host_ip("gwa" if cluster == "a" else "gwb")


def wan_interfaces() -> dict[str, tuple[str, str]]:
    """direction -> (host, interface) whose egress the tc backend shapes."""
    return {"a_to_b": (GATEWAY_A, f"{GATEWAY_A}-eth1"), "b_to_a": (GATEWAY_B, f"{GATEWAY_B}-eth1")}
