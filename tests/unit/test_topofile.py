"""Topology files: the shipped ones load, two-clusters.yaml is naming's topology to the address, every rule
refuses with one line naming the file and the field, and `pddlab check-topology` prints and refuses the same."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from topology import naming
from topology.netem_grammar import parse_netem
from topology.profiles import ProfileError, load_profile
from topology.topofile import (
    DEFAULT_TOPOLOGY,
    TOPOLOGY_DIR,
    TopologyError,
    available_topologies,
    gateway_ip,
    host_specs,
    line_specs,
    load_topology,
    topology_from_dict,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["three-sites", "two-clusters", "two-lines"]


def test_every_shipped_file_loads():
    assert available_topologies() == SHIPPED and DEFAULT_TOPOLOGY == "two-clusters"
    for name in SHIPPED:
        topo = load_topology(name)
        assert topo.name == name and topo.path == TOPOLOGY_DIR / f"{name}.yaml"
        assert host_specs(topo) and line_specs(topo)


@pytest.mark.parametrize("n_p, n_rld, n_md", [(1, 1, 1), (2, 3, 4), (5, 1, 2), (19, 19, 19)])
@pytest.mark.parametrize("cross", [False, True])
def test_two_clusters_gives_namings_hosts_and_addresses(n_p, n_rld, n_md, cross):
    topo = load_topology("two-clusters")
    pools = {"p": n_p, "rld": n_rld, "md": n_md}
    assert host_specs(topo, pools, cross) == naming.hosts(n_p, n_rld, n_md, cross=cross)


def test_two_clusters_gives_namings_gateways_switches_and_wan_line():
    topo = load_topology("two-clusters")
    a, b = topo.sites
    assert (str(a.subnet), str(b.subnet)) == (naming.SUBNET_A, naming.SUBNET_B)
    assert (a.gateway, b.gateway, a.switch, b.switch) == (
        naming.GATEWAY_A,
        naming.GATEWAY_B,
        naming.SWITCH_A,
        naming.SWITCH_B,
    )
    assert (gateway_ip(a), gateway_ip(b)) == (naming.gateway_lan_ip("a"), naming.gateway_lan_ip("b"))
    (wan,) = line_specs(topo)
    assert (wan.ends[0].ip, wan.ends[1].ip, wan.prefixlen) == (naming.WAN_A_IP, naming.WAN_B_IP, naming.WAN_PREFIXLEN)
    assert wan.directions() == naming.wan_interfaces()
    assert wan.wire == naming.WIRE
    assert wan.profile.name == "wan-cross-country" and wan.route is None


def test_three_sites_splits_md_across_b_and_c_numbered_across_sites():
    topo = load_topology("three-sites")
    md = [(h.name, h.cluster, h.ip) for h in host_specs(topo, {"md": 4}) if h.role == "md"]
    assert md == [
        ("md1", "b", "10.2.0.61"),
        ("md2", "b", "10.2.0.62"),
        ("md3", "c", "10.3.0.63"),
        ("md4", "c", "10.3.0.64"),
    ]
    ab, ac = line_specs(topo)
    assert ab.directions() == {"a_to_b": ("gwa", "gwa-eth1"), "b_to_a": ("gwb", "gwb-eth1")}
    assert ac.directions() == {"a_to_c": ("gwa", "gwa-eth2"), "c_to_a": ("gwc", "gwc-eth1")}
    assert (ac.ends[0].ip, ac.ends[1].ip) == ("10.0.0.5", "10.0.0.6")
    with pytest.raises(TopologyError, match=r"pools.md=3: topology 'three-sites' places 4 md workers \(b: 2, c: 2\)"):
        host_specs(topo, {"md": 3})


def test_two_lines_joins_a_and_b_twice_the_router_choosing_by_measurement():
    fast, cheap = line_specs(load_topology("two-lines"))
    assert [e.site for e in fast.ends] == [e.site for e in cheap.ends] == ["a", "b"]
    assert (fast.ends[0].interface, cheap.ends[0].interface) == ("gwa-eth1", "gwa-eth2")
    assert {(ln.route, ln.choose) for ln in (fast, cheap)} == {("per-destination", "measured")}
    assert fast.profile.a_to_b.rate_mbit == 1000 > cheap.profile.a_to_b.rate_mbit


def base() -> dict:
    """A valid topology (two-clusters' shape) each refusal breaks in one place."""
    return {
        "name": "t",
        "sites": [
            {"name": "a", "subnet": "10.1.0.0/24", "hosts": ["client", "router"], "pools": {"p": "all", "rld": "all"}},
            {"name": "b", "subnet": "10.2.0.0/24", "pools": {"md": "all"}, "cross_host": "xb"},
        ],
        "lines": [{"name": "wan", "sites": ["a", "b"], "profile": "wan-regional"}],
    }


def second_line(t, **fields):
    t["lines"].append({"name": "cheap", "sites": ["a", "b"], "profile": "wan-cross-country", **fields})


def third_site(t, **fields):
    t["sites"].append({"name": "c", "subnet": "10.3.0.0/24", **fields})


REFUSALS = {
    "unknown key": (lambda t: t["sites"][0].update(bogus=1), "sites[0]: unknown key(s) ['bogus']"),
    "site name shape": (lambda t: t["sites"][0].update(name="Alpha"), "sites[0].name"),
    "site names unique": (lambda t: t["sites"][1].update(name="a"), "sites[1].name='a': already the name of sites[0]"),
    "line names unique": (lambda t: second_line(t, name="wan"), "lines[1].name='wan': already the name of lines[0]"),
    "host names unique": (
        lambda t: t["lines"][0].update(name="xb"),
        "lines[0].name='xb': already the name of sites[1]",
    ),
    "derived names kept": (lambda t: t["lines"][0].update(name="md1"), "lines[0].name='md1': a name the topology"),
    "subnet valid": (lambda t: t["sites"][0].update(subnet="10.1.0.300/24"), "sites[0].subnet='10.1.0.300/24'"),
    "subnet host bits": (lambda t: t["sites"][0].update(subnet="10.1.0.5/24"), "sites[0].subnet='10.1.0.5/24'"),
    "subnet ipv4": (
        lambda t: t["sites"][0].update(subnet="fd00::/64"),
        "sites[0].subnet='fd00::/64': expected an IPv4",
    ),
    "subnet holds hosts": (
        lambda t: t["sites"][1].update(subnet="10.2.0.0/26"),
        "sites[1].subnet='10.2.0.0/26': too small",
    ),
    "subnets apart": (
        lambda t: t["sites"][1].update(subnet="10.1.0.0/16"),
        "sites[1].subnet='10.1.0.0/16' overlaps sites[0].subnet='10.1.0.0/24'",
    ),
    "transit apart": (lambda t: t.update(transit="10.1.0.0/28"), "transit='10.1.0.0/28' overlaps sites[0].subnet"),
    "transit holds lines": (
        lambda t: (t.update(transit="10.0.0.0/30"), second_line(t, route="per-flow")),
        "transit='10.0.0.0/30' holds 1 /30 line(s); 2 lines need a larger one",
    ),
    "line sites exist": (lambda t: t["lines"][0].update(sites=["a", "c"]), "lines[0].sites: no site 'c'"),
    "line joins two sites": (lambda t: t["lines"][0].update(sites=["a", "a"]), "lines[0].sites: ['a', 'a'] joins"),
    "sites reached": (lambda t: third_site(t), "sites ['c']: no line reaches them from site 'a'"),
    "several lines need a route": (lambda t: second_line(t), "lines[0].route: required: 2 lines join a-b"),
    "route shared": (
        lambda t: (t.update(route="per-flow"), second_line(t, route="per-destination")),
        "lines[1].route/choose='per-destination'/'': differs from lines[0]",
    ),
    "route values": (lambda t: t.update(route="random"), "route='random'; allowed: ['per-destination', 'per-flow']"),
    "choice needs lines": (lambda t: t["lines"][0].update(choose="measured"), "lines[0].choose='measured': the only"),
    "profile or directions": (
        lambda t: t["lines"][0].update(forward="wan-regional"),
        "lines[0]: give `profile` (both directions) or `forward` and `reverse`",
    ),
    "both directions": (
        lambda t: (t["lines"][0].pop("profile"), t["lines"][0].update(forward="lan")),
        "lines[0].reverse: required",
    ),
    "profile known": (lambda t: t["lines"][0].update(profile="nope"), "lines[0].profile: unknown profile 'nope'"),
    "profile inline valid": (
        lambda t: t["lines"][0].update(profile={"link": {"delay_ms": -1}}),
        "lines[0].profile: link.delay_ms=-1 out of range",
    ),
    "direction inline valid": (
        lambda t: (t["lines"][0].pop("profile"), t["lines"][0].update(forward="lan", reverse={"netem": "dely 5ms"})),
        "lines[0].reverse.netem 'dely 5ms'",
    ),
    "direction has no schedule": (
        lambda t: (t["lines"][0].pop("profile"), t["lines"][0].update(forward="wan-flaky", reverse="lan")),
        "lines[0].forward='wan-flaky': has a schedule",
    ),
    "client placed once": (
        lambda t: t["sites"][1].update(hosts=["client"]),
        "client: placed in sites[0].hosts, sites[1]",
    ),
    "router placed": (lambda t: t["sites"][0].update(hosts=["client"]), "router: placed in no site"),
    "pool placed": (lambda t: t["sites"][1].update(pools={}), "pools.md: placed in no site"),
    "pool all in one site": (
        lambda t: (third_site(t, pools={"md": 2}), second_line(t, sites=["a", "c"])),
        "sites[1].pools.md='all': also placed in sites[2]",
    ),
    "pool names": (lambda t: t["sites"][0]["pools"].update(mx=1), "sites[0].pools: unknown pool(s) ['mx']"),
    "pool count in range": (
        lambda t: t["sites"][1].update(pools={"md": 20}),
        "sites[1].pools.md=20 out of range [1, 19]",
    ),
    "pool count form": (
        lambda t: t["sites"][1].update(pools={"md": "many"}),
        "sites[1].pools.md='many': expected 'all'",
    ),
    "a line at least": (
        lambda t: (t["sites"].pop(), t["sites"][0]["pools"].update(md="all"), t.update(lines=[])),
        "lines: none; a topology has at least one line",
    ),
    "named hosts named": (lambda t: t["sites"][0].update(named=["h_1"]), "sites[0].named: 'h_1': a host's name"),
    "named hosts once": (
        lambda t: t["sites"][0].update(named=["h1", "h1"]),
        "sites[0].named: ['h1', 'h1'] names a host twice",
    ),
    "named host numbers": (
        lambda t: t["sites"][1].update(named={"h1": 255}),
        "sites[1].named.h1=255: host number out of range [2, 254]",
    ),
    "named numbers apart": (
        lambda t: t["sites"][1].update(named={"h1": 120, "h2": 120}),
        "sites[1].named: {'h1': 120, 'h2': 120} gives two hosts one number",
    ),
    "named above the roles": (
        lambda t: t["sites"][0].update(named={"h1": 12}),
        "sites[0].named: ['h1'] take numbers naming gives the roles (up to 90)",
    ),
    "named not derived": (lambda t: t["sites"][0].update(named=["gwz"]), "sites[0].named.gwz='gwz': a name the"),
    "named not a line": (lambda t: t["sites"][0].update(named=["wan"]), "lines[0].name='wan': already the name of"),
    "prefix kept": (lambda t: t["sites"][0].update(named=["pdd1"]), "'pdd1': starts with the testbed's prefix"),
    "split within MAX_PER_ROLE": (
        lambda t: (
            t["sites"][1].update(pools={"md": 10}),
            third_site(t, pools={"md": 10}),
            second_line(t, sites=["a", "c"]),
        ),
        "pools.md: 20 workers across sites, more than naming.MAX_PER_ROLE (19)",
    ),
}


@pytest.mark.parametrize("rule", REFUSALS)
def test_each_rule_refuses_with_one_line_naming_the_field(rule):
    mutate, needle = REFUSALS[rule]
    data = copy.deepcopy(base())
    topology_from_dict(copy.deepcopy(data), "t.yaml")  # the base passes: the one change below is what fails
    mutate(data)
    with pytest.raises(TopologyError) as err:
        topology_from_dict(data, "t.yaml")
    message = str(err.value)
    assert message.startswith("t.yaml: ") and needle in message, message
    assert "\n" not in message


def test_a_file_is_named_as_its_file_and_read_as_yaml(tmp_path):
    (tmp_path / "mine.yaml").write_text((TOPOLOGY_DIR / "two-clusters.yaml").read_text())
    with pytest.raises(TopologyError, match=r"mine.yaml: name 'two-clusters' must equal the file name 'mine'"):
        load_topology(tmp_path / "mine.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(TopologyError, match=r"bad.yaml: not valid YAML: .*\(line 2, column 1\)$"):
        load_topology(tmp_path / "bad.yaml")
    with pytest.raises(
        TopologyError, match=r"unknown topology 'nope'; available: three-sites, two-clusters, two-lines"
    ):
        load_topology("nope")


def test_a_profiles_yaml_problem_reads_in_one_line_too(tmp_path):
    # profiles and topologies share one registry reader (topology.registry); PyYAML's message spans lines
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "bad.yaml")
    assert str(err.value).endswith("not valid YAML: expected ',' or ']', but got '<stream end>' (line 2, column 1)")


def pddlab(*argv: str) -> subprocess.CompletedProcess:
    """The real command line, as a user runs it (no root needed: it builds nothing)."""
    cmd = [sys.executable, "-m", "experiments.cli", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_check_topology_prints_sites_hosts_and_each_lines_netem_lines():
    out = pddlab("check-topology", "experiments/topologies/three-sites.yaml", "--pools", "p=2")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "three-sites.yaml: ok (three-sites: 3 site(s), 2 line(s))" in text
    assert "p2       10.1.0.22" in text and "md3      10.3.0.63" in text
    assert "line wanc a-c: gwa-eth2 10.0.0.5 - gwc-eth1 10.0.0.6 (/30)" in text
    netem = {ln.split(":")[0].strip(): ln.split("netem ", 1)[1] for ln in text.splitlines() if "netem " in ln}
    assert set(netem) == {"a_to_b", "b_to_a", "a_to_c", "c_to_a"}
    for line in netem.values():
        parse_netem(line)  # what it prints is a netem line the grammar reads back


def test_check_topology_refuses_a_bad_file_with_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((TOPOLOGY_DIR / "two-clusters.yaml").read_text().replace("name: two-clusters", "name: bad"))
    bad.write_text(bad.read_text().replace("subnet: 10.2.0.0/24", "subnet: 10.1.0.0/16"))
    out = pddlab("check-topology", str(bad))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"pddlab: error: {bad}: sites[1].subnet='10.1.0.0/16' overlaps sites[0].subnet='10.1.0.0/24'"
    ]


def test_a_line_may_give_each_direction_its_own_profile_or_fields():
    data = base()
    data["lines"][0] = {
        "name": "wan",
        "sites": ["a", "b"],
        "forward": "wan-regional",
        "reverse": {"netem": "delay 20ms rate 50mbit"},
    }
    (wan,) = line_specs(topology_from_dict(data, "t.yaml"))
    forward, reverse = wan.direction_params().values()
    assert forward == load_profile("wan-regional").a_to_b
    assert (reverse.delay_ms, reverse.rate_mbit) == (20, 50)


def test_named_hosts_stand_beside_the_roles_and_alone_make_a_network_without_roles():
    t = base()
    t["sites"][1]["named"] = ["h1", "h2"]
    topo = topology_from_dict(t, "t.yaml")
    assert topo.serves and [(h.name, h.ip, h.role) for h in host_specs(topo) if h.role == "host"] == [
        ("h1", "10.2.0.100", "host"),
        ("h2", "10.2.0.101", "host"),
    ]
    alone = {
        "name": "lan2",
        "sites": [
            {"name": "s1", "subnet": "10.1.0.0/24", "named": {"h1": 5, "h2": 6}},
            {"name": "s2", "subnet": "10.2.0.0/24", "named": ["h3"]},
        ],
        "lines": [{"name": "s1s2", "sites": ["s1", "s2"], "profile": {}}],
    }
    topo = topology_from_dict(alone, "lan2.yaml")
    assert not topo.serves and [(h.name, h.ip) for h in host_specs(topo, cross=True)] == [
        ("h1", "10.1.0.5"),
        ("h2", "10.1.0.6"),
        ("h3", "10.2.0.100"),
    ]
    assert topo.lines[0].profile.a_to_b.netem_line() == "limit 1000"  # an unshaped line: netem's default queue
    alone["sites"][0]["named"] = alone["sites"][1]["named"] = []
    with pytest.raises(TopologyError, match="client: placed in no site"):  # no role and no host: not a network
        topology_from_dict(alone, "lan2.yaml")
