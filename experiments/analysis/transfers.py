"""KV transfers on each data-plane path, and what TCP did during them, per variant (pure functions over events).

Responsible for: pairing each kv_send_start with its end event (kv_send_end,
kv_send_failed or kv_send_cancelled_end, by request_id and path, in order);
per path (fast, wan, handoff): transfer times, outcomes, retries,
retransmitted segments per MB, the kv_tcp_info samples (median RTT and
cwnd), congestion control requested against used and a warning wherever they
differ or the kernel refused one; and the WAN bytes three ways.
Not responsible for: reading files (experiments.analysis.records), the pcap
(experiments.analysis.flows), rendering (experiments.analysis.summary_md, plots).

WAN bytes, three ways (the WAN paths are `wan`, P->MD, and `handoff`, RLD->MD
in the `kv` handoff mode):

    on the wire  what the pcap saw cross A->B in the variant's window
                 (`on_wire_pcap`: all traffic, headers, ACK-less retransmissions
                 included; `on_wire_kv_pcap`: the KV flows alone, from flows.json);
    delivered    kv_bytes of completed transfers (kv_send_end): KV the receiver took;
    wasted       wire_bytes of failed and cancelled transfers, plus wire_bytes -
                 kv_bytes of completed transfers that needed more than one attempt
                 (what the earlier attempts sent). The framing of a first-try
                 transfer is not waste, and TCP's own retransmissions are counted
                 apart (`bytes_retrans`): they are below wire_bytes, which the
                 sender's writes measure.
    resumed      (beside them) KV bytes a retry did not resend because the
                 receiver already held them.

Every transfer of the variant's events counts, warm-up requests included, as
in the pcap's window.

Fields missing from older runs read as None (unknown) in figures and 0 in
sums; an old run without the new events analyses without error.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from statistics import median

from experiments.analysis.metrics import percentile, stats

PATHS = ("fast", "wan", "handoff")
WAN_PATHS = ("wan", "handoff")
END_EVENTS = {"kv_send_end": "ok", "kv_send_failed": "failed", "kv_send_cancelled_end": "cancelled"}
MB = 1e6


@dataclass
class Transfer:
    """One KV transfer (all its attempts): start to end event, as the sender logged it."""

    request_id: str
    path: str
    outcome: str  # ok | failed | cancelled | unfinished (no end event)
    t_start_ns: int | None
    t_end_ns: int | None
    duration_ns: int | None  # the end event's own duration (used when the start is missing)
    kv_bytes: int = 0  # delivered KV (0 unless ok)
    wire_bytes: int = 0  # every byte every attempt wrote, headers included
    attempts: int = 1
    resumed_kv_bytes: int = 0
    retrans_segs: int | None = None  # None: not reported (older runs) and no kv_tcp_info to derive it from
    bytes_retrans: int | None = None
    congestion_requested: str | None = None
    congestion_used: list[str] = field(default_factory=list)
    sender: str | None = None  # the worker that sent it (p1, or an RLD's KV handoff)
    target: str | None = None  # host:port of the receiver's KV data plane (kv_send_start; None: not logged)

    @property
    def time_ms(self) -> float | None:
        if self.t_start_ns is not None and self.t_end_ns is not None:
            return (self.t_end_ns - self.t_start_ns) / 1e6
        return self.duration_ns / 1e6 if self.duration_ns is not None else None

    @property
    def wasted_bytes(self) -> int:
        """See the module docstring: all of a failed or cancelled transfer, earlier attempts of a retried one."""
        if self.outcome in ("failed", "cancelled"):
            return self.wire_bytes
        if self.outcome == "ok" and self.attempts > 1:
            return max(0, self.wire_bytes - self.kv_bytes)
        return 0


def _from_end(start: dict | None, end: dict) -> Transfer:
    used = end.get("congestion_used")
    return Transfer(
        request_id=end.get("request_id"),
        path=end.get("path"),
        outcome=END_EVENTS[end["event"]],
        t_start_ns=start["t_ns"] if start else None,
        t_end_ns=end["t_ns"],
        duration_ns=end.get("duration_ns"),
        kv_bytes=end.get("kv_bytes") or 0,
        wire_bytes=end.get("wire_bytes") or 0,
        attempts=end.get("attempts") or 1,
        resumed_kv_bytes=end.get("resumed_kv_bytes") or 0,
        retrans_segs=end.get("retrans_segs"),
        bytes_retrans=end.get("bytes_retrans"),
        congestion_requested=end.get("congestion_requested") or (start or {}).get("congestion"),
        congestion_used=list(used) if isinstance(used, list) else ([used] if used else []),
        sender=end.get("worker"),
        target=(start or {}).get("target"),
    )


def pair_transfers(events: list[dict]) -> list[Transfer]:
    """Every transfer of the events (ordered by t_ns): the n-th start of a (request, path) ends with its n-th end."""
    open_: dict[tuple, deque] = defaultdict(deque)
    out = []
    for e in events:
        key = (e.get("request_id"), e.get("path"))
        if e["event"] == "kv_send_start":
            open_[key].append(e)
        elif e["event"] in END_EVENTS:
            out.append(_from_end(open_[key].popleft() if open_[key] else None, e))
    for (rid, path), starts in open_.items():
        out += [
            Transfer(
                rid,
                path,
                "unfinished",
                s["t_ns"],
                None,
                None,
                congestion_requested=s.get("congestion"),
                sender=s.get("worker"),
                target=s.get("target"),
            )
            for s in starts
        ]
    return out


def tcp_samples(events: list[dict]) -> list[dict]:
    """The kv_tcp_info samples among the events."""
    return [e for e in events if e["event"] == "kv_tcp_info"]


def _rise(samples: list[dict], key: str) -> int:
    """The rise of a cumulative counter over one connection's samples (connections are reused between
    transfers, so its absolute value is not this transfer's)."""
    xs = [s[key] for s in samples if s.get(key) is not None]
    return max(xs) - min(xs) if xs else 0


