"""The experiment's plots (PNG, matplotlib Agg), each from the run directory's records and pcap.

Responsible for: drawing, one function per plot:

    ttft_cdf.png        TTFT and TTFT-decode CDF per variant
    timeline.png        phases of a few requests (prefill, fast-path KV, WAN KV, RLD decode,
                        handoff, MD decode), pdd beside pd-cross for the same request
    wan_throughput.png  WAN Mbit/s over time from the pcap: A->B split into KV, cross traffic and other
                        (by port, experiments.analysis.flows), B->A; variants shaded, link changes marked
    tcp_wan.png         RTT and cwnd of the WAN KV connections (kv_tcp_info samples) over time, variants
                        shaded, link changes as vertical lines, cross-traffic windows as hatched spans
    hit_buckets.png     requests per hit-rate bucket (expected, and the DRC's measured in pdd)
    handoff_gaps.png    inter-token gaps around the RLD->MD handoff
    handoff_latency.png the handoff latency distribution (CDF) of each variant that hands off, its modes named
    ablation.png        pdd-ablation only: P's and the MD's hit, the share finished on the RLD, the RLD's open
                        sessions and TTFT p50 over the run, pdd beside the ablation (experiments.analysis.ablation)
and a sweep's (experiments.run.sweep): <metric>.png, each main metric against the swept value per variant.
Not responsible for: the numbers (experiments.analysis.metrics) or reading raw logs.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.analysis import flows, pcap  # noqa: E402
from experiments.rundir.metadata import LinkChange, RunMetadata  # noqa: E402
from experiments.analysis.records import RequestRecord  # noqa: E402
from experiments.analysis.runmeta import RunMeta  # noqa: E402
from experiments.spec.workload import bucket_names, bucket_of  # noqa: E402
from workers.roles.routing import Route  # noqa: E402

log = logging.getLogger(__name__)
PLOTS = (
    "ttft_cdf.png",
    "timeline.png",
    "wan_throughput.png",
    "tcp_wan.png",
    "hit_buckets.png",
    "handoff_gaps.png",
    "handoff_latency.png",
)
COLORS = {"colocated": "tab:gray", "pd-intra": "tab:green", "pd-cross": "tab:red", "pdd": "tab:blue"}
PHASES = (
    ("prefill", "tab:orange"),
    ("fast_kv", "tab:green"),
    ("wan_kv", "tab:red"),
    ("rld_decode", "tab:cyan"),
    ("handoff", "black"),
    ("md_decode", "tab:blue"),
)
GAP_SPAN = 6  # tokens each side of the handoff in handoff_gaps.png
CHANGE_COLOR, CROSS_COLOR = "tab:purple", "tab:olive"
CLASS_STYLE = {
    "kv": ("A→B KV", "tab:red"),
    "cross": ("A→B cross traffic", CROSS_COLOR),
    "other": ("A→B other (gRPC, ...)", "tab:gray"),
}
TCP_PATHS = {"wan": "o", "handoff": "x"}  # kv_tcp_info paths that cross the WAN, and their markers


def _hit(h: float | None) -> str:
    return "–" if h is None else f"{100 * h:.0f}%"


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cdf(ax, xs: list[float], **kw) -> None:
    """The empirical CDF of sorted xs as a step line."""
    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", **kw)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def ttft_cdf(recs: list[RequestRecord], variants: list[str], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, attr, title in (
        (axes[0], "ttft_ms", "TTFT (first token at the client)"),
        (axes[1], "ttft_decode_ms", "TTFT-decode (first decode-side token)"),
    ):
        for v in variants:
            xs = sorted(getattr(r, attr) for r in recs if r.variant == v and r.ok and getattr(r, attr) is not None)
            if xs:
                _cdf(ax, xs, label=v, color=COLORS.get(v))
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
    for pred in (
        lambda r: r.route == Route.P_RLD_MD and r.expected_hit is not None and r.expected_hit < 0.9,
        lambda r: r.route == Route.P_RLD_MD,
        lambda r: r.route == Route.P_MD,
        lambda r: r.route == Route.P_RLD_SINGULAR,
    ):
        cand = [r for r in pdd if pred(r) and r.request_id not in picks]
        if cand:
            picks.append(min(cand, key=lambda r: r.expected_hit if r.expected_hit is not None else 1.0).request_id)
    return picks[:n]


def _row_changes(ax, r: RequestRecord, y: int, changes: list[tuple[str, LinkChange]]) -> None:
    """Link changes that fell inside this request's life, as a short purple line across its row."""
    end_ms = max([s[1] for s in r.spans.values()] + r.token_ms + [0.0])
    for variant, c in changes:
        x = (c.t_ns - r.t_send_ns) / 1e6
        if variant == r.variant and 0 <= x <= end_ms:
            ax.plot([x, x], [y - 0.45, y + 0.45], color=CHANGE_COLOR, lw=2, label="link change")


