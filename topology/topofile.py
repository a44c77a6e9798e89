"""Topology files: sites, the hosts and pools each holds, and the lines between them, as data.

Responsible for: the topology file's format (below), reading one by registry name
(`experiments/topologies/<name>.yaml`) or path, validating it once (names, subnets,
lines, route choices, the roles' placement, addresses), and two pure functions that
derive from a typed `Topology` what the network is made of: `host_specs` (every end
host: name, site, address, role; naming.HostSpec) and `line_specs` (every line: its
gateways' interfaces and transit addresses, its profile, its route choice).
Not responsible for: building the network (topology.net's Testbed, which still builds
the two-cluster topology of topology.naming in code), shaping a line
(topology.shaping), the profiles' own format (topology.profiles).

Format (`two-clusters.yaml` is today's topology written so):

    name: two-clusters               # must equal the file name without .yaml
    description: one line
    transit: 10.0.0.0/24             # the lines' point-to-point /30s, one per line in order (default)
    route: per-destination           # default route choice of every line (optional)
    choose: measured                 # default line choice of the router (optional)
    sites:
      - name: a                      # 1-4 of [a-z0-9]: gateway gw<name>, switch pdd-s<name>
        subnet: 10.1.0.0/24          # IPv4, /25 or larger (host numbers go up to 90)
        hosts: [client, router]      # the singletons placed here
        pools: {p: all, rld: all}    # a deployment pool: all its workers here, or a count here
        cross_host: xa               # the cross-traffic end host (made only with cross traffic)
        named: [h1, h2]              # hosts with no role, by name (the network shell's: `pddlab net`)
    lines:
      - name: wan                    # 1-10 of [a-z0-9]: the userspace backend's wire host
        sites: [a, b]                # forward is a -> b (direction a_to_b), reverse b -> a
        profile: wan-cross-country   # both directions: a shipped name, a path, or a profile inline
        # or, one direction each: forward: / reverse: a profile name (its a_to_b / b_to_a
        # direction) or LinkParams fields inline ({rate_mbit: 100} or {netem: "delay 5ms"})
        route: per-flow              # this line's route choice (overrides the file's)
        choose: measured             # this line's line choice (overrides the file's)

Placement: `client` and `router` stand in exactly one site's `hosts`; each pool (p, rld,
md: the spec's `pools`) is either `all` in exactly one site, or a count in each site
that holds part of it (md: 2 in b and 2 in c: md1, md2 in b, md3, md4 in c). Workers
are numbered across sites in site order; a host's address is its site's subnet plus
naming's host number for its role and index (md3 in 10.3.0.0/24: 10.3.0.63).

Named hosts: `named` lists hosts that play no role, by the name a user types (h1, h2), numbered from
.100 in the order given (10.1.0.100, 10.1.0.101, ...), or `{h1: 5, h2: 7}` for their host numbers (2 and
up: 1 is the gateway's; above 90 in a site that also holds roles, whose numbers are naming's).
A topology whose sites place no role and no pool (only named hosts) is a network alone: `pddlab net`
opens it (a Mininet topology class becomes one, topology.customtopo), an experiment refuses it.

Route choices, for a site pair joined by several lines (each line of the pair must
then have one, the same): `per-destination` reaches each host of the far site over
one line, the pair's lines taken in turn in host order; `per-flow` spreads flows over
the pair's lines by a hash of each flow's addresses and ports (a multipath route).
`choose: measured` is what the router will use: it picks, per request, the line a KV
transfer takes by what each line measures (its estimated rate and RTT, as
`policy.wan_estimate: measured` does for the one WAN line), the route carrying the rest.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import StringConstraints

from schema import Str, build, literal_values, schema
from topology import naming, registry
from topology.profiles import LinkParams, Profile, ProfileError, direction_from_dict, load_profile, profile_from_dict

TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "experiments" / "topologies"
DEFAULT_TOPOLOGY = "two-clusters"
Route = Literal["per-destination", "per-flow"]
Choose = Literal["", "measured"]
ROUTES = literal_values(Route)
SINGLETONS = ("client", "router")
POOLS = ("p", "rld", "md")  # the deployment's pools (experiments.spec.deployment.ROLES less the router)
ALL = "all"  # a pool wholly in one site: as many workers as the spec's pool has
# A site name makes gw<site>-eth<n> and pdd-s<site>-eth<n>: Linux interface names hold 15 characters.
SITE_NAME = r"^[a-z][a-z0-9]{0,3}$"
SiteName = Annotated[Str, StringConstraints(pattern=SITE_NAME)]
# A line name is the userspace wire's host name (<line>-eth1), as a cross host's name is a host's.
HOST_NAME = r"^[a-z][a-z0-9]{0,9}$"
HostName = Annotated[Str, StringConstraints(pattern=HOST_NAME)]
# Names the topology derives itself; a line or cross host named so would clash with one.
_DERIVED_NAME = re.compile(r"^(client|router|(p|rld|md)[0-9]+|gw[a-z0-9]*)$")
# The highest host number naming gives inside a subnet (the cross host), and the transit's per-line prefix.
_TOP_HOST = naming.host_number(naming.CROSS_HOSTS["a"])
_LINE_PREFIXLEN = 30
# Named hosts' first host number: above every number naming gives a role, so they share a site with roles.
NAMED_FIRST = 100
NAMED_ROLE = "host"  # the role a named host's HostSpec carries


class TopologyError(ValueError):
    """A topology file or value is invalid; the message names the file, the field and what is wrong."""


@schema
class _SiteFile:
    name: SiteName
    subnet: Str
    hosts: tuple[Literal["client", "router"], ...] = ()
    pools: dict[Str, Any] = dataclasses.field(default_factory=dict)
    cross_host: HostName | Literal[""] = ""
    named: Any = ()


@schema
class _LineFile:
    name: HostName
    sites: tuple[SiteName, SiteName]
    description: Str = ""
    profile: Any = None
    forward: Any = None
    reverse: Any = None
    route: Route | None = None
    choose: Choose | None = None


@schema
class _TopologyFile:
    name: Str
    sites: tuple[_SiteFile, ...]
    lines: tuple[_LineFile, ...]
    description: Str = ""
    transit: Str = "10.0.0.0/24"
    route: Route | None = None
    choose: Choose = ""


@dataclasses.dataclass(frozen=True)
class Site:
    """A site: its subnet and what it holds.

    pools: pool -> workers here (None: all of the spec's pool)
    cross_host: its cross-traffic host's name ("" = none)
    named: named host -> its host number in the subnet (hosts with no role, in the file's order)
    """

    name: str
    subnet: ipaddress.IPv4Network
    hosts: tuple[str, ...]
    pools: dict[str, int | None]
    cross_host: str
    named: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def gateway(self) -> str:
        """The site's gateway host (gwa for site a, as naming.GATEWAY_A)."""
        return f"gw{self.name}"

    @property
    def switch(self) -> str:
        """The site's switch, a bridge in the root namespace (pdd-sa for site a, as naming.SWITCH_A)."""
        return f"{naming.PREFIX}-s{self.name}"

    def address(self, number: int) -> str:
        """The address of host number `number` inside the site's subnet."""
        return str(self.subnet.network_address + number)


@dataclasses.dataclass(frozen=True)
class Line:
    """A line between two sites; profile.a_to_b is forward (sites[0] -> sites[1]), b_to_a reverse."""

    name: str
    sites: tuple[str, str]
    profile: Profile
    description: str = ""
    route: str | None = None  # None: the only line of its site pair
    choose: str = ""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A validated topology file."""

    name: str
    description: str
    sites: tuple[Site, ...]
    lines: tuple[Line, ...]
    transit: ipaddress.IPv4Network
    path: Path | None = None

    def site(self, name: str) -> Site:
        """The site of that name."""
        return next(s for s in self.sites if s.name == name)

    @property
    def serves(self) -> bool:
        """Whether it places the deployment's roles (else it is a network alone, of named hosts)."""
        return any(s.hosts or s.pools for s in self.sites)


@dataclasses.dataclass(frozen=True)
class LineEnd:
    """One end of a line: the site's gateway, its interface on the line, its transit address."""

    site: str
    gateway: str
    interface: str
    ip: str


@dataclasses.dataclass(frozen=True)
class LineSpec:
    """A line as the network builds it: ends[0] is forward's sender; its profile's a_to_b is forward."""

    name: str
    ends: tuple[LineEnd, LineEnd]
    prefixlen: int
    profile: Profile
    route: str | None
    choose: str

    @property
    def wire(self) -> str:
        """The userspace backend's wire host of the line (naming.WIRE for the one WAN line)."""
        return self.name

    def directions(self) -> dict[str, tuple[str, str]]:
        """direction (a_to_b, b_to_a) -> (host, interface) whose egress the tc backend shapes, as
        naming.wan_interfaces()."""
        a, b = self.ends
        return {f"{a.site}_to_{b.site}": (a.gateway, a.interface), f"{b.site}_to_{a.site}": (b.gateway, b.interface)}

    def direction_params(self) -> dict[str, LinkParams]:
        """direction -> the LinkParams it runs (forward first)."""
        return dict(zip(self.directions(), (self.profile.a_to_b, self.profile.b_to_a)))


# ---------------------------------------------------------------- loading


def available_topologies(directory: Path = TOPOLOGY_DIR) -> list[str]:
    """Names of the shipped topology files."""
    return registry.names(directory)


def load_topology(name_or_path: str | Path, directory: Path = TOPOLOGY_DIR) -> Topology:
    """Load a topology by registry name or by path to a YAML file."""
    return registry.load(name_or_path, directory, "topology", TopologyError, topology_from_dict)


def topology_from_dict(data: Any, source: str, path: Path | None = None) -> Topology:
    """Validate a whole topology mapping; `source` (a file name) prefixes every error; profiles named by path
    are relative to the file's folder."""
    try:
        return _topology(data, path)
    except TopologyError as err:
        raise TopologyError(f"{source}: {err}") from None


def _topology(data: Any, path: Path | None) -> Topology:
    f = build(_TopologyFile, data, "", TopologyError)
    folder = path.resolve().parent if path else Path.cwd()
    transit = _network(f.transit, "transit")
    sites = tuple(_site(s, f"sites[{i}]") for i, s in enumerate(f.sites))
    lines = tuple(_line(ln, f, folder, f"lines[{i}]") for i, ln in enumerate(f.lines))
    topo = Topology(f.name, f.description, sites, lines, transit, path)
    for check in (_check_names, _check_subnets, _check_lines, _check_routes, _check_placement, _check_some_line):
        check(topo)
    return topo


def _network(text: str, where: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(text)
    except ValueError as err:
        raise TopologyError(f"{where}={text!r}: {err}; expected an IPv4 network (10.1.0.0/24)") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise TopologyError(f"{where}={text!r}: expected an IPv4 network (10.1.0.0/24)")
    return net


def _site(f: _SiteFile, where: str) -> Site:
    subnet = _network(f.subnet, f"{where}.subnet")
    if subnet.num_addresses - 2 < _TOP_HOST:
        raise TopologyError(
            f"{where}.subnet={f.subnet!r}: too small for naming's host numbers (up to {_TOP_HOST}, the cross host); "
            f"allowed: /{32 - (_TOP_HOST + 1).bit_length()} or larger"
        )
    if len(set(f.hosts)) != len(f.hosts):
        raise TopologyError(f"{where}.hosts: {list(f.hosts)} names a host twice")
    named = _named(f.named, subnet, f"{where}.named")
    if (f.hosts or f.pools or f.cross_host) and (low := [h for h, n in named.items() if n <= _TOP_HOST]):
        raise TopologyError(
            f"{where}.named: {low} take numbers naming gives the roles (up to {_TOP_HOST}) in a site with "
            f"roles; from {_TOP_HOST + 1} on"
        )
    return Site(f.name, subnet, f.hosts, _pools(f.pools, f"{where}.pools"), f.cross_host, named)


def _named(value: Any, subnet: ipaddress.IPv4Network, where: str) -> dict[str, int]:
    """A site's named hosts: a list of names (numbered from NAMED_FIRST) or a mapping name -> host number."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(set(value)):
            raise TopologyError(f"{where}: {list(value)} names a host twice")
        value = {name: NAMED_FIRST + k for k, name in enumerate(value)}
    if not isinstance(value, dict):
        raise TopologyError(f"{where}={value!r}: expected a list of host names or a mapping name -> host number")
    out = dict(value)
    top = subnet.num_addresses - 2  # the last host number before the broadcast address
    for name, number in out.items():
        if not isinstance(name, str) or not re.match(HOST_NAME, name):
            raise TopologyError(f"{where}: {name!r}: a host's name is 1-10 of [a-z0-9], from a letter")
        if not isinstance(number, int) or isinstance(number, bool) or not 2 <= number <= top:  # 1: the gateway
            raise TopologyError(f"{where}.{name}={number}: host number out of range [2, {top}] in {subnet}")
    if len(set(out.values())) != len(out):
        raise TopologyError(f"{where}: {out} gives two hosts one number")
    return out


def _pools(data: dict[str, Any], where: str) -> dict[str, int | None]:
    unknown = sorted(set(data) - set(POOLS))
    if unknown:
        raise TopologyError(f"{where}: unknown pool(s) {unknown}; allowed: {list(POOLS)}")
    out: dict[str, int | None] = {}
    for pool, value in data.items():
        if value == ALL:
            out[pool] = None
        elif isinstance(value, int) and not isinstance(value, bool):
            if not 1 <= value <= naming.MAX_PER_ROLE:
                raise TopologyError(f"{where}.{pool}={value!r} out of range [1, {naming.MAX_PER_ROLE}]")
            out[pool] = value
        else:
            raise TopologyError(f"{where}.{pool}={value!r}: expected {ALL!r} or a count of workers")
    return out


def _line(f: _LineFile, top: _TopologyFile, folder: Path, where: str) -> Line:
    route = f.route or top.route
    choose = top.choose if f.choose is None else f.choose
    return Line(f.name, f.sites, _line_profile(f, folder, where), f.description, route, choose)


def _line_profile(f: _LineFile, folder: Path, where: str) -> Profile:
    """The line's profile: `profile` (both directions), or `forward` and `reverse` (one each)."""
    if (f.profile is None) == (f.forward is None and f.reverse is None):
        raise TopologyError(f"{where}: give `profile` (both directions) or `forward` and `reverse`, one form")
    try:
        if f.profile is not None:
            return _profile(f.profile, f.name, folder, f"{where}.profile")
        if f.forward is None or f.reverse is None:
            raise TopologyError(f"{where}.{'reverse' if f.reverse is None else 'forward'}: required beside the other")
        forward = _direction(f.forward, "a_to_b", folder, f"{where}.forward")
        reverse = _direction(f.reverse, "b_to_a", folder, f"{where}.reverse")
    except ProfileError as err:
        raise TopologyError(str(err)) from None
    return Profile(f.name, f.description, forward, reverse, path=None)


def _profile(value: Any, line: str, folder: Path, where: str) -> Profile:
    if isinstance(value, str):
        return _named_profile(value, folder, where)
    if isinstance(value, dict):
        # inline: files it names (rate_trace, .dist tables) are relative to the topology file's folder
        inline = profile_from_dict({"name": line, **value}, where, folder / f"{line}.yaml")
        return dataclasses.replace(inline, path=None)
    raise TopologyError(f"{where}: expected a profile name, a path or a profile mapping, got {value!r}")


def _named_profile(value: str, folder: Path, where: str) -> Profile:
    by_path = Path(value).suffix in (".yaml", ".yml")
    try:
        return load_profile(folder / value if by_path else value)
    except ProfileError as err:
        raise TopologyError(f"{where}: {err}") from None


def _direction(value: Any, direction: str, folder: Path, where: str) -> LinkParams:
    """One direction: a profile's (its `direction`; it may hold no schedule), or LinkParams fields inline."""
    if isinstance(value, str):
        profile = _named_profile(value, folder, where)
        if profile.schedule:
            raise TopologyError(f"{where}={value!r}: has a schedule; give it as the line's `profile`")
        return profile.direction(direction)
    return direction_from_dict(value, where, folder)


# ---------------------------------------------------------------- the rules across fields


def _check_names(topo: Topology) -> None:
    seen: dict[str, str] = {}
    named = [(f"sites[{i}].name", s.name, False) for i, s in enumerate(topo.sites)]
    named += [(f"sites[{i}].cross_host", s.cross_host, True) for i, s in enumerate(topo.sites) if s.cross_host]
    named += [(f"sites[{i}].named.{h}", h, True) for i, s in enumerate(topo.sites) for h in s.named]
    named += [(f"lines[{i}].name", ln.name, True) for i, ln in enumerate(topo.lines)]
    for field, name, is_host in named:
        key = ("host:" if is_host else "site:") + name
        if key in seen:
            raise TopologyError(f"{field}={name!r}: already the name of {seen[key]}")
        if is_host and name.startswith(naming.PREFIX):
            raise TopologyError(f"{field}={name!r}: starts with the testbed's prefix {naming.PREFIX!r} (its links)")
        if is_host and _DERIVED_NAME.match(name):
            raise TopologyError(
                f"{field}={name!r}: a name the topology gives its own hosts (client, router, p<i>, "
                "rld<i>, md<i>, gw<site>)"
            )
        seen[key] = field


def _check_subnets(topo: Topology) -> None:
    nets = [(f"sites[{i}].subnet", s.subnet) for i, s in enumerate(topo.sites)] + [("transit", topo.transit)]
    for i, (field, net) in enumerate(nets):
        for other, net2 in nets[:i]:
            if net.overlaps(net2):
                raise TopologyError(f"{field}={str(net)!r} overlaps {other}={str(net2)!r}")
    room = 2 ** max(0, _LINE_PREFIXLEN - topo.transit.prefixlen)
    if len(topo.lines) > room:
        raise TopologyError(
            f"transit={str(topo.transit)!r} holds {room} /{_LINE_PREFIXLEN} line(s); "
            f"{len(topo.lines)} lines need a larger one"
        )


def _check_lines(topo: Topology) -> None:
    names = [s.name for s in topo.sites]
    for i, ln in enumerate(topo.lines):
        for end in ln.sites:
            if end not in names:
                raise TopologyError(f"lines[{i}].sites: no site {end!r}; sites: {names}")
        if ln.sites[0] == ln.sites[1]:
            raise TopologyError(f"lines[{i}].sites: {list(ln.sites)} joins a site to itself")
    reached, todo = set(), [names[0]] if names else []
    while todo:
        here = todo.pop()
        reached.add(here)
        todo += [s for ln in topo.lines if here in ln.sites for s in ln.sites if s not in reached]
    if lost := [n for n in names if n not in reached]:
        raise TopologyError(f"sites {lost}: no line reaches them from site {names[0]!r}")


def _check_some_line(topo: Topology) -> None:
    if not topo.lines:  # the Testbed's backend and the shell's profile are its first line's
        raise TopologyError(
            "lines: none; a topology has at least one line between two sites (the testbed shapes lines)"
        )


def _pairs(topo: Topology) -> dict[frozenset, list[int]]:
    """site pair -> the indexes of the lines joining it."""
    out: dict[frozenset, list[int]] = {}
    for i, ln in enumerate(topo.lines):
        out.setdefault(frozenset(ln.sites), []).append(i)
    return out


def _check_routes(topo: Topology) -> None:
    for pair, idx in _pairs(topo).items():
        first = topo.lines[idx[0]]
        both = "-".join(first.sites)
        if len(idx) == 1:
            if first.choose:
                raise TopologyError(
                    f"lines[{idx[0]}].choose={first.choose!r}: the only line between {both}; "
                    "a choice needs several lines"
                )
            continue
        for i in idx:
            ln = topo.lines[i]
            if ln.route is None:
                raise TopologyError(
                    f"lines[{i}].route: required: {len(idx)} lines join {both}; allowed: {list(ROUTES)} "
                    "(on the line or the file)"
                )
            if (ln.route, ln.choose) != (first.route, first.choose):
                raise TopologyError(
                    f"lines[{i}].route/choose={ln.route!r}/{ln.choose!r}: differs from lines[{idx[0]}]"
                    f"'s {first.route!r}/{first.choose!r}; the lines between {both} share one"
                )


def _check_placement(topo: Topology) -> None:
    if not topo.serves and any(s.named for s in topo.sites):
        return  # a network alone (named hosts only): no roles to place
    for role in SINGLETONS:
        at = [f"sites[{i}].hosts" for i, s in enumerate(topo.sites) if role in s.hosts]
        if len(at) != 1:
            where = f"in {', '.join(at)}" if at else "in no site"
            raise TopologyError(f"{role}: placed {where}; it stands in exactly one site's hosts")
    for pool in POOLS:
        at = [(i, s.pools[pool]) for i, s in enumerate(topo.sites) if pool in s.pools]
        if not at:
            raise TopologyError(f"pools.{pool}: placed in no site; every pool of the deployment is placed")
        whole = [i for i, n in at if n is None]
        if whole and len(at) > 1:
            others = ", ".join(f"sites[{i}]" for i, _ in at if i != whole[0])
            raise TopologyError(
                f"sites[{whole[0]}].pools.{pool}={ALL!r}: also placed in {others}; "
                f"{ALL!r} places the whole pool in one site (or give a count in each)"
            )
        if not whole and (total := sum(n for _, n in at)) > naming.MAX_PER_ROLE:
            raise TopologyError(
                f"pools.{pool}: {total} workers across sites, more than naming.MAX_PER_ROLE ({naming.MAX_PER_ROLE})"
            )


# ---------------------------------------------------------------- what the network is made of


def pool_sites(topo: Topology, pools: dict[str, int] | None = None) -> dict[str, list[tuple[str, int]]]:
    """pool -> [(site, workers there)] in site order; pools: the deployment's workers per pool (1 each by
    default; a pool split by counts in the file has the file's, and must agree where given)."""
    asked = pools or {}
    out: dict[str, list[tuple[str, int]]] = {}
    if not topo.serves:
        return out
    for pool in POOLS:
        at = [(s.name, s.pools[pool]) for s in topo.sites if pool in s.pools]
        if at[0][1] is None:
            n = asked.get(pool, 1)
            if not 1 <= n <= naming.MAX_PER_ROLE:
                raise TopologyError(f"pools.{pool}={n!r} out of range [1, {naming.MAX_PER_ROLE}]")
            out[pool] = [(at[0][0], n)]
            continue
        total = sum(n for _, n in at)
        if pool in asked and asked[pool] != total:
            split = ", ".join(f"{site}: {n}" for site, n in at)
            raise TopologyError(
                f"pools.{pool}={asked[pool]}: topology {topo.name!r} places {total} {pool} workers ({split})"
            )
        out[pool] = [(site, n) for site, n in at]
    return out


def host_specs(topo: Topology, pools: dict[str, int] | None = None, cross: bool = False) -> list[naming.HostSpec]:
    """Every end host (gateways and wires excluded) in naming.hosts()'s order: client, router, the pools'
    workers numbered across sites, the named hosts in site order, then (cross) each site's cross host."""
    specs = []
    for role in SINGLETONS if topo.serves else ():
        site = next(s for s in topo.sites if role in s.hosts)
        specs.append(naming.HostSpec(role, site.name, site.address(naming.host_number(role)), role))
    for pool, placed in pool_sites(topo, pools).items():
        index = 0
        for site_name, n in placed:
            site = topo.site(site_name)
            for index in range(index + 1, index + n + 1):
                name = naming.host_name(pool, index)
                specs.append(naming.HostSpec(name, site.name, site.address(naming.host_number(pool, index)), pool))
    specs += [naming.HostSpec(h, s.name, s.address(n), NAMED_ROLE) for s in topo.sites for h, n in s.named.items()]
    if cross:
        specs += [
            naming.HostSpec(s.cross_host, s.name, s.address(_TOP_HOST), naming.CROSS_ROLE)
            for s in topo.sites
            if s.cross_host
        ]
    return specs


def gateway_ip(site: Site) -> str:
    """The gateway's address inside its site's subnet (naming's number for gwa)."""
    return site.address(naming.host_number(naming.GATEWAY_A))


def line_specs(topo: Topology) -> list[LineSpec]:
    """Every line in file order: line k takes the transit's k-th /30 (ends .1 and .2 in it); each gateway's
    eth0 faces its site's switch, eth1, eth2, ... its lines in file order."""
    transits = topo.transit.subnets(new_prefix=_LINE_PREFIXLEN)
    next_port = {s.name: 1 for s in topo.sites}
    out = []
    for line, net in zip(topo.lines, transits):
        ends = []
        for k, site_name in enumerate(line.sites):
            site = topo.site(site_name)
            ends.append(LineEnd(site.name, site.gateway, f"{site.gateway}-eth{next_port[site.name]}", str(net[k + 1])))
            next_port[site.name] += 1
        out.append(LineSpec(line.name, (ends[0], ends[1]), _LINE_PREFIXLEN, line.profile, line.route, line.choose))
    return out
