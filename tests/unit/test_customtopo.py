"""A Mininet topology class as a topology (topology.customtopo): Topo classes written here convert into the
typed Topology the Testbed builds (sites, named hosts, addresses, lines and their netem lines, routes), and
every case the conversion does not take is refused with one line naming the node or link. No root: nothing
is built; Mininet's Topo is only a graph."""

import re
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mininet.topo", reason="Mininet's Python library (make setup installs Debian's mininet)")

from mininet.link import TCLink  # noqa: E402
from mininet.node import CPULimitedHost  # noqa: E402
from mininet.topo import Topo  # noqa: E402

from topology import routes  # noqa: E402
from topology.customtopo import load_custom, netem_line, topology_dict  # noqa: E402
from topology.profiles import LinkParams  # noqa: E402
from topology.topofile import Topology, TopologyError, host_specs, line_specs, topology_from_dict  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two-switches.py"


class Graph(Topo):
    """A Topo from a list of links ((a, b, params)); s<n> and switch<n> are switches, other names hosts."""

    def build(self, links=(), host_params=None, switch_params=None):
        for a, b, params in links:
            for n in (a, b):
                if n not in self.g.node:
                    if re.match(r"^s(witch)?\d+$", n):
                        self.addSwitch(n, **(switch_params or {}).get(n, {}))
                    else:
                        self.addHost(n, **(host_params or {}).get(n, {}))
            self.addLink(a, b, **params)


def convert(topo: Topo, name: str = "mine") -> Topology:
    return topology_from_dict(topology_dict(topo, name), name)


def two_switches(link: dict, **kw) -> Graph:
    return Graph(
        links=[("h1", "s1", {}), ("h2", "s1", {}), ("h3", "s2", {}), ("h4", "s2", {}), ("s1", "s2", link)], **kw
    )


def test_two_switches_with_tclink_params_give_two_sites_and_one_shaped_line():
    link = {"bw": 10, "delay": "10ms", "jitter": "2ms", "loss": 1, "max_queue_size": 100, "cls": TCLink}
    topo = convert(two_switches(link))
    assert [(s.name, str(s.subnet), s.named) for s in topo.sites] == [
        ("s1", "10.1.0.0/24", {"h1": 100, "h2": 101}),
        ("s2", "10.2.0.0/24", {"h3": 100, "h4": 101}),
    ]
    assert not topo.serves and str(topo.transit) == "10.0.0.0/24"
    assert [(h.name, h.cluster, h.ip, h.role) for h in host_specs(topo)] == [
        ("h1", "s1", "10.1.0.100", "host"),
        ("h2", "s1", "10.1.0.101", "host"),
        ("h3", "s2", "10.2.0.100", "host"),
        ("h4", "s2", "10.2.0.101", "host"),
    ]
    (line,) = line_specs(topo)
    assert line.name == "s1s2" and [(e.gateway, e.interface, e.ip) for e in line.ends] == [
        ("gws1", "gws1-eth1", "10.0.0.1"),
        ("gws2", "gws2-eth1", "10.0.0.2"),
    ]
    want = LinkParams(rate_mbit=10, delay_ms=10, jitter_ms=2, loss_pct=1, limit_pkts=100)
    assert line.profile.a_to_b == want and line.profile.b_to_a == want and line.route is None
    assert netem_line(link, "link s1-s2") == "delay 10ms 2ms loss 1% rate 10mbit limit 100"


def test_a_link_without_params_is_an_unshaped_line():
    # a dpid changes nothing on a Linux bridge: taken, not used
    (line,) = line_specs(convert(two_switches({}, switch_params={"s1": {"dpid": "0000000000000001"}})))
    assert line.profile.a_to_b == LinkParams() == line.profile.b_to_a


def test_mininet_time_and_loss_semantics():
    # Mininet hands delay to tc as given: a bare number is tc's microseconds; loss is a percentage
    assert netem_line({"delay": 500, "loss": 0.5}, "l") == "delay 500us loss 0.5%"
    assert netem_line({"loss": 0}, "l") == ""  # Mininet sets loss only above 0
    assert netem_line({"node1": "s1", "node2": "s2", "port1": 2, "port2": 2}, "l") == ""