def timeline(recs: list[RequestRecord], path: Path, changes: list[tuple[str, LinkChange]] | None = None) -> None:
    changes = changes or []
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
                ax.barh(
                    y + off,
                    max(span[1] - span[0], 1.0),
                    left=span[0],
                    height=h,
                    color=color,
                    label=phase if y == 0 or phase not in ax.get_legend_handles_labels()[1] else None,
                )
        if r.ttft_ms is not None:
            ax.plot([r.ttft_ms], [y], marker="|", color="k", markersize=14)
        _row_changes(ax, r, y, changes)
    labels = [f"{r.variant} {r.request_id} ({r.route}, hit {_hit(r.expected_hit)})" for r in rows]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the client sent the request (| = first token at the client)")
    _legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, ncol=7)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


def _decorate(ax, rm: RunMeta) -> None:
    """Variants shaded and named, link changes as vertical lines, cross-traffic windows as hatched spans."""
    t0 = rm.origin_s
    for v, w in rm.windows.items():
        if w.wall_start is not None:
            end = w.wall_end if w.wall_end is not None else w.wall_start
            ax.axvspan(w.wall_start - t0, end - t0, alpha=0.08, color=COLORS.get(v, "gray"))
            ax.text(w.wall_start - t0, 0.97, v, fontsize=8, va="top", transform=ax.get_xaxis_transform())
    for v, c in rm.link_changes:
        x = rm.axis_s(v, c.t_ns)
        if x is not None:
            ax.axvline(x, color=CHANGE_COLOR, lw=1, ls=":", label="link change")
            ax.text(
                x,
                0.03,
                f" {c.direction}: {_params(c.params)}",
                rotation=90,
                fontsize=6,
                color=CHANGE_COLOR,
                transform=ax.get_xaxis_transform(),
                va="bottom",
            )
    for v, x in rm.cross_traffic:
        a, b = rm.axis_s(v, x.start_ns), rm.axis_s(v, x.end_ns)
        if a is not None and b is not None:
            ax.axvspan(
                a, b, fill=False, hatch="//", edgecolor=CROSS_COLOR, lw=0, alpha=0.5, label=f"cross traffic ({x.kind})"
            )


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())[:40]


def _legend(ax, **kw) -> None:
    """A legend with each label once."""
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    if uniq:
        ax.legend(uniq.values(), uniq.keys(), **kw)


