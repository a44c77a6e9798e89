"""Per line of a topology file's network: the bytes each line delivered and the KV transfers that crossed it,
per variant (a run on the default two-cluster network has one line, `wan`, which the WAN figures already hold).

Responsible for: reading each line's two captures (`pcap/<line>-<site>.pcap`, topology.net), telling a
frame's direction on that line by its source (a host, gateway or transit address of the sites on the line's
first side: forward), counting the wire bytes the line delivered per direction in each variant's window (as
experiments.analysis.pcap.delivered does for the one WAN: forward seen at the second end, after the
shaper), and grouping the variant's WAN KV transfers (experiments.analysis.transfers) by the line their
target's host is reached over from their sender's site (metadata.json's topology.paths): count, KV bytes,
transfer time p50/p90 with their 95% intervals (experiments.analysis.metrics.stats); and the router's line
per request (its route events' `line`, by the MD pick's reason: line, explore, cap, ...).
Not responsible for: building the lines or their routes (topology.net, topology.routes), the WAN figures of
the default topology (experiments.analysis.analyze), rendering (experiments.analysis.summary_md).
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections import Counter
from pathlib import Path

from experiments.analysis import pcap
from experiments.analysis.metrics import stats
from experiments.analysis.transfers import WAN_PATHS, pair_transfers
from experiments.spec.deployment import role_of

log = logging.getLogger(__name__)


def _packed(ip: str) -> bytes:
    return ipaddress.IPv4Address(ip).packed


def first_side(topo: dict, hosts: list[dict], line: dict) -> frozenset[bytes]:
    """The packed addresses whose frames cross `line` forward: every host and gateway of the sites on its
    first side, and those sites' ends of every line (their transit addresses)."""
    sites = set(topo["sides"][line["name"]])
    out = {_packed(h["ip"]) for h in hosts if h["cluster"] in sites}
    out |= {_packed(s["gateway_ip"]) for s in topo["sites"] if s["name"] in sites}
    out |= {_packed(e["ip"]) for ln in topo["lines"] for e in ln["ends"] if e["site"] in sites}
    return frozenset(out)


def line_frames(pcap_dir: Path, topo: dict, hosts: list[dict], line: dict) -> list[pcap.Frame]:
    """What the line delivered, both directions (a_to_b: from its first side, seen at its second end);
    [] without both captures."""
    a, b = (pcap_dir / f"{line['name']}-{end['site']}.pcap" for end in line["ends"])
    if not (a.exists() and b.exists()):
        return []
    side = first_side(topo, hosts, line)
    try:
        return pcap.delivered(pcap.read_frames(a, side), pcap.read_frames(b, side))
    except pcap.PcapError as err:
        log.warning("%s", err)
        return []


def _target_host(target: str | None, by_ip: dict[str, str]) -> str | None:
    return by_ip.get(target.rsplit(":", 1)[0]) if target else None


def kv_by_line(events: list[dict], topo: dict, hosts: list[dict]) -> dict[str, dict]:
    """line (or lines joined by '+' for a path of several) -> the WAN KV transfers across it: count, ok, KV
    bytes delivered, transfer time stats (ms)."""
    site_of = {h["name"]: h["cluster"] for h in hosts}
    by_ip = {h["ip"]: h["name"] for h in hosts}
    grouped: dict[str, list] = {}
    for t in pair_transfers(events):
        host = _target_host(t.target, by_ip)
        if t.path not in WAN_PATHS or host is None or t.sender not in site_of:
            continue
        crossed = topo["paths"][site_of[t.sender]].get(host) or []
        grouped.setdefault("+".join(crossed) or "(none)", []).append(t)
    out = {}
    for name, ts in sorted(grouped.items()):
        times = [t.time_ms if t.outcome == "ok" else math.inf for t in ts if t.time_ms is not None]
        out[name] = {
            "transfers": len(ts),
            "ok": sum(t.outcome == "ok" for t in ts),
            "kv_bytes": sum(t.kv_bytes for t in ts),
            "by_target": _count(_target_host(t.target, by_ip) for t in ts),
            "time_ms": stats(times),
        }
    return out