def test_a_chain_routes_the_far_switch_through_the_middle_one():
    chain = Graph(links=[("h1", "s1", {}), ("h2", "s2", {}), ("h3", "s3", {}), ("s1", "s2", {}), ("s2", "s3", {})])
    topo = convert(chain)
    lines = line_specs(topo)
    assert [ln.name for ln in lines] == ["s1s2", "s2s3"]
    assert routes.next_hops(topo)["s1"]["s3"] == "s2" and routes.next_hops(topo)["s3"]["s1"] == "s2"
    via_s2 = lines[0].ends[1].ip  # gws2's end of s1s2
    assert ["ip", "route", "add", "10.3.0.0/24", "via", via_s2, "dev", "gws1-eth1"] in (
        routes.gateway_commands(topo, host_specs(topo), lines)["gws1"]
    )
    assert routes.host_paths(topo, host_specs(topo), lines)["s1"]["h3"] == ["s1s2", "s2s3"]


def test_several_links_between_two_switches_are_several_per_destination_lines():
    both = [("s1", "s2", {"delay": "5ms"}), ("s1", "s2", {})]
    topo = convert(Graph(links=[("h1", "s1", {}), ("h3", "s2", {}), ("h4", "s2", {}), *both]))
    lines = line_specs(topo)
    assert [(ln.name, ln.route, ln.profile.a_to_b.delay_ms) for ln in lines] == [
        ("s1s2", "per-destination", 5),
        ("s1s2l2", "per-destination", 0),
    ]
    assert routes.line_of_host(topo, host_specs(topo), lines) == {"h3": "s1s2", "h4": "s1s2l2"}


def test_the_users_addresses_are_kept_where_a_switch_has_one_24():
    hosts = {"h1": {"ip": "10.0.0.2/8"}, "h2": {"ip": "10.0.0.3/8"}}
    topo = convert(two_switches({}, host_params=hosts | {"h3": {"ip": "10.1.0.7"}, "h4": {"ip": "10.1.0.9/24"}}))
    assert [(str(s.subnet), s.named) for s in topo.sites] == [
        ("10.0.0.0/24", {"h1": 2, "h2": 3}),
        ("10.1.0.0/24", {"h3": 7, "h4": 9}),
    ]
    assert [h.ip for h in host_specs(topo)] == ["10.0.0.2", "10.0.0.3", "10.1.0.7", "10.1.0.9"]
    assert str(topo.transit) == "10.0.1.0/24"  # the lines' transit moves off the users' /24s
    with pytest.raises(TopologyError, match=r"host 'h1': ip='10.5.0.1' is \.1 of 10.5.0.0/24, the gateway's"):
        convert(two_switches({}, host_params={"h1": {"ip": "10.5.0.1"}, "h2": {"ip": "10.5.0.2"}}))


def test_a_default_subnet_skips_a_24_the_user_took():
    hosts = {"h3": {"ip": "10.1.0.5"}, "h4": {"ip": "10.1.0.6"}}
    topo = convert(two_switches({}, host_params=hosts))
    assert [str(s.subnet) for s in topo.sites] == ["10.2.0.0/24", "10.1.0.0/24"]
    assert str(topo.transit) == "10.0.0.0/24"


@pytest.mark.parametrize(
    "topo, says",
    [
        (Graph(links=[("h1", "s1", {}), ("h2", "s1", {})]), "1 switch(es), no switch-switch link"),
        (Graph(links=[("h1", "h2", {}), ("h1", "s1", {})]), "link h1-h2: joins two hosts"),
        (
            Graph(links=[("h1", "s1", {}), ("h1", "s2", {}), ("h2", "s2", {}), ("s1", "s2", {})]),
            "host 'h1': on 2 links",
        ),
        (Graph(links=[("h1", "s1", {}), ("s1", "s2", {}), ("s2", "s3", {}), ("h3", "s3", {})]), "['s2']: no host"),
        (two_switches({"use_htb": True}), "link s1-s2: parameter(s) ['use_htb'] not taken"),
        (
            two_switches({}, host_params={"h2": {"cls": CPULimitedHost, "cpu": 0.5}}),
            "host 'h2': parameter(s) ['cls', 'cpu']",
        ),
        (
            two_switches({}, switch_params={"s1": {"protocols": "OpenFlow13"}}),
            "switch 's1': parameter(s) ['protocols'] not taken; taken: dpid",
        ),
        (two_switches({"jitter": "2ms"}), "link s1-s2: jitter='2ms' without delay"),
        (two_switches({"delay": "10 parsecs"}), "link s1-s2 (delay='10 parsecs'): netem"),
        (two_switches({"bw": 0}), "link s1-s2: bw=0: expected Mbit/s > 0"),
        (two_switches({}, host_params={"h1": {"ip": "10.9.0.1"}}), "switch 's1': host(s) ['h2'] have no ip="),
        (
            two_switches({}, host_params={"h1": {"ip": "10.9.0.5"}, "h2": {"ip": "10.9.1.5"}}),
            "switch 's1': its hosts' ip= lie in ['10.9.0.0/24', '10.9.1.0/24']",
        ),
    ],
)
def test_what_the_conversion_does_not_take_is_refused_by_name(topo, says):
    with pytest.raises(TopologyError) as err:
        convert(topo)
    assert says in str(err.value), err.value


