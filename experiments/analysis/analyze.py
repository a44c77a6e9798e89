"""`pddlab analyze RUN_DIR`: recompute requests, events, summary and plots from a run directory alone.

Responsible for: the analysis step that joins the runner's output to the
numbers (records -> metrics -> summary.json / summary.md -> plots). It reads
nothing but the run directory (metadata.json for the spec and the windows,
through experiments.rundir.metadata; workload.jsonl, variants/*, pcap/), so it can
be rerun at any time; it also writes flows.json (the WAN's flows, experiments.analysis.flows).
Not responsible for: running anything.
"""

from __future__ import annotations

import logging
from pathlib import Path

from experiments.analysis import summary as summary_mod
from experiments.analysis import (
    ablation,
    cost,
    flows,
    impairment,
    limits,
    lines,
    metrics,
    occupancy,
    pcap,
    per_worker,
    plots,
    published,
    records,
    rolecpu,
    runmeta,
    similarity,
    summary_md,
    transfers,
)
from experiments.rundir import clientlog, metadata, files as rundir
from experiments.analysis import crosstraffic
from experiments.rundir.metadata import EmulatorHealth, RunMetadata, SpecRecord
from experiments.spec.experiment import SLO, build
from topology.profiles import FRAME_BYTES

log = logging.getLogger(__name__)


class AnalysisError(ValueError):
    """The directory is not a run directory of this experiment."""


def wan_frames(run_dir: Path, site_a: frozenset[bytes] | None = None) -> list[pcap.Frame]:
    """Frames the WAN delivered, both directions (see pcap.delivered); [] without a capture. site_a: a real
    cluster's site A addresses (runmeta.site_a), None for the emulated topology."""
    caps = [run_dir / "pcap" / f"wan-{side}.pcap" for side in "ab"]
    if not all(c.exists() for c in caps):
        return []
    try:
        return pcap.delivered(*(pcap.read_frames(c, site_a) for c in caps))
    except pcap.PcapError as err:
        log.warning("%s", err)
        return []


def _pcap_bytes(frames: list[pcap.Frame], meta: RunMetadata) -> dict:
    """Per variant: WAN wire bytes per direction delivered in its window (one still open: to the end)."""
    if not frames:
        return {}
    return {
        v: pcap.bytes_between(frames, w.wall_start, w.wall_end if w.wall_end is not None else float("inf"))
        for v, w in meta.variants.items()
        if w.wall_start is not None
    }


def wan_flows(run_dir: Path, rm: runmeta.RunMeta) -> flows.WanFlows | None:
    """The WAN's flows from both captures (see experiments.analysis.flows); None without captures or scapy."""
    try:
        return flows.load(run_dir / "pcap", rm.kv_ports, rm.cross_ports, rm.windows, rm.site_a)
    except (pcap.PcapError, ImportError) as err:
        log.warning("no flows.json: %s", err)
        return None


def add_wan_analysis(summary: dict, events: list[dict], rm: runmeta.RunMeta, wan: flows.WanFlows | None) -> None:
    """Into summary, in place: per variant kv_paths, wan_bytes, wan_flows, rld_occupancy; and warnings
    (see experiments.analysis.transfers and experiments.analysis.occupancy for what each holds)."""
    by_variant: dict[str, list[dict]] = {}
    for e in events:
        by_variant.setdefault(e.get("variant"), []).append(e)
    summary["warnings"] = []
    for v, s in summary["variants"].items():
        evs = by_variant.get(v, [])
        window = rm.windows.get(v)
        kv_pcap = flows.by_class(wan.rows, v) if wan and window and window.wall_start is not None else None
        on_wire = s["wan_bytes_pcap"].get("a_to_b", 0) if "wan_bytes_pcap" in s else None
        kv, warnings = transfers.variant_kv(v, evs, on_wire, kv_pcap["kv"]["bytes_delivered"] if kv_pcap else None)
        s.update(kv, wan_flows=kv_pcap, rld_occupancy=occupancy.rld_occupancy(evs, window))
        summary["warnings"] += warnings
        summary["warnings"] += emulator_health(v, s, window.emulator if window else None)
        summary["warnings"] += lan_health(v, s, rm.lan_rate_mbit)
        s["wan_retrans_by_impairment"] = impairment.variant_retrans(evs, window) if window else None


