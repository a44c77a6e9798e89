"""Which limit each WAN KV transfer ran into: its share of the line, slow start, loss or its sender (pure functions).

Responsible for: judging every completed WAN KV transfer (paths wan and handoff) against its *share* of the line,
the applied rate over the time-weighted mean number of WAN KV transfers in flight in its direction during its
lifetime (itself included: the kv_send_start..end intervals of all the variant's WAN transfers, whatever their
outcome), and giving it the first limit that fits:

    rate        goodput >= RATE_SHARE of its share: the line bound it, shared or not, and a line scaled down by
                compute.kv_scale s (rate / s, KV bytes / s) gives the published line's time;
    slow_start  (slow-start/RTT-limited) fewer bytes than SLOW_START_BDPS bandwidth-delay products of its share
                (share x RTT), in at most SLOW_START_SLACK x (its slow-start rounds + 1) RTTs: the transfer ended
                in or just after slow start, its time is RTT rounds (a small transfer that took longer was
                held up by something else);
    loss        the Mathis bound MSS x C / (RTT x sqrt(p)) (C = 1.22) lies below its share and the goodput
                reached >= RATE_SHARE of it: applied only where loss is known, the transfer's own retransmitted
                segments / segments sent, else the profile's loss_pct (a lossless line without retransmissions
                has no loss bound);
    sender      none of these, and most of its TCP_INFO samples say the sender had nothing queued (app_limited,
                or nothing unsent with the window not full): the sender, not the network, set the pace;
    unclear     none of these.

Slow start and loss do not scale with the line (RTT rounds and loss-bound throughput stay what they are while the
bytes shrink by s): a scaled run shows such transfers faster than the published line would. Per transfer its
goodput (delivered KV bytes over its time), RTT (its TCP_INFO samples' median, else the profile's 2 x delay) and
loss; the per-variant counts for summary.json (`transfer_limits`); a warning where s > 1 and most WAN KV transfers
were slow-start or loss-limited; summary.md's section.
Not responsible for: pairing the events (experiments.analysis.transfers) or the line's schedule: shares are taken
of the base rate of the applied A->B line (metadata.json's topology.wan_profile).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

from experiments.analysis.formats import num as _f
from experiments.analysis.transfers import WAN_PATHS, Transfer, complete_from_samples, pair_transfers, tcp_samples
from topology.profiles import PROFILE_DIR
from topology.rate_trace import TraceError, load_trace

MATHIS_C = 1.22  # sqrt(3/2): periodic loss, delayed ACKs off (Mathis et al. 1997)
RATE_SHARE = 0.7  # a transfer at >= 70% of a bound (its line share, the Mathis bound) is taken as bound by it
SLOW_START_BDPS = (
    4  # slow start from 10 segments sends ~2 BDPs before its window reaches one: under 4, mostly slow start
)
SLOW_START_SLACK = 2  # ... and a time within twice slow start's rounds (+1: the request's own) of RTT
INIT_CWND_SEGS = 10  # Linux's initial window (RFC 6928)
SENDER_IDLE_SHARE = 0.5  # the sender had nothing queued in more than half of the transfer's TCP_INFO samples
DEFAULT_MSS = 1448  # bytes: Ethernet MTU less IP and TCP headers with timestamps
LIMITS = ("rate", "slow_start", "loss", "sender", "unclear")
NOT_SCALED = ("slow_start", "loss")  # their times do not scale with the line


@dataclass(frozen=True)
class TransferLimit:
    """One WAN KV transfer's limit (see the module docstring); Mbit/s are 1e6 bit/s."""

    request_id: str
    path: str
    kv_bytes: int
    time_ms: float
    goodput_mbit: float
    line_mbit: float
    concurrency: float  # time-weighted mean WAN KV transfers in flight in its direction, itself included
    share_mbit: float  # line_mbit / concurrency
    rtt_ms: float
    loss_pct: float
    mathis_mbit: float | None  # None: no loss known (no loss bound)
    sender_idle: float | None  # share of its TCP_INFO samples with nothing queued (None: no samples)
    limit: str  # one of LIMITS
    reason: str


