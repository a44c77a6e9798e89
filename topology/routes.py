"""How a topology's gateways address their interfaces and route between sites, as the commands they run.

Responsible for: from a validated topology (topology.topofile), its hosts and its lines, the `ip` and
`sysctl` commands each gateway runs: its LAN address, its lines' transit addresses, forwarding on, and a
route to every other site's subnet — over the one line of a site pair, or, where several lines join a
pair, by the pair's route choice:

- `per-destination`: each host of the pair's second site (the lines' `sites[1]`) is reached over one line,
  the pair's lines taken in turn in that site's host order (md1 over the first line, md2 over the
  second, ...), by a /32 route at the first site's gateway; what that host sends back across the pair
  takes the same line (a source rule at its own gateway, one routing table per line), so a TCP
  connection's data and its ACKs cross the same line. Hosts of sites beyond the pair, and the second
  site's gateway, take the pair's first line.
- `per-flow`: a multipath route over the pair's lines at both gateways, flows spread by a hash of their
  addresses and ports (fib_multipath_hash_policy=1). Each direction hashes on its own, so a flow's data
  and its ACKs may cross different lines.

A site no line joins to this one directly is reached through the neighbour on the fewest-lines path
(breadth first, ties to the site listed first): three-sites' B reaches C through A.
Also the readiness pairs (which address each gateway must reach (its lines' far ends, every other site's
gateway from its own LAN address, so that every route is exercised once before a run), and the topology's
record in a run's metadata (sites, lines, the lines each host is reached over, each line's sides).
Not responsible for: running the commands or building the links (topology.net's Testbed), the file's
format and its rules (topology.topofile).
"""

from __future__ import annotations

from collections import deque

from topology import naming
from topology.topofile import LineSpec, Site, Topology, gateway_ip

# Routing tables of the per-destination source rules: one per line (its index in the file) from here.
_TABLE_BASE = 100
_RULE_PRIORITY = 1000


def _neighbours(topo: Topology) -> dict[str, list[str]]:
    """site -> the sites one line away, in site order."""
    order = [s.name for s in topo.sites]
    out: dict[str, set[str]] = {name: set() for name in order}
    for line in topo.lines:
        a, b = line.sites
        out[a].add(b)
        out[b].add(a)
    return {name: sorted(near, key=order.index) for name, near in out.items()}


def next_hops(topo: Topology) -> dict[str, dict[str, str]]:
    """site -> {every other site: the neighbour its traffic goes to first} (fewest lines; ties to the site
    listed first)."""
    near = _neighbours(topo)
    out: dict[str, dict[str, str]] = {}
    for start in near:
        first: dict[str, str] = {}
        todo = deque((n, n) for n in near[start])
        seen = {start}
        while todo:
            here, via = todo.popleft()
            if here in seen:
                continue
            seen.add(here)
            first[here] = via
            todo.extend((n, via) for n in near[here] if n not in seen)
        out[start] = first
    return out


def pair_lines(lines: list[LineSpec], a: str, b: str) -> list[tuple[int, LineSpec]]:
    """The lines joining sites a and b, with their index in the file, in file order."""
    return [(i, ln) for i, ln in enumerate(lines) if {e.site for e in ln.ends} == {a, b}]


def _end(line: LineSpec, site: str):
    """(this site's end, the far end) of a line."""
    a, b = line.ends
    return (a, b) if a.site == site else (b, a)


def line_of_host(topo: Topology, specs: list[naming.HostSpec], lines: list[LineSpec]) -> dict[str, str]:
    """host -> the line it crosses its pair on, for the hosts of every per-destination pair's second site
    (the lines' sites[1]); hosts not listed take their route's first line."""
    out: dict[str, str] = {}
    done: set[frozenset] = set()
    for line in lines:
        pair = frozenset(e.site for e in line.ends)
        joined = pair_lines(lines, *pair)
        if pair in done or len(joined) < 2 or line.route != "per-destination":
            continue
        done.add(pair)
        second = line.ends[1].site
        here = [h for h in specs if h.cluster == second]
        for k, host in enumerate(here):
            out[host.name] = joined[k % len(joined)][1].name
    return out


def gateway_commands(topo: Topology, specs: list[naming.HostSpec], lines: list[LineSpec]) -> dict[str, list[list[str]]]:
    """gateway -> the commands (argv) it runs, in order, to address its interfaces and route to every other
    site (see the module docstring)."""
    hops = next_hops(topo)
    by_line = line_of_host(topo, specs, lines)
    out: dict[str, list[list[str]]] = {}
    for site in topo.sites:
        cmds = [
            ["ip", "addr", "add", f"{gateway_ip(site)}/{site.subnet.prefixlen}", "dev", f"{site.gateway}-eth0"],
            *(
                ["ip", "addr", "add", f"{mine.ip}/{ln.prefixlen}", "dev", mine.interface]
                for ln in lines
                for mine, _ in [_end(ln, site.name)]
                if mine.site == site.name
            ),
            ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
            # per-flow and per-destination routes are asymmetric by design at times: no reverse-path drop
            ["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"],
            ["sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0"],
        ]
        if any(ln.route == "per-flow" for ln in lines):
            cmds.append(["sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"])
        for dest in topo.sites:
            if dest.name != site.name:
                cmds += _routes_to(site, dest, hops[site.name][dest.name], specs, lines, by_line)
        cmds += _source_rules(site, topo, specs, lines, by_line, hops)
        out[site.gateway] = cmds
    return out


def _via(site: str, line: LineSpec) -> list[str]:
    mine, far = _end(line, site)
    return ["via", far.ip, "dev", mine.interface]


