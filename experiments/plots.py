"""The experiment's plots (PNG, matplotlib Agg), each from the run directory's records and pcap.

Responsible for: drawing, one function per plot:

    ttft_cdf.png        TTFT and TTFT-decode CDF per variant
    timeline.png        phases of a few requests (prefill, fast-path KV, WAN KV, RLD decode,
                        handoff, MD decode), pdd beside pd-cross for the same request
    wan_throughput.png  WAN Mbit/s over time per direction from the pcap, variants shaded
    hit_buckets.png     requests per hit-rate bucket (expected, and the DRC's measured in pdd)
    handoff_gaps.png    inter-token gaps around the RLD->MD handoff
Not responsible for: the numbers (experiments.metrics) or reading raw logs.
"""
from __future__ import annotations

import logging
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments import pcap  # noqa: E402
from experiments.records import RequestRecord  # noqa: E402
from experiments.workload import bucket_names, bucket_of  # noqa: E402

log = logging.getLogger(__name__)
PLOTS = ("ttft_cdf.png", "timeline.png", "wan_throughput.png", "hit_buckets.png", "handoff_gaps.png")
COLORS = {"colocated": "tab:gray", "pd-intra": "tab:green", "pd-cross": "tab:red", "pdd": "tab:blue"}
PHASES = (("prefill", "tab:orange"), ("fast_kv", "tab:green"), ("wan_kv", "tab:red"),
          ("rld_decode", "tab:cyan"), ("handoff", "black"), ("md_decode", "tab:blue"))
GAP_SPAN = 6   # tokens each side of the handoff in handoff_gaps.png


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def ttft_cdf(recs: list[RequestRecord], variants: list[str], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, attr, title in ((axes[0], "ttft_ms", "TTFT (first token at the client)"),
                            (axes[1], "ttft_decode_ms", "TTFT-decode (first decode-side token)")):
        for v in variants:
            xs = sorted(getattr(r, attr) for r in recs if r.variant == v and r.ok and getattr(r, attr) is not None)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=v,
                        color=COLORS.get(v))
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlabel("ms (log)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[1].legend(loc="lower right")
    _save(fig, path)


def _timeline_picks(recs: list[RequestRecord], n: int = 4) -> list[str]:
    """A few pdd requests with different stories: lowest hit, a handoff, a direct P->MD, a singular."""
    pdd = [r for r in recs if r.variant == "pdd" and r.ok]
    picks = []
    for pred in (lambda r: r.route == "p-rld-md" and r.expected_hit < 0.9, lambda r: r.route == "p-rld-md",
                 lambda r: r.route == "p-md", lambda r: r.route == "p-rld-singular"):
        cand = [r for r in pdd if pred(r) and r.request_id not in picks]
        if cand:
            picks.append(min(cand, key=lambda r: r.expected_hit).request_id)
    return picks[:n]


def timeline(recs: list[RequestRecord], path: Path) -> None:
    by = {(r.variant, r.request_id): r for r in recs}
    rows = []
    for rid in _timeline_picks(recs):
        for v in ("pdd", "pd-cross"):
            if (v, rid) in by:
                rows.append(by[(v, rid)])
    fig, ax = plt.subplots(figsize=(11, 0.6 * max(4, len(rows)) + 1.2))
    if not rows:
        _empty(ax, "no pdd requests recorded")
    for y, r in enumerate(rows):
        for k, (phase, color) in enumerate(PHASES):
            span = r.spans.get(phase)
            if span:
                h = 0.25 if phase in ("fast_kv", "wan_kv", "handoff") else 0.5
                off = {"fast_kv": -0.3, "wan_kv": 0.3}.get(phase, 0)
                ax.barh(y + off, max(span[1] - span[0], 1.0), left=span[0], height=h, color=color,
                        label=phase if y == 0 or phase not in ax.get_legend_handles_labels()[1] else None)
        if r.ttft_ms is not None:
            ax.plot([r.ttft_ms], [y], marker="|", color="k", markersize=14)
    labels = [f"{r.variant} {r.request_id} ({r.route}, hit {100 * r.expected_hit:.0f}%)" for r in rows]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the client sent the request (| = first token at the client)")
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, ncol=6)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