def offered_bytes(wan: flows.WanFlows | None, rm: runmeta.RunMeta, variants: list[str]) -> dict[str, int | None]:
    """variant -> the KV bytes its senders offered to the WAN: the capture at gwa, before the shaper (what the
    link dropped counts, with headers and retransmissions); None without both captures or a window."""
    out: dict[str, int | None] = {}
    for v in variants:
        window = rm.windows.get(v)
        known = wan is not None and window is not None and window.wall_start is not None
        out[v] = flows.by_class(wan.rows, v)["kv"]["bytes_offered"] if known else None
    return out


def mark_machinery(summary: dict) -> None:
    """In place: every comparison that uses a variant whose userspace emulator fell behind (p99 lateness over
    1 ms, or frames dropped for lack of CPU) gets a caveat naming it, and its verdict is not called ("not
    judged"): there the machinery, not the link, was part of what was measured."""
    late = {}
    for v, s in summary["variants"].items():
        e = s.get("emulator")
        if e and (e["late"] or any(e[d]["rx_drops"] + e[d]["tx_errors"] for d in ("a_to_b", "b_to_a"))):
            late[v] = s.get("emulator_p99_late_ms")
    for c in summary["comparisons"]:
        who = [v for v in (c["variant"], c["baseline"]) if v in late]
        if who:
            c["caveat"] = "the userspace emulator fell behind in " + ", ".join(
                f"{v} (p99 {late[v]:,.1f} ms late)" if late[v] is not None else v for v in who
            )
            c["verdict"] = "not judged"


def add_workers(summary: dict, recs: list[records.RequestRecord], events: list[dict], rm: runmeta.RunMeta) -> None:
    """Into summary, in place: per variant `workers`, each P, RLD and MD on its own
    (experiments.analysis.per_worker)."""
    for v, s in summary["variants"].items():
        figs = per_worker.variant_workers(
            [r for r in recs if r.variant == v],
            [e for e in events if e.get("variant") == v],
            rm.workers.get(v),
            rm.windows.get(v),
        )
        s["workers"] = per_worker.to_json(figs)
        s["prefill_steps"] = per_worker.prefill_steps([e for e in events if e.get("variant") == v])


LAN_SLOW = 0.5  # a LAN whose bound copies ran under this share of the profile's payload rate: a warning


def lan_health(variant: str, s: dict, rate_mbit: float | None) -> list[dict]:
    """A warning where the fast path's copies that the LAN held back (kv_paths.fast.lan_bound) ran at under
    LAN_SLOW of the LAN profile's payload rate (its rate x MSS / frame): the machine, not the profile, set the LAN."""
    lb = ((s.get("kv_paths") or {}).get("fast") or {}).get("lan_bound")
    if not lb or not rate_mbit or lb["p50_mbit"] >= LAN_SLOW * rate_mbit * limits.DEFAULT_MSS / FRAME_BYTES:
        return []
    return [
        {
            "variant": variant,
            "path": "fast",
            "kind": "lan_slow",
            "count": lb["copies"],
            "message": f"{variant}: the fast path's copies that the LAN held back ran at {lb['p50_mbit']:,.0f} Mbit/s "
            f"(median of {lb['copies']}), {lb['p50_mbit'] / rate_mbit:.0%} of the LAN profile's {rate_mbit:,.0f}: this "
            "machine could not carry the profile's rate, so the run's LAN was slower than its spec's (a simulator "
            'compared with it needs this LAN: docs/simulator.md, "The LAN")',
        }
    ]