def _routes_to(
    site: Site, dest: Site, hop: str, specs: list[naming.HostSpec], lines: list[LineSpec], by_line: dict[str, str]
) -> list[list[str]]:
    joined = [ln for _, ln in pair_lines(lines, site.name, hop)]
    first = joined[0]
    if len(joined) > 1 and first.route == "per-flow":
        nexthops = [w for ln in joined for w in ["nexthop", *_via(site.name, ln), "weight", "1"]]
        return [["ip", "route", "add", str(dest.subnet), *nexthops]]
    cmds = [["ip", "route", "add", str(dest.subnet), *_via(site.name, first)]]
    if len(joined) > 1 and dest.name == hop:  # per-destination, the far site's own hosts: one line each
        named = {ln.name: ln for ln in joined}
        cmds += [
            ["ip", "route", "add", f"{h.ip}/32", *_via(site.name, named[by_line[h.name]])]
            for h in specs
            if h.cluster == dest.name and by_line.get(h.name, first.name) != first.name
        ]
    return cmds


def _source_rules(
    site: Site,
    topo: Topology,
    specs: list[naming.HostSpec],
    lines: list[LineSpec],
    by_line: dict[str, str],
    hops: dict[str, dict[str, str]],
) -> list[list[str]]:
    """At a per-destination pair's second site: each of its hosts sends across the pair on its own line (one
    table per line: a route to every site reached through the pair)."""
    index = {ln.name: i for i, ln in enumerate(lines)}
    mine = [h for h in specs if h.cluster == site.name and h.name in by_line]
    if not mine:
        return []
    cmds: list[list[str]] = []
    tables: set[str] = set()
    for h in mine:
        line = lines[index[by_line[h.name]]]
        table = str(_TABLE_BASE + index[line.name])
        if line.name not in tables:
            tables.add(line.name)
            far_site = _end(line, site.name)[1].site
            cmds += [
                ["ip", "route", "add", str(dest.subnet), *_via(site.name, line), "table", table]
                for dest in topo.sites
                if dest.name != site.name and hops[site.name][dest.name] == far_site
            ]
        cmds.append(["ip", "rule", "add", "from", f"{h.ip}/32", "lookup", table, "priority", str(_RULE_PRIORITY)])
    return cmds


def readiness_pairs(topo: Topology, lines: list[LineSpec]) -> list[tuple[str, list[str]]]:
    """(gateway, ping arguments after `ping`) each gateway must answer: its lines' far ends, and every other
    site's gateway from its own LAN address (exercises each route once, multi-hop ones included)."""
    out: list[tuple[str, list[str]]] = []
    for site in topo.sites:
        for ln in lines:
            mine, far = _end(ln, site.name)
            if mine.site == site.name:
                out.append((site.gateway, [far.ip]))
        for other in topo.sites:
            if other.name != site.name:
                out.append((site.gateway, ["-I", gateway_ip(site), gateway_ip(other)]))
    return out


def host_paths(topo: Topology, specs: list[naming.HostSpec], lines: list[LineSpec]) -> dict[str, dict[str, list[str]]]:
    """site -> {host: the lines its traffic to that host crosses, in order} (hosts of the site itself: []): the
    route choice of each pair on the way (per-destination: the host's own line where it stands in the pair's
    second site; per-flow: the pair's lines joined by '|', any of them; else the pair's only or first line).
    A host under a per-destination source rule sends across its pair on its own line whatever the path says."""
    hops = next_hops(topo)
    by_line = line_of_host(topo, specs, lines)
    out: dict[str, dict[str, list[str]]] = {}
    for start in topo.sites:
        paths: dict[str, list[str]] = {}
        for host in specs:
            here, crossed = start.name, []
            while here != host.cluster:
                hop = hops[here][host.cluster]
                joined = [ln for _, ln in pair_lines(lines, here, hop)]
                if len(joined) > 1 and joined[0].route == "per-flow":
                    crossed.append("|".join(ln.name for ln in joined))
                elif hop == host.cluster and host.name in by_line:
                    crossed.append(by_line[host.name])
                else:
                    crossed.append(joined[0].name)
                here = hop
            paths[host.name] = crossed
        out[start.name] = paths
    return out


def line_sides(topo: Topology, lines: list[LineSpec]) -> dict[str, list[str]]:
    """line -> the sites on its first end's side (those that reach the line's second site across it: the
    sites reached from its first site without crossing the pair it joins); a frame from one of them crosses
    the line forward (a_to_b)."""
    near = _neighbours(topo)
    out = {}
    for ln in lines:
        a, b = ln.ends[0].site, ln.ends[1].site
        seen, todo = set(), [a]
        while todo:
            here = todo.pop()
            if here in seen:
                continue
            seen.add(here)
            todo += [n for n in near[here] if {here, n} != {a, b} and n not in seen]
        out[ln.name] = [s.name for s in topo.sites if s.name in seen]
    return out


def record(topo: Topology, specs: list[naming.HostSpec], lines: list[LineSpec]) -> dict:
    """The topology as a run's metadata.json keeps it (topology.topology): name and file, sites, `paths` (site
    -> host -> the lines crossed, host_paths), `sides` (line -> the sites whose frames cross it forward,
    line_sides) and every line (ends, profile, route choice); what experiments.analysis.lines reads."""
    return {
        "name": topo.name,
        "path": str(topo.path) if topo.path else None,
        "sites": [
            {"name": s.name, "subnet": str(s.subnet), "gateway": s.gateway, "gateway_ip": gateway_ip(s)}
            for s in topo.sites
        ],
        "paths": host_paths(topo, specs, lines),
        "sides": line_sides(topo, lines),
        "lines": [
            {
                "name": ln.name,
                "ends": [vars(e) for e in ln.ends],
                "profile": ln.profile.to_dict(),
                "route": ln.route,
                "choose": ln.choose,
            }
            for ln in lines
        ],
    }
