"""A Mininet topology class (`mn --custom FILE --topo NAME,ARG,...`) as a topology, for the network alone
(`pddlab net --custom FILE --topo NAME`).

Responsible for: loading a custom file as `mn` does (FILE run as Python; its `topos` dict maps NAME to a
constructor returning a `mininet.topo.Topo`, called with ARG,... as split and made numeric by Mininet's own
`splitArgs`), and converting that Topo into a topology file's mapping (topology.topofile), which topofile
then validates like any file, so the Testbed builds it, both shaping backends shape it, and the net shell's
`link`, `swap PROFILE [LINE]` and `capture` work on it:

- each switch is a site named as the switch (`s1`: 1-4 of [a-z0-9], from a letter; gateway gws1, bridge
  pdd-ss1); its hosts are the site's named hosts (topofile's `named`), with the user's names (h1, h2);
- addresses: the k-th switch's subnet is 10.k.0.0/24 (k from 1, in Mininet's order; 10.k+1.0.0/24, ...
  where the user's addresses take it), its hosts numbered from .100 in Mininet's order (topofile.NAMED_FIRST; .1 is the
  gateway). Where every host of a switch has an `ip=` and they lie in one /24, that /24 is the site's and
  the user's addresses are kept (the prefix length given is not: a site is one /24 behind its gateway;
  .1 is refused). The lines' transit is 10.0.0.0/24, or the next /24 the user's addresses leave free;
- each switch-switch link is a line, named <site><site> (`s1s2`; the n-th link of a pair `s1s2l<n>`), its
  profile one netem line from the link's TCLink parameters (Mininet's semantics, and like TCLink the same
  in both directions): bw (Mbit/s) -> `rate`, delay and jitter (tc times, '10ms'; a bare number is µs as
  tc reads it) -> `delay`, loss (%) -> `loss`, max_queue_size (packets) -> `limit`. A link without them
  is an unshaped line (netem's default queue). A pair of switches joined by several links has several
  lines, per-destination (topology.routes); a chain s1-s2-s3 routes s1 to s3 through s2.
Refused, naming the node or link: a host-host link, a host on no switch or on two, a switch without hosts
(a transit switch: sites are where hosts are), one switch alone (no line to shape), a parameter not listed
here (a host's `ip`, a switch's `dpid` and a link's `cls` Link/TCLink are the ones taken; dpid and cls
change nothing on a Linux bridge with TCLink's semantics), a name topofile refuses (gw<site>, line names,
the `pdd` prefix, the roles' names), an unknown NAME, a FILE that does not import.
Not responsible for: the rules every topology obeys (topofile), building it (topology.net's Testbed).
"""

from __future__ import annotations

import ipaddress
import re
import runpy
from pathlib import Path
from typing import Any

from topology.netem_grammar import NetemSyntaxError, parse_netem
from topology.topofile import HOST_NAME, SITE_NAME, Topology, TopologyError, topology_from_dict

# What the conversion takes of each kind of node or link; anything else is refused by name.
HOST_PARAMS = ("ip",)
SWITCH_PARAMS = ("dpid",)
LINK_SHAPING = ("bw", "delay", "jitter", "loss", "max_queue_size")
_LINK_BOOKKEEPING = ("node1", "node2", "port1", "port2")  # Topo.addLink records these itself
_SITE_NAME, _HOST_NAME = re.compile(SITE_NAME), re.compile(HOST_NAME)


def load_custom(path: str | Path, topo_arg: str) -> Topology:
    """The topology of FILE's `topos[NAME]` built with topo_arg's ARGs (`NAME,ARG,...`, as mn's --topo)."""
    path = Path(path)
    source = f"{path} --topo {topo_arg}"
    topo = build_topo(path, topo_arg)
    name = topo_arg.split(",", 1)[0]
    try:
        data = topology_dict(topo, name, f"{path.name} {name}")
    except TopologyError as err:
        raise TopologyError(f"{source}: {err}") from None
    return topology_from_dict(data, source, path)


def build_topo(path: Path, topo_arg: str):
    """FILE run as mn runs a custom file, and its topos[NAME] called with the ARGs (Mininet's splitArgs)."""
    from mininet.topo import Topo
    from mininet.util import splitArgs

    if not path.is_file():
        raise TopologyError(f"{path}: no such file (--custom takes a Python file defining `topos`)")
    try:
        names = runpy.run_path(str(path))
    except (Exception, SystemExit) as err:
        raise TopologyError(f"{path}: failed to import: {type(err).__name__}: {err}") from None
    topos = names.get("topos")
    if not isinstance(topos, dict):
        raise TopologyError(f"{path}: defines no `topos` dict (mn's convention: topos = {{'name': constructor}})")
    name, args, kwargs = splitArgs(topo_arg)
    if name not in topos:
        raise TopologyError(f"{path}: no topo {name!r}; its topos: {', '.join(map(str, topos)) or 'none'}")
    try:
        topo = topos[name](*args, **kwargs)
    except Exception as err:
        raise TopologyError(f"{path}: topo {topo_arg!r} failed: {type(err).__name__}: {err}") from None
    if not isinstance(topo, Topo):
        raise TopologyError(f"{path}: topos[{name!r}] returned {type(topo).__name__}, not a mininet.topo.Topo")
    return topo