def mathis_mbit(mss_bytes: float, rtt_s: float, loss_p: float) -> float | None:
    """TCP's loss-bound throughput, MSS x C / (RTT x sqrt(p)) in Mbit/s; None where p or RTT is 0."""
    if loss_p <= 0 or rtt_s <= 0:
        return None
    return mss_bytes * 8 * MATHIS_C / (rtt_s * math.sqrt(loss_p)) / 1e6


def mean_concurrency(interval: tuple[int, int], intervals: list[tuple[int, int]]) -> float:
    """The time-weighted mean number of intervals (interval itself among them) overlapping interval; 1 where it
    has no length."""
    lo, hi = interval
    if hi <= lo:
        return 1.0
    return sum(max(0, min(hi, b) - max(lo, a)) for a, b in intervals) / (hi - lo)


def sender_idle(samples: list[dict]) -> float | None:
    """The share of the samples where the sender had nothing queued: TCP_INFO's app_limited, or nothing unsent
    with the window not full; None without samples that tell."""
    told = [s for s in samples if s.get("phase", "sample") == "sample" and "notsent_bytes" in s]
    if not told:
        return None
    idle = [
        s.get("app_limited") or (s["notsent_bytes"] == 0 and s.get("unacked", 0) < s.get("snd_cwnd", 1)) for s in told
    ]
    return sum(idle) / len(told)


def slow_start_rounds(n_bytes: int, mss_bytes: float) -> int:
    """The RTT rounds slow start needs to send n_bytes from the initial window."""
    return math.ceil(math.log2(n_bytes / (INIT_CWND_SEGS * mss_bytes) + 1))


def classify(goodput: float, share: float, kv_bytes: int, rtt_s: float, mathis: float | None, idle: float | None):
    """(limit, reason) of a transfer (Mbit/s; see the module docstring for the order)."""
    if goodput >= RATE_SHARE * share:
        return "rate", f"reached {goodput / share:.0%} of its share of the line ({share:.3g} Mbit/s)"
    bdp_bytes, rounds = share * 1e6 / 8 * rtt_s, slow_start_rounds(kv_bytes, DEFAULT_MSS)
    time_s = kv_bytes * 8 / (goodput * 1e6)
    if kv_bytes < SLOW_START_BDPS * bdp_bytes and time_s <= SLOW_START_SLACK * (rounds + 1) * rtt_s:
        return "slow_start", (
            f"slow-start/RTT-limited: {kv_bytes / bdp_bytes:.2g} BDPs of its share in {time_s / rtt_s:.0f} RTTs "
            f"(slow start: {rounds} rounds)"
        )
    if mathis is not None and mathis < share and goodput >= RATE_SHARE * mathis:
        return "loss", f"loss bound {mathis:.3g} Mbit/s below its share ({share:.3g} Mbit/s), goodput near it"
    if idle is not None and idle > SENDER_IDLE_SHARE:
        return "sender", f"{goodput / share:.0%} of its share; the sender had nothing queued in {idle:.0%} of samples"
    return "unclear", f"{goodput / share:.0%} of its share, with no slow-start, loss or sender bound"