def _count(names) -> dict[str, int]:
    return dict(sorted(Counter(names).items(), key=lambda kv: (role_of(kv[0]), kv[0])))


def choices(events: list[dict]) -> dict[str, dict[str, int]]:
    """The router's per-request line choice: line -> {the MD pick's reason (line, explore, cap, cache, ...):
    requests} over the route events that name a line (pick_md line_measured, or MDs behind lines)."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("event") == "route" and e.get("line"):
            reason = ((e.get("picks") or {}).get("md") or {}).get("reason") or "only"
            row = out.setdefault(e["line"], {})
            row[reason] = row.get(reason, 0) + 1
    return dict(sorted(out.items()))


def per_line(run_dir: Path, topo: dict | None, hosts: list[dict], windows: dict, events: list[dict]) -> dict:
    """variant -> {"bytes": {line: {direction name: wire bytes delivered in its window}}, "kv": kv_by_line,
    "routed": choices};
    {} for a run without a topology record (older runs) or with one line (the default network's WAN: the WAN
    figures hold it)."""
    if not topo or not topo.get("paths") or len(topo["lines"]) < 2:  # one line: the WAN figures hold it
        return {}
    frames = {ln["name"]: line_frames(run_dir / "pcap", topo, hosts, ln) for ln in topo["lines"]}
    names = {
        ln["name"]: [
            f"{ln['ends'][0]['site']}_to_{ln['ends'][1]['site']}",
            f"{ln['ends'][1]['site']}_to_{ln['ends'][0]['site']}",
        ]
        for ln in topo["lines"]
    }
    out = {}
    for v, w in windows.items():
        if w.wall_start is None:
            continue
        end = w.wall_end if w.wall_end is not None else float("inf")
        got = {}
        for line, fs in frames.items():
            counted = pcap.bytes_between(fs, w.wall_start, end)
            got[line] = {names[line][0]: counted.get("a_to_b", 0), names[line][1]: counted.get("b_to_a", 0)}
        mine = [e for e in events if e.get("variant") == v]
        out[v] = {"bytes": got, "kv": kv_by_line(mine, topo, hosts), "routed": choices(mine)}
    return out


def markdown(lines: dict) -> list[str]:
    """summary.md's "Lines" section: per variant, each line's delivered bytes and its KV transfers."""
    if not lines:
        return []
    out = [
        "## Lines",
        "",
        "Each line of the topology file: wire bytes it delivered per direction in the variant's window (its "
        "captures), and the WAN KV transfers whose target is reached over it (transfer time p50 / p90, ms, "
        "with 95% intervals).",
        "",
        "| variant | line | bytes (each direction) | KV transfers (ok) | KV MB | p50 ms | p90 ms | targets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, got in lines.items():
        kv = got.get("kv", {})
        for line in sorted(set(got.get("bytes", {})) | set(kv)):
            b = got.get("bytes", {}).get(line)
            k = kv.get(line, {})
            t = k.get("time_ms", {})
            shown = ", ".join(f"{d} {n / 1e6:,.1f} MB" for d, n in b.items()) if b else "–"
            targets = ", ".join(f"{h} {n}" for h, n in k.get("by_target", {}).items())
            out.append(
                f"| {v} | {line} | {shown} | {k.get('transfers', 0)} ({k.get('ok', 0)}) | "
                f"{k.get('kv_bytes', 0) / 1e6:,.1f} | {_p(t, 'p50')} | {_p(t, 'p90')} | {targets or '–'} |"
            )
    routed = {v: got["routed"] for v, got in lines.items() if got.get("routed")}
    if routed:
        out += ["", "The router's line per request (route events; by the MD pick's reason):", ""]
        out += [
            f"- {v}: "
            + "; ".join(
                f"{ln} {sum(r.values())} ({', '.join(f'{k} {n}' for k, n in r.items())})" for ln, r in rs.items()
            )
            for v, rs in routed.items()
        ]
    return out + [""]


def _p(t: dict, key: str) -> str:
    value = t.get(key)
    if value is None:
        return "–"
    ci = (t.get("ci95") or {}).get(key)
    return f"{value:,.0f} [{ci[0]:,.0f}, {ci[1]:,.0f}]" if ci else f"{value:,.0f}"