def topology_dict(topo, name: str, description: str = "") -> dict[str, Any]:
    """A Topo as a topology file's mapping (see the module docstring); refuses what it cannot hold."""
    switches = topo.switches()
    for s in switches:
        info = {k: v for k, v in topo.nodeInfo(s).items() if k != "isSwitch"}  # Topo.addSwitch's own mark
        _check_params(info, SWITCH_PARAMS, f"switch {s!r}")
        if not _SITE_NAME.match(s):
            raise TopologyError(
                f"switch {s!r}: a site's name is 1-4 of [a-z0-9], from a letter (its gateway gw<name>, its "
                "bridge pdd-s<name> must fit Linux's 15-character interface names); name it s1, s2, ..."
            )
    at, links = _host_switches(topo), [ln for ln in topo.links(sort=True, withInfo=True) if _both_switches(topo, ln)]
    hosts = {s: [h for h in topo.hosts() if at[h] == s] for s in switches}
    if empty := [s for s in switches if not hosts[s]]:
        raise TopologyError(f"switch(es) {empty}: no host; a switch without hosts (transit) is not taken")
    if not links:
        raise TopologyError(
            f"{len(switches)} switch(es), no switch-switch link: the testbed emulates lines between "
            "switches (sites); one LAN alone is Mininet's own `mn`"
        )
    subnets = _subnets(topo, hosts)
    return {
        "name": name,
        "description": description,
        "transit": str(_free_24(set(subnets.values()), ipaddress.ip_network("10.0.0.0/24"))),
        "sites": [
            {"name": s, "subnet": str(subnets[s]), "named": _named(topo, hosts[s], subnets[s])} for s in switches
        ],
        "lines": _lines(links),
    }


def _check_params(info: dict, allowed: tuple[str, ...], what: str) -> None:
    if unknown := sorted(set(info) - set(allowed)):
        raise TopologyError(f"{what}: parameter(s) {unknown} not taken; taken: {', '.join(allowed)}")


def _both_switches(topo, link) -> bool:
    return topo.isSwitch(link[0]) and topo.isSwitch(link[1])


def _host_switches(topo) -> dict[str, str]:
    """host -> its one switch; refuses a host-host link and a host on no switch or several."""
    on: dict[str, list[str]] = {h: [] for h in topo.hosts()}
    for a, b in topo.links(sort=True):
        if not topo.isSwitch(a) and not topo.isSwitch(b):
            raise TopologyError(f"link {a}-{b}: joins two hosts; a host has one link, to its switch")
        if a == b:
            raise TopologyError(f"link {a}-{b}: joins a switch to itself")
        for host, switch in ((a, b), (b, a)):
            if not topo.isSwitch(host):
                on[host].append(switch)
    for host, switches in on.items():
        _check_params(topo.nodeInfo(host), HOST_PARAMS, f"host {host!r}")
        if len(switches) != 1:
            where = f"on {len(switches)} links ({', '.join(switches)})" if switches else "on no switch"
            raise TopologyError(f"host {host!r}: {where}; a host has one link, to its switch")
        if not _HOST_NAME.match(host):
            raise TopologyError(
                f"host {host!r}: a host's name is 1-10 of [a-z0-9], from a letter (its interface <host>-eth0 "
                "fits Linux's 15 characters)"
            )
    return {h: s[0] for h, s in on.items()}


def _user_ip(topo, host: str) -> ipaddress.IPv4Interface | None:
    ip = topo.nodeInfo(host).get("ip")
    if ip is None:
        return None
    try:
        out = ipaddress.ip_interface(ip)
    except ValueError as err:
        raise TopologyError(f"host {host!r}: ip={ip!r}: {err}") from None
    if not isinstance(out, ipaddress.IPv4Interface):
        raise TopologyError(f"host {host!r}: ip={ip!r}: not IPv4")
    return out


def _subnets(topo, hosts: dict[str, list[str]]) -> dict[str, ipaddress.IPv4Network]:
    """switch -> its site's /24: the user's (every host of it has an ip= in one /24) or 10.k.0.0/24."""
    given: dict[str, ipaddress.IPv4Network] = {}
    for s, here in hosts.items():
        ips = {h: _user_ip(topo, h) for h in here}
        if all(ip is None for ip in ips.values()):
            continue
        if missing := [h for h, ip in ips.items() if ip is None]:
            raise TopologyError(f"switch {s!r}: host(s) {missing} have no ip= beside {sorted(set(ips) - set(missing))}")
        nets = {ipaddress.ip_network(f"{ip.ip}/24", strict=False) for ip in ips.values()}
        if len(nets) > 1:
            raise TopologyError(
                f"switch {s!r}: its hosts' ip= lie in {sorted(map(str, nets))}; a site is one /24 (give them one)"
            )
        given[s] = nets.pop()
    taken = set(given.values())
    out = {}
    for k, s in enumerate(hosts, start=1):
        out[s] = given.get(s) or _free_24(taken, ipaddress.ip_network(f"10.{k}.0.0/24"), 1 << 16)
        taken.add(out[s])
    return out


