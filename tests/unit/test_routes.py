"""How gateways address and route a topology (topology.routes): two-clusters gives exactly the commands the
two-cluster testbed always ran, three-sites reaches C from B through A, two-lines puts each MD on one line
both ways (per-destination) or spreads flows (per-flow)."""

import copy

import yaml

from topology import naming
from topology.routes import gateway_commands, line_of_host, next_hops, readiness_pairs
from topology.topofile import TOPOLOGY_DIR, host_specs, line_specs, load_topology, topology_from_dict


def _commands(name, pools=None, cross=False):
    topo = load_topology(name)
    return gateway_commands(topo, host_specs(topo, pools, cross), line_specs(topo))


def _routes(cmds):
    return [c[3:] for c in cmds if c[:3] == ["ip", "route", "add"]]


def test_two_clusters_routes_as_the_two_cluster_testbed_did():
    cmds = _commands("two-clusters", {"p": 2, "rld": 2, "md": 3}, cross=True)
    assert list(cmds) == [naming.GATEWAY_A, naming.GATEWAY_B]
    for gw, lan, wan, remote, far in (
        ("gwa", naming.gateway_lan_ip("a"), naming.WAN_A_IP, naming.SUBNET_B, naming.WAN_B_IP),
        ("gwb", naming.gateway_lan_ip("b"), naming.WAN_B_IP, naming.SUBNET_A, naming.WAN_A_IP),
    ):
        got = cmds[gw]
        assert ["ip", "addr", "add", f"{lan}/24", "dev", f"{gw}-eth0"] in got
        assert ["ip", "addr", "add", f"{wan}/{naming.WAN_PREFIXLEN}", "dev", f"{gw}-eth1"] in got
        assert ["sysctl", "-qw", "net.ipv4.ip_forward=1"] in got
        assert _routes(got) == [[remote, "via", far, "dev", f"{gw}-eth1"]]
        assert not [c for c in got if c[:2] == ["ip", "rule"]]


def test_three_sites_b_reaches_c_through_a():
    topo = load_topology("three-sites")
    assert next_hops(topo) == {"a": {"b": "b", "c": "c"}, "b": {"a": "a", "c": "a"}, "c": {"a": "a", "b": "a"}}
    cmds = _commands("three-sites", {"md": 4})
    # line wanb is 10.0.0.0/30 (gwa .1, gwb .2), wanc 10.0.0.4/30 (gwa .5, gwc .6)
    assert _routes(cmds["gwa"]) == [
        ["10.2.0.0/24", "via", "10.0.0.2", "dev", "gwa-eth1"],
        ["10.3.0.0/24", "via", "10.0.0.6", "dev", "gwa-eth2"],
    ]
    assert _routes(cmds["gwb"]) == [
        ["10.1.0.0/24", "via", "10.0.0.1", "dev", "gwb-eth1"],
        ["10.3.0.0/24", "via", "10.0.0.1", "dev", "gwb-eth1"],
    ]
    assert _routes(cmds["gwc"]) == [
        ["10.1.0.0/24", "via", "10.0.0.5", "dev", "gwc-eth1"],
        ["10.2.0.0/24", "via", "10.0.0.5", "dev", "gwc-eth1"],
    ]
    ready = readiness_pairs(topo, line_specs(topo))
    assert ("gwb", ["-I", "10.2.0.1", "10.3.0.1"]) in ready and ("gwa", ["10.0.0.6"]) in ready


def test_two_lines_per_destination_puts_each_md_on_one_line_both_ways():
    topo = load_topology("two-lines")
    specs = host_specs(topo, {"md": 3}, cross=True)
    assert line_of_host(topo, specs, line_specs(topo)) == {"md1": "fast", "md2": "cheap", "md3": "fast", "xb": "cheap"}
    cmds = gateway_commands(topo, specs, line_specs(topo))
    # fast: 10.0.0.0/30 on gwa-eth1/gwb-eth1; cheap: 10.0.0.4/30 on gwa-eth2/gwb-eth2
    assert _routes(cmds["gwa"]) == [
        ["10.2.0.0/24", "via", "10.0.0.2", "dev", "gwa-eth1"],
        ["10.2.0.62/32", "via", "10.0.0.6", "dev", "gwa-eth2"],
        ["10.2.0.90/32", "via", "10.0.0.6", "dev", "gwa-eth2"],
    ]
    assert _routes(cmds["gwb"]) == [
        ["10.1.0.0/24", "via", "10.0.0.1", "dev", "gwb-eth1"],
        ["10.1.0.0/24", "via", "10.0.0.1", "dev", "gwb-eth1", "table", "100"],
        ["10.1.0.0/24", "via", "10.0.0.5", "dev", "gwb-eth2", "table", "101"],
    ]
    rules = [c[4:] for c in cmds["gwb"] if c[:3] == ["ip", "rule", "add"]]
    assert rules == [
        ["10.2.0.61/32", "lookup", "100", "priority", "1000"],
        ["10.2.0.62/32", "lookup", "101", "priority", "1000"],
        ["10.2.0.63/32", "lookup", "100", "priority", "1000"],
        ["10.2.0.90/32", "lookup", "101", "priority", "1000"],
    ]
    assert not [c for c in cmds["gwa"] if c[:2] == ["ip", "rule"]]


def test_two_lines_per_flow_is_a_multipath_route_hashed_on_ports():
    data = yaml.safe_load((TOPOLOGY_DIR / "two-lines.yaml").read_text())
    flow = copy.deepcopy(data)
    flow["route"] = "per-flow"
    topo = topology_from_dict(flow, "two-lines.yaml", TOPOLOGY_DIR / "two-lines.yaml")
    specs = host_specs(topo, {"md": 2})
    cmds = gateway_commands(topo, specs, line_specs(topo))
    assert line_of_host(topo, specs, line_specs(topo)) == {}
    assert _routes(cmds["gwa"]) == [
        ["10.2.0.0/24", "nexthop", "via", "10.0.0.2", "dev", "gwa-eth1", "weight", "1",
         "nexthop", "via", "10.0.0.6", "dev", "gwa-eth2", "weight", "1"],
    ]  # fmt: skip
    assert ["sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"] in cmds["gwb"]
    assert not [c for c in cmds["gwb"] if c[:2] == ["ip", "rule"]]


def test_paths_name_the_lines_each_host_is_reached_over():
    from topology.routes import host_paths, line_sides

    topo = load_topology("three-sites")
    specs, lines = host_specs(topo, {"md": 4}), line_specs(topo)
    paths = host_paths(topo, specs, lines)
    assert paths["a"]["md1"] == ["wanb"] and paths["a"]["md3"] == ["wanc"] and paths["a"]["p1"] == []
    assert paths["b"]["md4"] == ["wanb", "wanc"] and paths["c"]["client"] == ["wanc"]
    assert line_sides(topo, lines) == {"wanb": ["a", "c"], "wanc": ["a", "b"]}
    two = load_topology("two-lines")
    specs, lines = host_specs(two, {"md": 2}), line_specs(two)
    paths = host_paths(two, specs, lines)
    assert paths["a"]["md1"] == ["fast"] and paths["a"]["md2"] == ["cheap"] and paths["b"]["p1"] == ["fast"]
    assert line_sides(two, lines) == {"fast": ["a"], "cheap": ["a"]}