def wan_throughput(
    frames: list[pcap.Frame],
    meta: RunMetadata,
    path: Path,
    rm: RunMeta | None = None,
    wan: flows.WanFlows | None = None,
) -> None:
    rm = rm or RunMeta(windows=meta.variants)
    fig, ax = plt.subplots(figsize=(11, 4))
    if not frames:
        _empty(ax, "no WAN capture")
    t0 = rm.origin_s if rm.origin_s is not None else (frames[0].t_s if frames else 0.0)
    classes = flows.class_throughput(wan.flows, wan.kv_ports, wan.cross_ports, t0) if wan else {}
    for cls, series in sorted(classes.items(), key=lambda kv: flows.CLASSES.index(kv[0])):
        label, color = CLASS_STYLE[cls]
        ax.plot([p[0] for p in series], [p[1] for p in series], label=label, color=color, lw=1)
    for d, series in pcap.throughput(frames, 0.25, t0).items():
        if d != "other" and series and not (classes and d == "a_to_b"):
            ax.plot([p[0] for p in series], [p[1] for p in series], label={"a_to_b": "A→B", "b_to_a": "B→A"}[d], lw=1)
    if frames and rm.origin_s is not None:
        _decorate(ax, rm)
    rate = meta.topology.wan_profile.a_to_b.rate_mbit if meta.topology else None
    if rate:  # 0: unlimited
        ax.axhline(rate, ls="--", color="gray", lw=0.8, label=f"A→B rate {rate:g} Mbit/s")
    ax.set_xlabel("s since the first variant started (delivered traffic: A→B seen at gwb, B→A at gwa)")
    ax.set_ylabel("Mbit/s (250 ms bins)")
    _legend(ax, loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


def _tcp_points(events: list[dict], rm: RunMeta) -> list[tuple[str, str, float, dict]]:
    """(variant, path, s on the plots' axis, sample) of every WAN kv_tcp_info sample; without the variants'
    clock pairs (older metadata), s since the first sample."""
    samples = [e for e in events if e["event"] == "kv_tcp_info" and e.get("path") in TCP_PATHS]
    pts = [(e.get("variant"), e["path"], rm.axis_s(e.get("variant"), e["t_ns"]), e) for e in samples]
    if pts and any(p[2] is None for p in pts):
        t0 = min(e["t_ns"] for e in samples)
        pts = [(v, path, (e["t_ns"] - t0) / 1e9, e) for v, path, _, e in pts]
    return pts


def tcp_wan(events: list[dict], rm: RunMeta, path: Path) -> None:
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    pts = _tcp_points(events, rm)
    for ax, key, scale, ylabel in (
        (axes[0], "rtt_us", 1e-3, "smoothed RTT (ms)"),
        (axes[1], "snd_cwnd", 1, "cwnd (segments)"),
    ):
        for v, p in sorted({(v, p) for v, p, _, _ in pts}, key=str):
            mine = [(x, e[key] * scale) for vv, pp, x, e in pts if (vv, pp) == (v, p) and e.get(key) is not None]
            ax.scatter(
                [m[0] for m in mine],
                [m[1] for m in mine],
                s=6,
                marker=TCP_PATHS[p],
                color=COLORS.get(v, "gray"),
                alpha=0.6,
                label=f"{v} {p}",
            )
        if pts and rm.origin_s is not None:
            _decorate(ax, rm)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    if not pts:
        _empty(axes[0], "no kv_tcp_info samples on the WAN (older data plane, or no WAN transfers)")
    axes[0].set_title("WAN KV connections: TCP_INFO every ~100 ms of each transfer (one point per sample)")
    axes[1].set_xlabel("s since the first variant started")
    _legend(axes[0], loc="upper right", fontsize=7)
    _save(fig, path)


def hit_buckets(recs: list[RequestRecord], variants: list[str], path: Path) -> None:
    names = bucket_names()
    ref = [r for r in recs if r.variant == (variants[0] if variants else None)]
    expected = [sum(r.expected_hit is not None and bucket_of(r.expected_hit) == b for r in ref) for b in names]
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
        pts = [
            (i - s, r.token_ms[i] - r.token_ms[i - 1])
            for i in range(max(1, s - GAP_SPAN), min(len(r.token_ms), s + GAP_SPAN + 1))
        ]
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


def handoff_latency(recs: list[RequestRecord], variants: list[str], path: Path) -> None:
    """CDF of the final handoffs' latency (RLD start to MD reply) per variant; the legend says how many, their
    modes and the std (the handoff microbenchmark compares token IDs with KV: experiments/specs)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for k, v in enumerate(variants):
        hs = [r.handoff for r in recs if r.variant == v and r.handoff]
        xs = sorted(h["duration_ms"] for h in hs if h["duration_ms"] is not None)
        if not xs:
            continue
        modes = ", ".join(sorted({str(h.get("mode")) for h in hs}))
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        _cdf(ax, xs, color=COLORS.get(v, f"C{k}"), label=f"{v} ({modes}): n={len(xs)}, std {sd:.1f} ms")
    if ax.lines:
        ax.legend(fontsize=8, loc="lower right")
    else:
        _empty(ax, "no handoffs recorded")
    ax.set_xlabel("handoff latency (ms): RLD's start to the MD's reply")
    ax.set_ylabel("fraction of handoffs")
    ax.set_title("Handoff latency by variant")
    ax.grid(alpha=0.3)
    _save(fig, path)


def draw_all(
    run_dir: Path,
    recs: list[RequestRecord],
    variants: list[str],
    meta: RunMetadata,
    frames: list[pcap.Frame],
    events: list[dict] | None = None,
    rm: RunMeta | None = None,
    wan: flows.WanFlows | None = None,
) -> list[Path]:
    """Every plot into run_dir/plots; returns their paths."""
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    rm = rm or RunMeta(windows=meta.variants)
    measured = [r for r in recs if r.kind != "warmup"]
    ttft_cdf(measured, variants, out / "ttft_cdf.png")
    timeline(measured, out / "timeline.png", rm.link_changes)
    wan_throughput(frames, meta, out / "wan_throughput.png", rm, wan)
    tcp_wan(events or [], rm, out / "tcp_wan.png")
    hit_buckets(measured, variants, out / "hit_buckets.png")
    handoff_gaps(measured, out / "handoff_gaps.png")
    handoff_latency(measured, variants, out / "handoff_latency.png")
    return [out / p for p in PLOTS]


def ablation_over_time(abl: dict, path: Path) -> None:
    """Four panels over the run (bins of experiments.analysis.ablation): hits (P solid, MD dashed), % finished on the
    RLD,
    the RLD's open sessions, TTFT p50; pdd and the ablation variant side by side."""
    fig, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
    panels = (
        (("p_hit", "-", "P"), ("md_hit", "--", "MD")),
        (("on_rld", "-", ""),),
        (("rld_sessions", "-", ""),),
        (("ttft_p50_ms", "-", ""),),
    )
    labels = ("prefix hit (% of prompt)", "finished on the RLD (%)", "RLD open sessions", "TTFT p50 (ms)")
    for k, (v, bins) in enumerate(abl["variants"].items()):
        color = COLORS.get(v, f"C{k + 1}")
        for ax, series in zip(axes, panels):
            for key, style, who in series:
                pts = [(b["t_s"], b[key]) for b in bins if b[key] is not None]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=color, label=f"{v} {who}".strip())
    for ax, label in zip(axes, labels):
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            _legend(ax, fontsize=7)
    verdict = abl["verdict"]
    axes[0].set_title(
        f"MD hit behind P's (last third): pdd {_pp(verdict['md_hit_gap_pp']['pdd'])}, "
        f"{abl['ablation_variant']} {_pp(verdict['md_hit_gap_pp']['ablation'])}",
        fontsize=9,
    )
    axes[-1].set_xlabel(f"seconds since the variant's first request ({abl['bin_s']:g} s bins)")
    _save(fig, path)