def transfer_limit(
    t: Transfer, samples: list[dict], line_mbit: float, concurrency: float, rtt_ms: float, loss_pct: float
):
    """t's TransferLimit (samples: its own kv_tcp_info; rtt_ms, loss_pct: the profile's, where t has none);
    None unless t completed with KV and a time."""
    if t.outcome != "ok" or not t.kv_bytes or not t.time_ms:
        return None
    rtts = [s["rtt_us"] / 1e3 for s in samples if s.get("rtt_us")]
    mss = median([s["snd_mss"] for s in samples if s.get("snd_mss")] or [DEFAULT_MSS])
    rtt = median(rtts) if rtts else rtt_ms
    segs = t.wire_bytes / mss if t.wire_bytes else t.kv_bytes / mss
    loss = 100 * t.retrans_segs / segs if t.retrans_segs is not None and segs else loss_pct
    goodput = t.kv_bytes * 8 / (t.time_ms / 1e3) / 1e6
    mathis = mathis_mbit(mss, rtt / 1e3, loss / 100)
    share, idle = line_mbit / concurrency, sender_idle(samples)
    limit, reason = classify(goodput, share, t.kv_bytes, rtt / 1e3, mathis, idle)
    return TransferLimit(
        t.request_id, t.path, t.kv_bytes, t.time_ms, goodput, line_mbit, concurrency, share, rtt, loss, mathis,
        idle, limit, reason,
    )  # fmt: skip


def _intervals(transfers: list[Transfer], end_ns: int, direction) -> dict:
    """Each direction's WAN transfer intervals (an unfinished one runs to end_ns)."""
    out = defaultdict(list)
    for t in transfers:
        if t.t_start_ns is not None and (t.t_end_ns is not None or t.outcome == "unfinished"):
            out[direction(t)].append((t.t_start_ns, t.t_end_ns if t.t_end_ns is not None else end_ns))
    return out


def variant_limits(
    events: list[dict], line_mbit: float, rtt_ms: float, loss_pct: float, kv_scale: float, clusters: dict | None = None
) -> dict:
    """One variant's `transfer_limits`: {line_mbit, kv_scale, <each of LIMITS>: count, transfers: [...]}
    (clusters: worker -> its cluster, the direction of its transfers; without, all share one direction)."""
    transfers, samples = pair_transfers(events), tcp_samples(events)
    complete_from_samples(transfers, samples)
    wan = [t for t in transfers if t.path in WAN_PATHS]
    direction = lambda t: (clusters or {}).get(t.sender)  # noqa: E731
    flights = _intervals(wan, max((e["t_ns"] for e in events), default=0), direction)
    judged = []
    for t in wan:
        mine = [s for s in samples if (s.get("request_id"), s.get("path")) == (t.request_id, t.path) and _in(t, s)]
        timed = t.t_start_ns is not None and t.t_end_ns is not None
        n = mean_concurrency((t.t_start_ns, t.t_end_ns), flights[direction(t)]) if timed else 1.0  # 1: no start
        judged.append(transfer_limit(t, mine, line_mbit, max(n, 1.0), rtt_ms, loss_pct))
    judged = [j for j in judged if j is not None]
    counts = Counter(j.limit for j in judged)
    return {
        "line_mbit": line_mbit,
        "kv_scale": kv_scale,
        **{k: counts[k] for k in LIMITS},
        "transfers": [asdict(j) for j in judged],
    }


def _in(t: Transfer, s: dict) -> bool:
    lo = t.t_start_ns if t.t_start_ns is not None else -1
    return lo <= s["t_ns"] <= (t.t_end_ns if t.t_end_ns is not None else float("inf"))


def _counts(lim: dict) -> str:
    return ", ".join(f"{lim[k]} {LABELS[k]}" for k in LIMITS)


def scaling_warning(variant: str, lim: dict) -> dict | None:
    """The warning where s > 1 and most of the variant's WAN KV transfers were slow-start or loss-limited."""
    judged = sum(lim[k] for k in LIMITS)
    bad = sum(lim[k] for k in NOT_SCALED)
    if lim["kv_scale"] <= 1 or not judged or 2 * bad <= judged:
        return None
    return {
        "variant": variant,
        "kind": "scaled_line_loss_limited",
        "count": bad,
        "message": f"{variant}: {bad} of {judged} WAN KV transfers were loss- or slow-start/RTT-limited "
        f"({lim['loss']} loss, {lim['slow_start']} slow start) on a line scaled by kv_scale={lim['kv_scale']:g}: "
        "the scaled line does not represent the published one for these transfers (slow start's RTT rounds and "
        f"TCP's loss-bound throughput do not scale with the line). All {judged}: {_counts(lim)}",
    }


