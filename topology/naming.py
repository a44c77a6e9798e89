"""The one naming scheme of the emulated network. Every other module derives names from here.

Hosts (each a Mininet host: its own network namespace):

    cluster A (subnet 10.1.0.0/24, gateway gwa = 10.1.0.1):
        client   10.1.0.10      the load generator
        router   10.1.0.11      the client-facing PDD router
        p<i>     10.1.0.(20+i)  prefill workers,      i = 1..19
        rld<i>   10.1.0.(40+i)  relay-decode workers, i = 1..19
    cluster B (subnet 10.2.0.0/24, gateway gwb = 10.2.0.1):
        md<i>    10.2.0.(60+i)  main-decode workers,  i = 1..19
    WAN transit (10.0.0.0/30): gwa-eth1 = 10.0.0.1, gwb-eth1 = 10.0.0.2
    wan      (no address)    the userspace backend's wire: wan-eth0 faces gwa,
                             wan-eth1 faces gwb; absent with the tc backend.

Interfaces: Mininet's `<host>-eth<n>`. Each host's eth0 faces its cluster
switch; the gateways' eth1 face the WAN. Switches are Linux bridges in the
root namespace, the only root-namespace objects the topology makes, named
with the testbed prefix: `pdd-sa` (cluster A), `pdd-sb` (cluster B), with
ports `pdd-sa-eth<n>`. `make clean` finds leftovers by that prefix.

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
_HOST_OFFSETS = {"gwa": 1, "client": 10, "router": 11, "p": 20, "rld": 40, "gwb": 1, "md": 60}
CLUSTER_A_ROLES = ("p", "rld")
CLUSTER_B_ROLES = ("md",)


@dataclass(frozen=True)
class HostSpec:
    """One host of the topology: name, cluster ('a' or 'b'), LAN address, role."""
    name: str
    cluster: str
    ip: str
    role: str


def host_ip(role: str, index: int = 0) -> str:
    """LAN address of a role's index-th host (index from 1; 0 for singletons)."""
    if role not in _HOST_OFFSETS:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(_HOST_OFFSETS)}")
    if index < 0 or index > MAX_PER_ROLE:
        raise ValueError(f"{role} index {index} out of range 0..{MAX_PER_ROLE}")
    net = "10.2.0" if role in ("md", "gwb") else "10.1.0"
    return f"{net}.{_HOST_OFFSETS[role] + index}"


def host_name(role: str, index: int) -> str:
    """`p1`, `rld2`, `md1`, ...: role plus its index (from 1)."""
    return f"{role}{index}"


def hosts(n_p: int = 1, n_rld: int = 1, n_md: int = 1) -> list[HostSpec]:
    """Every end host (gateways excluded) for the given counts, in a stable order."""
    for role, n in (("p", n_p), ("rld", n_rld), ("md", n_md)):
        if not 1 <= n <= MAX_PER_ROLE:
            raise ValueError(f"count of {role} hosts must be 1..{MAX_PER_ROLE}, got {n}")
    specs = [HostSpec("client", "a", host_ip("client"), "client"),
             HostSpec("router", "a", host_ip("router"), "router")]
    specs += [HostSpec(host_name("p", i), "a", host_ip("p", i), "p") for i in range(1, n_p + 1)]
    specs += [HostSpec(host_name("rld", i), "a", host_ip("rld", i), "rld") for i in range(1, n_rld + 1)]
    specs += [HostSpec(host_name("md", i), "b", host_ip("md", i), "md") for i in range(1, n_md + 1)]
    return specs


def gateway_lan_ip(cluster: str) -> str:
    """The gateway address inside a cluster's subnet."""
    return host_ip("gwa" if cluster == "a" else "gwb")


def wan_interfaces() -> dict[str, tuple[str, str]]:
    """direction -> (host, interface) whose egress the tc backend shapes."""
    return {"a_to_b": (GATEWAY_A, f"{GATEWAY_A}-eth1"), "b_to_a": (GATEWAY_B, f"{GATEWAY_B}-eth1")}