def _free_24(taken: set, first: ipaddress.IPv4Network, step: int = 256) -> ipaddress.IPv4Network:
    """first, or the first /24 after it, `step` addresses apart, that no site takes."""
    net = first
    while any(net.overlaps(t) for t in taken):
        net = ipaddress.ip_network(f"{net.network_address + step}/24")
    return net


def _named(topo, here: list[str], subnet: ipaddress.IPv4Network) -> dict[str, int] | list[str]:
    """A site's named hosts: names in order (numbered from NAMED_FIRST by topofile), or name -> the user's number."""
    ips = {h: _user_ip(topo, h) for h in here}
    if any(ip is None for ip in ips.values()):
        return list(here)
    numbers = {h: int(ip.ip) - int(subnet.network_address) for h, ip in ips.items()}
    if gw := [h for h, n in numbers.items() if n == 1]:
        raise TopologyError(
            f"host {gw[0]!r}: ip={str(ips[gw[0]].ip)!r} is .1 of {subnet}, the gateway's (sites are routed through "
            "one at .1); give the hosts .2 and up, or no ip= (then 10.k.0.100 and up)"
        )
    return numbers


def _lines(links: list[tuple[str, str, dict]]) -> list[dict[str, Any]]:
    """Each switch-switch link as a line; the links of a pair joined by several are per-destination."""
    count: dict[frozenset, int] = {}
    for a, b, _ in links:
        count[frozenset((a, b))] = count.get(frozenset((a, b)), 0) + 1
    seen: dict[frozenset, int] = {}
    out = []
    for a, b, info in links:
        pair = frozenset((a, b))
        seen[pair] = seen.get(pair, 0) + 1
        name = f"{a}{b}" + (f"l{seen[pair]}" if seen[pair] > 1 else "")
        line = f"link {a}-{b}" + (f" (#{seen[pair]})" if count[pair] > 1 else "")
        netem = netem_line(info, line)
        out.append(
            {
                "name": name,
                "sites": [a, b],
                "description": line,
                "profile": {"link": {"netem": netem}} if netem else {},
                **({"route": "per-destination"} if count[pair] > 1 else {}),
            }
        )
    return out


def netem_line(info: dict, what: str) -> str:
    """A link's TCLink parameters as one netem line ("" for none), both directions alike, as Mininet's TCLink
    (mininet.link.TCIntf) applies them; refuses the parameters it does not take, by name."""
    _check_link_class(info.get("cls"), what)
    params = {k: v for k, v in info.items() if k not in (*_LINK_BOOKKEEPING, "cls")}
    _check_params(params, LINK_SHAPING, what)
    delay, jitter, loss = params.get("delay"), params.get("jitter"), params.get("loss")
    bw, limit = params.get("bw"), params.get("max_queue_size")
    if jitter is not None and delay is None:
        raise TopologyError(f"{what}: jitter={jitter!r} without delay (netem's jitter varies a delay)")
    parts = []
    if delay is not None:
        parts += ["delay", _time(delay)] + ([_time(jitter)] if jitter is not None else [])
    if loss:  # Mininet sets loss only above 0
        parts += ["loss", f"{_number(loss, 'loss', what)}%"]
    if bw is not None:
        if isinstance(bw, (int, float)) and not isinstance(bw, bool) and bw <= 0:
            raise TopologyError(f"{what}: bw={bw!r}: expected Mbit/s > 0 (leave bw out for no rate limit)")
        parts += ["rate", f"{_number(bw, 'bw', what)}mbit"]
    if limit is not None:
        parts += ["limit", str(limit)]
    line = " ".join(parts)
    try:
        parse_netem(line)
    except NetemSyntaxError as err:
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise TopologyError(f"{what} ({shown}): netem {line!r}: {err}") from None
    return line


def _check_link_class(cls, what: str) -> None:
    if cls is None:
        return
    from mininet.link import Link, TCLink, TCULink

    if cls not in (Link, TCLink, TCULink):
        raise TopologyError(f"{what}: cls={getattr(cls, '__name__', cls)!r} not taken; taken: Link, TCLink, TCULink")


def _time(value: Any) -> str:
    # tc's get_time reads a bare number as microseconds; Mininet passes delay and jitter to tc as given
    return f"{value}us" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _number(value: Any, field: str, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TopologyError(f"{what}: {field}={value!r}: expected a number >= 0")
    return f"{value:g}"