def emulator_health(variant: str, s: dict, h: EmulatorHealth | None) -> list[dict]:
    """The userspace emulator's health in the variant's window (its record's `emulator`, from
    experiments.run.window.lines_health; None: the tc backend) into the variant's summary; a warning for each
    line whose forwarder's p99 lateness passed the limit or that dropped frames for lack of CPU: there the
    machinery, not the link, was measured."""
    s["emulator"] = h.model_dump(mode="json") if h else None
    for key in ("line", "lines"):  # a topology file's several lines only
        if s["emulator"] and s["emulator"][key] is None:
            del s["emulator"][key]
    late_us = [d.p99_us for d in (h.a_to_b, h.b_to_a) if d.p99_us is not None] if h else []
    s["emulator_p99_late_ms"] = max(late_us) / 1000 if late_us else None
    if not h:
        return []
    out = []
    for line, x in (h.lines or {h.line: h}).items():
        if not (x.late or x.dropped()):
            continue
        worst = max((x.a_to_b, x.b_to_a), key=lambda d: d.p99_us or 0)
        out.append(
            {
                "variant": variant,
                "path": "wan",
                "kind": "emulator_late",
                "count": x.dropped(),
                "message": f"{variant}: the userspace emulator{f' (line {line})' if line else ''} fell behind "
                f"(p99 lateness {worst.p99_us} us, max {worst.max_us} us, {x.dropped()} frames dropped, CPU share "
                f"{x.cpu_share}): part of what was measured is the machinery, not the link",
            }
        )
    return out


def machine_speed(meta) -> tuple[dict | None, list[dict]]:
    """summary.json's `machine`: the reference speed before the run and after it (workers.speed; None: a run made
    before it was recorded), and a warning where the two differ (SpeedRecord.differs): the machine changed
    while the run measured, so its step times are not one machine's."""
    start = meta.provenance.machine.speed if meta.provenance.machine else None
    end = meta.speed_at_end
    if start is None and end is None:
        return None, []
    out = {"start": start.model_dump() if start else None, "end": end.model_dump() if end else None}
    if start is None or end is None or not start.differs(end):
        return out, []
    return out, [
        {
            "variant": None,
            "path": None,
            "kind": "machine_speed_changed",
            "count": 1,
            "message": f"the machine's reference prefill took {start.prefill_cpu_ms:.0f} ms of CPU before the run "
            f"and {end.prefill_cpu_ms:.0f} ms after it ({start.ratio(end):.2f}x): the machine changed while the run "
            "measured",
        }
    ]


MAX_JUDGED = 12  # divergences whose near-tie margin is recomputed (a reference forward pass each)


def _client_records(run_dir: Path) -> dict[tuple[str, str], clientlog.ClientRecord]:
    """(variant, request_id) -> the client's record (prompt IDs, tokens) from variants/*/client.jsonl."""
    return {
        (r.variant, r.request_id): r for path in run_dir.glob("variants/*/client.jsonl") for r in clientlog.read(path)
    }


def judge_divergences(run_dir: Path, streams: dict, spec: SpecRecord) -> None:
    """Give every listed divergence its verdict, in place: `margin` = top-2 logit margin of the reference
    model (the spec's model and weights seed, full forward pass without KV cache) at the first differing
    token, and `near_tie` = margin < workers.sampling.TIE_MARGIN, the only place where two numerically
    different but correct runs may pick different greedy tokens. A divergence whose prompt already differs
    (an earlier turn of its session diverged) is not judged. Adds per-variant counts near_ties / unexplained
    / prompt_differs / unjudged."""
    ref = streams.get("reference")
    raw = _client_records(run_dir)
    engine, margins, judged = None, {}, 0
    for v, s in streams.get("variants", {}).items():
        counts = {"near_ties": 0, "unexplained": 0, "prompt_differs": 0, "unjudged": 0}
        for d in s["divergences"]:
            a, b = raw.get((ref, d["request_id"])), raw.get((v, d["request_id"]))
            if a is None or b is None or a.prompt is None or b.prompt is None:
                counts["unjudged"] += 1
                continue
            if a.prompt != b.prompt:
                d["prompt_differs"] = True
                counts["prompt_differs"] += 1
                continue
            key = (d["request_id"], d["index"])
            if key not in margins:
                if judged >= MAX_JUDGED:
                    counts["unjudged"] += 1
                    continue
                if engine is None:
                    from workers.engine import Engine

                    engine = Engine(
                        spec.model, seed=spec.weights_seed, capacity_tokens=64, block_size=16, prefix_cache=False
                    )
                from workers.sampling import top2_margin

                margins[key] = top2_margin(engine.reference_logits(a.prompt + a.reply()[: d["index"]])[-1])
                judged += 1
            from workers.sampling import TIE_MARGIN

            d["margin"], d["near_tie"] = margins[key], margins[key] < TIE_MARGIN
            counts["near_ties" if d["near_tie"] else "unexplained"] += 1
        counts["unjudged"] += s["diverged"] - len(s["divergences"])
        s.update(counts)