def test_a_host_without_a_switch_is_refused():
    topo = two_switches({})
    topo.addHost("h9")
    with pytest.raises(TopologyError, match="host 'h9': on no switch"):
        convert(topo)


@pytest.mark.parametrize(
    "names, says",
    [
        ({"s1": "switch1"}, "switch 'switch1': a site's name is 1-4 of [a-z0-9]"),
        ({"h1": "gws1"}, "named.gws1='gws1': a name the topology gives its own hosts"),
        ({"h1": "s1s2"}, "lines[0].name='s1s2': already the name of sites[0].named.s1s2"),
        ({"h1": "pddh1"}, "'pddh1': starts with the testbed's prefix 'pdd'"),
        ({"h1": "md1"}, "named.md1='md1': a name the topology gives its own hosts"),
        ({"h1": "host_1"}, "host 'host_1': a host's name is 1-10 of [a-z0-9]"),
    ],
)
def test_names_that_clash_with_the_testbeds_are_refused(names, says):
    base = [("h1", "s1", {}), ("h2", "s1", {}), ("h3", "s2", {}), ("s1", "s2", {})]
    links = [(names.get(a, a), names.get(b, b), p) for a, b, p in base]
    with pytest.raises(TopologyError) as err:
        convert(Graph(links=links))
    assert says in str(err.value), err.value


# ---- the file, as mn reads it --------------------------------------------------------------------------------
def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent(body))
    return path


CHAIN = """
    from mininet.topo import Topo

    class Chain(Topo):
        def build(self, n=2, delay="5ms"):
            last = None
            for i in range(1, n + 1):
                s = self.addSwitch(f"s{i}")
                self.addLink(self.addHost(f"h{i}"), s)
                if last:
                    self.addLink(last, s, delay=delay)
                last = s

    topos = {"chain": Chain, "pair": lambda: Chain(2)}
"""


def test_the_file_is_read_as_mn_reads_it_with_numeric_args(tmp_path):
    path = write(tmp_path, CHAIN)
    topo = load_custom(path, "chain,4,delay=7ms")
    assert topo.name == "chain" and [s.name for s in topo.sites] == ["s1", "s2", "s3", "s4"]
    assert [ln.profile.a_to_b.delay_ms for ln in topo.lines] == [7, 7, 7] and topo.path == path
    assert [s.name for s in load_custom(path, "pair").sites] == ["s1", "s2"]


def test_the_example_converts():
    topo = load_custom(EXAMPLE, "twoswitches")
    assert [h.name for h in host_specs(topo)] == ["h1", "h2", "h3", "h4"]
    assert topo.lines[0].profile.a_to_b == LinkParams(delay_ms=20)


@pytest.mark.parametrize(
    "body, arg, says",
    [
        (CHAIN, "ring", "no topo 'ring'; its topos: chain, pair"),
        ("import nosuchmodule\n", "x", "failed to import: ModuleNotFoundError: No module named 'nosuchmodule'"),
        ("def f(:\n", "x", "failed to import: SyntaxError"),
        ("x = 1\n", "x", "defines no `topos` dict"),
        ("topos = {'x': lambda: 42}\n", "x", "topos['x'] returned int, not a mininet.topo.Topo"),
        (CHAIN, "chain,1", "1 switch(es), no switch-switch link"),
        (CHAIN, "chain,2,nope=1", "topo 'chain,2,nope=1' failed: TypeError"),
    ],
)
def test_a_bad_file_or_name_is_refused_saying_why(tmp_path, body, arg, says):
    path = write(tmp_path, body)
    with pytest.raises(TopologyError) as err:
        load_custom(path, arg)
    assert says in str(err.value) and str(path) in str(err.value), err.value


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(TopologyError, match="no such file"):
        load_custom(tmp_path / "nowhere.py", "x")
