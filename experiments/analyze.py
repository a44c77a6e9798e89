"""`pddlab analyze RUN_DIR`: recompute requests, events, summary and plots from a run directory alone.

Responsible for: the analysis step that joins the runner's output to the
numbers (records -> metrics -> summary.json / summary.md -> plots). It reads
nothing but the run directory (metadata.json for the spec and the windows,
workload.jsonl, variants/*, pcap/), so it can be rerun at any time; it also
writes flows.json (the WAN's flows, experiments.flows).
Not responsible for: running anything.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from experiments import (
    crosstraffic,
    flows,
    impairment,
    metrics,
    occupancy,
    pcap,
    plots,
    records,
    rundir,
    runmeta,
    summary_md,
    transfers,
)
from experiments.spec import SLO, build

log = logging.getLogger(__name__)


class AnalysisError(ValueError):
    """The directory is not a run directory of this experiment."""


def wan_frames(run_dir: Path) -> list[pcap.Frame]:
    """Frames the WAN delivered, both directions (see pcap.delivered); [] without a capture."""
    caps = [run_dir / "pcap" / f"wan-{side}.pcap" for side in "ab"]
    if not all(c.exists() for c in caps):
        return []
    try:
        return pcap.delivered(*(pcap.read_frames(c) for c in caps))
    except pcap.PcapError as err:
        log.warning("%s", err)
        return []


def _pcap_bytes(frames: list[pcap.Frame], meta: dict) -> dict:
    """Per variant: WAN wire bytes per direction delivered in its window."""
    if not frames:
        return {}
    return {
        v: pcap.bytes_between(frames, w["wall_start"], w.get("wall_end", float("inf")))
        for v, w in meta.get("variants", {}).items()
        if "wall_start" in w
    }


def wan_flows(run_dir: Path, rm: runmeta.RunMeta) -> flows.WanFlows | None:
    """The WAN's flows from both captures (see experiments.flows); None without captures or scapy."""
    try:
        return flows.load(run_dir / "pcap", rm.kv_ports, rm.cross_ports, rm.windows)
    except (pcap.PcapError, ImportError) as err:
        log.warning("no flows.json: %s", err)
        return None


def add_wan_analysis(summary: dict, events: list[dict], rm: runmeta.RunMeta, wan: flows.WanFlows | None) -> None:
    """Into summary, in place: per variant kv_paths, wan_bytes, wan_flows, rld_occupancy; and warnings
    (see experiments.transfers and experiments.occupancy for what each holds)."""
    by_variant: dict[str, list[dict]] = {}
    for e in events:
        by_variant.setdefault(e.get("variant"), []).append(e)
    summary["warnings"] = []
    for v, s in summary["variants"].items():
        evs = by_variant.get(v, [])
        kv_pcap = flows.by_class(wan.rows, v) if wan and "wall_start" in rm.windows.get(v, {}) else None
        on_wire = s["wan_bytes_pcap"].get("a_to_b", 0) if "wan_bytes_pcap" in s else None
        kv, warnings = transfers.variant_kv(v, evs, on_wire, kv_pcap["kv"]["bytes_delivered"] if kv_pcap else None)
        s.update(kv, wan_flows=kv_pcap, rld_occupancy=occupancy.rld_occupancy(evs, rm.windows.get(v)))
        summary["warnings"] += warnings
        summary["warnings"] += emulator_health(v, s, rm.windows.get(v) or {})
        s["wan_retrans_by_impairment"] = impairment.variant_retrans(evs, rm.windows.get(v) or {})


def emulator_health(variant: str, s: dict, window: dict) -> list[dict]:
    """The userspace emulator's health in the variant's window (metadata's `emulator`, from
    topology.emulator.health_between) into the variant's summary; a warning where its p99 lateness
    passed the limit or it dropped frames for lack of CPU: there the machinery, not the link, was measured."""
    h = window.get("emulator")
    s["emulator"] = h
    if not h:
        return []
    dirs = {d: h[d] for d in ("a_to_b", "b_to_a") if d in h}
    drops = sum(x.get("rx_drops", 0) + x.get("tx_errors", 0) for x in dirs.values())
    if not h.get("late") and not drops:
        return []
    worst = max(dirs.values(), key=lambda x: x.get("p99_us") or 0)
    return [
        {
            "variant": variant,
            "path": "wan",
            "kind": "emulator_late",
            "count": drops,
            "message": f"{variant}: the userspace emulator fell behind (p99 lateness {worst.get('p99_us')} us, "
            f"max {worst.get('max_us')} us, {drops} frames dropped, CPU share {h.get('cpu_share')}): "
            "part of what was measured is the machinery, not the link",
        }
    ]