def line_rate_mbit(direction: dict, rate_mbit: float | None) -> float | None:
    """The A->B line's rate for the shares (Mbit/s): its rate, or a rate trace's mean over one period (the trace
    as recorded, else the project's netem_profiles/traces/ file of that name: a run made in another checkout);
    None: unlimited, or a trace that cannot be read."""
    if rate_mbit:
        return rate_mbit
    if not (recorded := direction.get("rate_trace")):
        return None
    for path in (Path(recorded), PROFILE_DIR / "traces" / Path(recorded).name):
        if path.is_file():
            try:
                return load_trace(str(path)).mean_rate_mbit()
            except TraceError:
                return None
    return None


def add_to(summary: dict, events: list[dict], meta) -> None:
    """Into summary, in place: each variant's transfer_limits and the warnings (meta: the run's RunMetadata;
    nothing where the line was unlimited or never up; a rate trace: shares of its mean rate, line_rate_mbit)."""
    wan = meta.topology.wan_profile.a_to_b if meta.topology else None
    if wan is None:
        return
    extra = wan.model_extra or {}
    if not (line_mbit := line_rate_mbit(extra, wan.rate_mbit)):
        return
    rtt_ms, loss_pct = 2 * float(extra.get("delay_ms") or 0), float(extra.get("loss_pct") or 0)
    s = meta.line_scaling.kv_scale if getattr(meta, "line_scaling", None) else 1.0
    clusters = {h.name: h.cluster for h in getattr(meta.topology, "hosts", None) or []}
    for v, per in summary["variants"].items():
        lim = per["transfer_limits"] = variant_limits(
            [e for e in events if e.get("variant") == v], line_mbit, rtt_ms, loss_pct, s, clusters
        )
        if (w := scaling_warning(v, lim)) is not None:
            summary.setdefault("warnings", []).append(w)


LABELS = {
    "rate": "rate-limited",
    "slow_start": "slow-start/RTT-limited",
    "loss": "loss-limited",
    "sender": "sender-limited",
    "unclear": "unclear",
}


def markdown_section(per: dict) -> list[str]:
    """summary.md's 'WAN KV transfers: what limited them' (per: variant -> its summary as a mapping)."""
    rows = [
        (v, lim) for v, s in per.items() if (lim := s.get("transfer_limits")) and sum(lim.get(k, 0) for k in LIMITS)
    ]
    if not rows:
        return []
    lines = [
        "",
        "## WAN KV transfers: what limited them",
        "",
        "| variant | line Mbit/s (kv_scale) | " + " | ".join(LABELS[k] for k in LIMITS) + " |",
        "|---|---|" + "---|" * len(LIMITS),
    ]
    lines += [
        f"| {v} | {_f(lim['line_mbit'], 1)} ({lim['kv_scale']:g}) | "
        + " | ".join(str(lim.get(k, 0)) for k in LIMITS)
        + " |"
        for v, lim in rows
    ]
    return lines + [
        "",
        "Each transfer against its share of the line: the line over the time-weighted mean number of WAN KV "
        f"transfers in flight beside it. rate-limited: at >= {RATE_SHARE:.0%} of its share (a line scaled by "
        f"kv_scale is faithful for these); slow-start/RTT-limited: under {SLOW_START_BDPS} bandwidth-delay "
        "products of its share, in about slow start's RTT rounds; loss-limited: the Mathis bound MSS x 1.22 / "
        "(RTT x sqrt(loss)) below its share and the goodput near it (only where loss is known: retransmissions "
        "or the profile's loss); "
        "sender-limited: the sender had nothing queued in most TCP_INFO samples; unclear: none of these. "
        "Slow start and loss do not scale with the line: under kv_scale > 1 those times are not the published "
        "line's. Per transfer: summary.json's transfer_limits.",
    ]