def analyze(run_dir: Path) -> dict:
    """Write requests.jsonl, events.jsonl, summary.json, summary.md, plots/; return the summary."""
    run_dir = Path(run_dir)
    try:
        meta = metadata.read(run_dir)
        if not (run_dir / "variants").exists() and not (run_dir / "requests.jsonl").exists():
            raise AnalysisError(
                f"{run_dir}: no variants/ or requests.jsonl (experiment {meta.experiment!r} "
                "is not a serving experiment)"
            )
        spec: SpecRecord = meta.require("spec")
        if (run_dir / "variants").exists():
            recs, events = records.collect(run_dir)
            records.write(run_dir, recs, events)
        else:
            recs, events = records.read(run_dir), records.read_events(run_dir)
    except rundir.RecordError as err:
        raise AnalysisError(str(err)) from None
    variants = [v for v in spec.variants if any(r.variant == v for r in recs)]
    from workers.model import get_config

    kv_bpt = get_config(spec.model).kv_bytes_per_token
    rate = meta.topology.wan_profile.a_to_b.rate_mbit if meta.topology else 0.0  # 0: unlimited or never up
    slo = build(SLO, spec.slo, "slo")
    rm = runmeta.load(run_dir, meta)
    frames = wan_frames(run_dir, rm.site_a)
    wan = wan_flows(run_dir, rm)
    if wan:
        rundir.write_json(run_dir / "flows.json", wan.to_json())
    offered = offered_bytes(wan, rm, variants)
    summary = metrics.summarize(recs, variants, slo, kv_bpt, rate or float("nan"), _pcap_bytes(frames, meta), offered)
    add_wan_analysis(summary, events, rm, wan)
    limits.add_to(summary, events, meta)  # after add_wan_analysis, which starts the warnings
    mark_machinery(summary)
    add_workers(summary, recs, events, rm)
    rolecpu.add_to(summary, events, {v: ["router", *(w.name for w in ws)] for v, ws in rm.workers.items()})
    judge_divergences(run_dir, summary["streams"], spec)
    summary["complete"] = meta.complete
    # what analysed it (a run re-analysed by newer code says so): the commit, its dirty flag, the packages
    summary["analysed_by"] = {"git": rundir.git_state(), "packages": rundir.package_versions()}
    summary["cross_traffic"] = crosstraffic.summarize(run_dir, meta)
    summary["machine"], drift = machine_speed(meta)
    summary["warnings"] += drift
    topo = meta.topology
    hosts = [h.model_dump() for h in topo.hosts] if topo else []
    summary["lines"] = lines.per_line(run_dir, topo.topology if topo else None, hosts, meta.variants, events)
    if (abl := ablation.summarize(recs, events, spec)) is not None:
        summary["ablation"] = abl
    similarity.add_to(summary, recs, variants, meta)
    cost.add_to(summary, meta)
    rolecpu.mark_late(summary)  # after cost.add_to: its BCR comparisons too
    published.add_to(summary, meta)  # EXP=pdd-published: the published figures beside this run's
    typed = summary_mod.Summary.model_validate(summary)
    summary_mod.write(run_dir, typed)
    (run_dir / "summary.md").write_text(summary_md.markdown(typed, meta))
    plots.draw_all(run_dir, recs, variants, meta, frames, events, rm, wan)
    if "ablation" in summary:
        plots.ablation_over_time(summary["ablation"], run_dir / "plots" / "ablation.png")
    log.info("analysis written to %s", run_dir)
    return summary