def _during(t: Transfer, samples: list[dict]) -> list[dict]:
    """The samples of t's request and path taken between its start and end events."""
    lo = t.t_start_ns if t.t_start_ns is not None else -1
    hi = t.t_end_ns if t.t_end_ns is not None else float("inf")
    return [s for s in samples if lo <= s["t_ns"] <= hi]


def complete_from_samples(transfers: list[Transfer], samples: list[dict]) -> None:
    """Fill, in place, what an end event did not report (older data planes) from the kv_tcp_info samples
    taken during the transfer: retransmissions (per connection of each attempt) and the congestion control."""
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        by_key[(s.get("request_id"), s.get("path"))].append(s)
    for t in transfers:
        mine = _during(t, by_key.get((t.request_id, t.path), []))
        if not mine:
            continue
        conns: dict[tuple, list[dict]] = defaultdict(list)
        for s in mine:
            conns[(s.get("attempt"), s.get("conn"))].append(s)
        if t.retrans_segs is None:
            t.retrans_segs = sum(_rise(c, "total_retrans") for c in conns.values())
            t.bytes_retrans = sum(_rise(c, "bytes_retrans") for c in conns.values())
        if not t.congestion_used:
            t.congestion_used = sorted({s["cc"] for s in mine if s.get("cc")})


def _median(xs: list[float]) -> float | None:
    return median(xs) if xs else None


def _sum_known(xs: list[int | None]) -> int | None:
    known = [x for x in xs if x is not None]
    return sum(known) if known else None


def path_summary(transfers: list[Transfer], samples: list[dict]) -> dict:
    """One path of one variant (see the module docstring for the byte figures)."""
    by = Counter(t.outcome for t in transfers)
    known = [t for t in transfers if t.retrans_segs is not None]
    known_mb = sum(t.wire_bytes for t in known) / MB
    segs = _sum_known([t.retrans_segs for t in transfers])
    rtts = [s["rtt_us"] / 1e3 for s in samples if s.get("rtt_us") is not None]
    cwnds = [s["snd_cwnd"] for s in samples if s.get("snd_cwnd") is not None]
    return {
        "transfers": len(transfers),
        "ok": by["ok"],
        "failed": by["failed"],
        "cancelled": by["cancelled"],
        "unfinished": by["unfinished"],
        "retried": sum(t.attempts > 1 for t in transfers),
        "time_ms": stats([t.time_ms for t in transfers if t.outcome == "ok"]),
        "wire_bytes": sum(t.wire_bytes for t in transfers),
        "kv_bytes_delivered": sum(t.kv_bytes for t in transfers if t.outcome == "ok"),
        "kv_bytes_wasted": sum(t.wasted_bytes for t in transfers),
        "kv_bytes_resumed": sum(t.resumed_kv_bytes for t in transfers),
        "retrans_segs": segs,
        "bytes_retrans": _sum_known([t.bytes_retrans for t in transfers]),
        "retrans_segs_per_mb": segs / known_mb if segs is not None and known_mb > 0 else None,
        "tcp_info_samples": len(samples),
        "rtt_ms_p50": _median(rtts),
        "cwnd_p50": _median(cwnds),
        "congestion_requested": sorted({t.congestion_requested for t in transfers if t.congestion_requested}),
        "congestion_used": sorted(
            {c for t in transfers for c in t.congestion_used} | {s["cc"] for s in samples if s.get("cc")}
        ),
    }