def _pp(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f} points"


def sweep_ratio_plots(axes, aggregate: list[dict], out: Path, metrics: tuple[str, ...]) -> list[Path]:
    """<metric>_ratio.png per compared metric of a sweep: the subject variant's ratio to each baseline (mean over
    repeats, 95% band) against the swept value, 1 marked: the bathtub of goodput gain against hit rate."""
    out.mkdir(parents=True, exist_ok=True)
    xs, labels, numeric = _sweep_x(axes, aggregate)
    paths = []
    for name in metrics:
        keys = list(
            dict.fromkeys(k for a in aggregate for k in a.get("comparisons") or {} if k.startswith(f"{name} / "))
        )
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for k, key in enumerate(keys):
            pts = [(x, a["comparisons"][key]) for x, a in zip(xs, aggregate) if key in (a.get("comparisons") or {})]
            subject = pts[0][1]["variant"]
            ax.plot(
                [x for x, _ in pts],
                [c["mean"] for _, c in pts],
                marker="o",
                color=f"C{k}",
                label=f"{subject} / {key.split(' / ')[1]}",
            )
            banded = [(x, c["ci95"]) for x, c in pts if c.get("ci95")]
            if banded:
                ax.fill_between(
                    [x for x, _ in banded],
                    [c[0] for _, c in banded],
                    [c[1] for _, c in banded],
                    alpha=0.2,
                    color=f"C{k}",
                )
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        if not numeric:
            ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=7)
        ax.set_xlabel(axes[0].key if numeric else "grid point")
        ax.set_ylabel(f"{name} ratio")
        ax.set_title(f"{name}: ratio to each baseline, mean over repeats, 95% band", fontsize=9)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=8)
        path = out / f"{name}_ratio.png"
        _save(fig, path)
        paths.append(path)
    return paths


def _sweep_x(axes, aggregate: list[dict]) -> tuple[list, list[str], bool]:
    """A sweep plot's x: the single numeric axis's values, else the grid points' indexes (with labels)."""
    numeric = len(axes) == 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in axes[0].values)
    labels = [", ".join(f"{k}={v}" for k, v in a["values"].items()) or "all" for a in aggregate]
    xs = [a["values"][axes[0].key] for a in aggregate] if numeric else list(range(len(aggregate)))
    return xs, labels, numeric


def sweep_plots(axes, aggregate: list[dict], out: Path, metrics: tuple[str, ...]) -> list[Path]:
    """One plot per metric of a sweep (experiments.run.sweep): the mean over repeats against the swept value, a
    line per variant with its 95% band; x is the value of a single numeric axis, else the grid point's label.
    Returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    xs, labels, numeric = _sweep_x(axes, aggregate)
    variants = list(dict.fromkeys(v for a in aggregate for v in a["variants"]))
    paths = []
    for name in metrics:
        fig, ax = plt.subplots(figsize=(7, 4))
        for v in variants:
            pts = [(x, a["variants"].get(v, {}).get(name, {})) for x, a in zip(xs, aggregate)]
            pts = [(x, m) for x, m in pts if m.get("n")]
            if not pts:
                continue
            color = COLORS.get(v)
            ax.plot([x for x, _ in pts], [m["mean"] for _, m in pts], marker="o", label=v, color=color)
            banded = [(x, m["ci95"]) for x, m in pts if m.get("ci95")]
            if banded:
                ax.fill_between(
                    [x for x, _ in banded], [c[0] for _, c in banded], [c[1] for _, c in banded], alpha=0.2, color=color
                )
        if not numeric:
            ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=7)
        ax.set_xlabel(axes[0].key if numeric else "grid point")
        ax.set_ylabel(name)
        ax.set_title(f"{name}: mean over repeats, 95% band (one repeat: the run's own interval)", fontsize=9)
        ax.grid(alpha=0.3)
        if ax.lines:
            _legend(ax, fontsize=8)
        else:
            _empty(ax, "no complete point")
        path = out / f"{name}.png"
        _save(fig, path)
        paths.append(path)
    return paths