MAX_JUDGED = 12  # divergences whose near-tie margin is recomputed (a reference forward pass each)


def _client_lines(run_dir: Path) -> dict:
    """(variant, request_id) -> the client's raw record (prompt IDs, tokens) from variants/*/client.jsonl."""
    raw = {}
    for path in (run_dir / "variants").glob("*/client.jsonl"):
        for line in path.read_text().splitlines():
            try:
                d = json.loads(line)
                raw[(d["variant"], d["request_id"])] = d
            except (json.JSONDecodeError, KeyError):
                continue
    return raw


def judge_divergences(run_dir: Path, streams: dict, spec: dict) -> None:
    """Give every listed divergence its verdict, in place: `margin` = top-2 logit margin of the reference
    model (the spec's model and weights seed, full forward pass without KV cache) at the first differing
    token, and `near_tie` = margin < workers.sampling.TIE_MARGIN, the only place where two numerically
    different but correct runs may pick different greedy tokens. A divergence whose prompt already differs
    (an earlier turn of its session diverged) is not judged. Adds per-variant counts near_ties / unexplained
    / prompt_differs / unjudged."""
    ref = streams.get("reference")
    raw = _client_lines(run_dir) if (run_dir / "variants").exists() else {}
    engine, margins, judged = None, {}, 0
    for v, s in streams.get("variants", {}).items():
        counts = {"near_ties": 0, "unexplained": 0, "prompt_differs": 0, "unjudged": 0}
        for d in s["divergences"]:
            a, b = raw.get((ref, d["request_id"])), raw.get((v, d["request_id"]))
            if a is None or b is None:
                counts["unjudged"] += 1
                continue
            if a["prompt"] != b["prompt"]:
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
                        spec.get("model", "default"),
                        seed=spec.get("weights_seed", 0),
                        capacity_tokens=64,
                        block_size=16,
                        prefix_cache=False,
                    )
                from workers.sampling import top2_margin

                tokens = [t[1] for t in sorted(a["tokens"])]
                margins[key] = top2_margin(engine.reference_logits(list(a["prompt"]) + tokens[: d["index"]])[-1])
                judged += 1
            from workers.sampling import TIE_MARGIN

            d["margin"], d["near_tie"] = margins[key], margins[key] < TIE_MARGIN
            counts["near_ties" if d["near_tie"] else "unexplained"] += 1
        counts["unjudged"] += s["diverged"] - len(s["divergences"])
        s.update(counts)


def analyze(run_dir: Path) -> dict:
    """Write requests.jsonl, events.jsonl, summary.json, summary.md, plots/; return the summary."""
    run_dir = Path(run_dir)
    mpath = run_dir / "metadata.json"
    if not mpath.exists():
        raise AnalysisError(f"{run_dir}: no metadata.json (not a run directory)")
    meta = json.loads(mpath.read_text())
    spec = meta.get("spec", {})
    if not (run_dir / "variants").exists() and not (run_dir / "requests.jsonl").exists():
        raise AnalysisError(
            f"{run_dir}: no variants/ or requests.jsonl (experiment {meta.get('experiment')!r} "
            "is not a serving experiment)"
        )
    if (run_dir / "variants").exists():
        recs, events = records.collect(run_dir)
        records.write(run_dir, recs, events)
    else:
        recs, events = records.read(run_dir), records.read_events(run_dir)
    variants = [v for v in spec.get("variants", []) if any(r.variant == v for r in recs)]
    from workers.model import get_config

    kv_bpt = get_config(spec.get("model", "default")).kv_bytes_per_token
    rate = meta.get("topology", {}).get("wan_profile", {}).get("a_to_b", {}).get("rate_mbit") or 0.0
    slo = build(SLO, spec.get("slo", {}), "slo")
    frames, rm = wan_frames(run_dir), runmeta.load(run_dir, meta)
    wan = wan_flows(run_dir, rm)
    if wan:
        rundir.write_json(run_dir / "flows.json", wan.to_json())
    summary = metrics.summarize(recs, variants, slo, kv_bpt, rate or float("nan"), _pcap_bytes(frames, meta))
    add_wan_analysis(summary, events, rm, wan)
    judge_divergences(run_dir, summary["streams"], spec)
    summary["complete"] = meta.get("complete", False)
    summary["cross_traffic"] = crosstraffic.summarize(run_dir)
    rundir.write_json(run_dir / "summary.json", summary)
    (run_dir / "summary.md").write_text(summary_md.markdown(summary, meta))
    plots.draw_all(run_dir, recs, variants, meta, frames, events, rm, wan)
    log.info("analysis written to %s", run_dir)
    return summary