def kv_paths(transfers: list[Transfer], samples: list[dict]) -> dict[str, dict]:
    """path -> path_summary, for fast, wan and handoff (zeros where a path carried nothing)."""
    return {
        p: path_summary([t for t in transfers if t.path == p], [s for s in samples if s.get("path") == p])
        for p in PATHS
    }


LAN_BOUND_MS = 20  # a fast-path copy ending this long after its prefill ended was held back by the LAN, not by P


def lan_bound_rates(transfers: list[Transfer], events: list[dict]) -> list[float]:
    """The goodput (Mbit/s) of each completed fast-path copy that ended more than LAN_BOUND_MS after its request's
    prefill_done (P streams the copy while it computes, so a copy that ends with the prefill says nothing of the
    LAN): its KV bytes over its time, kv_send_start to its end."""
    done = {e["request_id"]: e["t_ns"] for e in events if e["event"] == "prefill_done"}
    return [
        t.kv_bytes * 8e3 / (t.t_end_ns - t.t_start_ns)
        for t in transfers
        if t.path == "fast"
        and t.outcome == "ok"
        and t.t_start_ns is not None
        and t.t_end_ns is not None
        and t.t_end_ns > t.t_start_ns
        and t.request_id in done
        and t.t_end_ns - done[t.request_id] > LAN_BOUND_MS * 1e6
    ]


def lan_bound(transfers: list[Transfer], events: list[dict]) -> dict | None:
    """The fast path's goodput where the LAN bound it (lan_bound_rates): {copies, p25/p50/p75_mbit}; None: none."""
    rates = lan_bound_rates(transfers, events)
    if not rates:
        return None
    return {"copies": len(rates), **{f"p{p}_mbit": percentile(rates, p) for p in (25, 50, 75)}}


def wan_bytes(paths: dict[str, dict], on_wire_pcap: int | None, on_wire_kv_pcap: int | None) -> dict:
    """The WAN's bytes three ways (module docstring), summed over the WAN paths."""

    def total(key):
        return sum(paths[p][key] or 0 for p in WAN_PATHS if p in paths)

    return {
        "on_wire_pcap": on_wire_pcap,
        "on_wire_kv_pcap": on_wire_kv_pcap,
        "kv_wire_bytes": total("wire_bytes"),
        "delivered": total("kv_bytes_delivered"),
        "wasted": total("kv_bytes_wasted"),
        "resumed": total("kv_bytes_resumed"),
        "bytes_retrans": _sum_known([paths[p]["bytes_retrans"] for p in WAN_PATHS if p in paths]),
    }


def congestion_warnings(variant: str, transfers: list[Transfer], events: list[dict]) -> list[dict]:
    """A warning per (path, requested, used) where a transfer ran on another algorithm than it asked for,
    and per kv_congestion_refused cause: {variant, path, kind, requested, used, count, message}."""
    mism = Counter(
        (t.path, t.congestion_requested, ",".join(t.congestion_used))
        for t in transfers
        if t.congestion_requested not in (None, "", "default")
        and t.congestion_used  # default: the kernel's
        and any(u != t.congestion_requested for u in t.congestion_used)
    )
    out = [
        {
            "variant": variant,
            "path": path,
            "kind": "congestion_mismatch",
            "requested": req,
            "used": used,
            "count": n,
            "message": f"{variant}/{path}: {n} transfer(s) asked for {req} but ran on {used}",
        }
        for (path, req, used), n in sorted(mism.items())
    ]
    refused = Counter(
        (e.get("path"), e.get("requested"), e.get("used"), e.get("reason"))
        for e in events
        if e["event"] == "kv_congestion_refused"
    )
    out += [
        {
            "variant": variant,
            "path": path,
            "kind": "congestion_refused",
            "requested": req,
            "used": used,
            "count": n,
            "message": f"{variant}/{path or '?'}: the kernel refused {req} {n} time(s), used {used}"
            + (f" ({reason})" if reason else ""),
        }
        for (path, req, used, reason), n in sorted(refused.items(), key=str)
    ]
    return out


def variant_kv(
    variant: str, events: list[dict], on_wire_pcap: int | None = None, on_wire_kv_pcap: int | None = None
) -> tuple[dict, list[dict]]:
    """One variant's {"kv_paths", "wan_bytes"} for summary.json, and its congestion warnings."""
    transfers, samples = pair_transfers(events), tcp_samples(events)
    complete_from_samples(transfers, samples)
    paths = kv_paths(transfers, samples)
    paths["fast"]["lan_bound"] = lan_bound(transfers, events)
    return (
        {"kv_paths": paths, "wan_bytes": wan_bytes(paths, on_wire_pcap, on_wire_kv_pcap)},
        congestion_warnings(variant, transfers, events),
    )