def wan_throughput(frames: list[pcap.Frame], meta: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 4))
    if not frames:
        _empty(ax, "no WAN capture")
    starts = [w["wall_start"] for w in meta.get("variants", {}).values() if "wall_start" in w]
    t0 = min(starts) if starts else (frames[0].t_s if frames else 0.0)
    for d, series in pcap.throughput(frames, 0.25, t0).items():
        if d != "other" and series:
            ax.plot([s[0] for s in series], [s[1] for s in series], label={"a_to_b": "A→B", "b_to_a": "B→A"}[d], lw=1)
    for v, w in meta.get("variants", {}).items():
        if "wall_start" in w and frames:
            ax.axvspan(w["wall_start"] - t0, w.get("wall_end", w["wall_start"]) - t0, alpha=0.08,
                       color=COLORS.get(v, "gray"))
            ax.text(w["wall_start"] - t0, ax.get_ylim()[1] * 0.95, v, fontsize=8, va="top")
    rate = meta.get("topology", {}).get("wan_profile", {}).get("a_to_b", {}).get("rate_mbit")
    if rate:
        ax.axhline(rate, ls="--", color="gray", lw=0.8, label=f"A→B rate {rate:g} Mbit/s")
    ax.set_xlabel("s since the first variant started (delivered traffic: A→B seen at gwb, B→A at gwa)")
    ax.set_ylabel("Mbit/s (250 ms bins)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


def hit_buckets(recs: list[RequestRecord], variants: list[str], path: Path) -> None:
    names = bucket_names()
    ref = [r for r in recs if r.variant == (variants[0] if variants else None)]
    expected = [sum(bucket_of(r.expected_hit) == b for r in ref) for b in names]
    drc = [r for r in recs if r.variant == "pdd" and r.drc_hit is not None]
    measured = [sum(bucket_of(r.drc_hit) == b for r in drc) for b in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], expected, width=0.4, label="workload (expected hit)", color="tab:gray")
    if drc:
        ax.bar([x + 0.2 for x in xs], measured, width=0.4, label="pdd: DRC hit measured", color="tab:blue")
    ax.set_xticks(list(xs), [f"{n}%" for n in names])
    ax.set_ylabel("requests")
    ax.set_title("Prefix-hit buckets")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def handoff_gaps(recs: list[RequestRecord], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4))
    per_offset: dict[int, list[float]] = {}
    for r in recs:
        if r.variant != "pdd" or not r.handoff or r.handoff.get("switch_index") is None:
            continue
        s = r.handoff["switch_index"]
        pts = [(i - s, r.token_ms[i] - r.token_ms[i - 1]) for i in range(max(1, s - GAP_SPAN),
                                                                         min(len(r.token_ms), s + GAP_SPAN + 1))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:blue", alpha=0.2, lw=0.8)
        for o, g in pts:
            per_offset.setdefault(o, []).append(g)
    if per_offset:
        offs = sorted(per_offset)
        med = [sorted(per_offset[o])[len(per_offset[o]) // 2] for o in offs]
        ax.plot(offs, med, color="tab:blue", lw=2.5, marker="o", label="median")
        ax.axvline(0, color="k", ls="--", lw=0.8, label="first MD token")
        ax.legend()
    else:
        _empty(ax, "no handoffs recorded")
    ax.set_xlabel("token index relative to the first token from the MD")
    ax.set_ylabel("inter-token gap (ms)")
    ax.set_title("Inter-token gaps around the RLD→MD handoff (pdd)")
    ax.grid(alpha=0.3)
    _save(fig, path)


def draw_all(run_dir: Path, recs: list[RequestRecord], variants: list[str], meta: dict,
             frames: list[pcap.Frame]) -> list[Path]:
    """Every plot into run_dir/plots; returns their paths."""
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    measured = [r for r in recs if r.kind != "warmup"]
    ttft_cdf(measured, variants, out / "ttft_cdf.png")
    timeline(measured, out / "timeline.png")
    wan_throughput(frames, meta, out / "wan_throughput.png")
    hit_buckets(measured, variants, out / "hit_buckets.png")
    handoff_gaps(measured, out / "handoff_gaps.png")
    return [out / p for p in PLOTS]
