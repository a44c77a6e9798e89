"""summary.md: the tables a reader of one run looks at first, from summary.json (pure functions).

Responsible for: rendering the summary (experiments.analysis.metrics) as Markdown: the
main table per variant, warnings, the latencies with their 95% intervals and
pdd over each baseline, the similarity to the published deployment (experiments.analysis.summary_pdd),
KV transfers by path, WAN bytes three ways, fallbacks,
each worker on its own, the PDD section (and why the MD took little over, where it did), hit-rate
buckets and token streams; numbers formatted for reading (kB / MB, thousands).
Not responsible for: computing any metric (experiments.analysis.metrics) or plotting.
"""

from __future__ import annotations


from experiments.analysis import limits
from experiments.analysis.formats import num as _f, pct as _pct, ratio_end as _ratio_end, size as _mb
from experiments.analysis.summary import Stats, Summary, VariantSummary, columns
from experiments.analysis import cost, published, rolecpu
from experiments.analysis import lines as per_line
from experiments.analysis.summary_pdd import _handoff_section, _pdd_section, _settle_lines, similarity_section
from experiments.rundir.metadata import RunMetadata
from experiments.spec.workload import bucket_names


def _done(s: VariantSummary) -> str:
    """completed / sent, and what was not sent or leaned on the reference."""
    out = f"{s.completed}/{s.issued}"
    if s.not_issued:
        out += f" (+{s.not_issued} not sent)"
    if s.prompt_from_reference:
        out += f" ({s.prompt_from_reference} on the reference reply)"
    return out


def _q(st: Stats, key: str, digits: int = 0) -> str:
    """A percentile of a Stats: its value, "failed" where it lands on failed requests, "–" where none."""
    return "failed" if key in st.beyond_completed else _f(getattr(st, key), digits)


def compute_words(spec) -> str:
    """The spec's model as the run computed it: the small model's name, or (deployment.compute.mode modelled)
    the modelled architecture and each pool's accelerators, e.g. 'kimi-k2 modelled (p 16 x h800, ...)'."""
    deployment = getattr(spec, "deployment", None) or {}
    compute = deployment.get("compute") or {}
    if compute.get("mode") != "modelled":
        return spec.model
    pools = []
    for role in ("p", "rld", "md"):
        w = deployment.get(role) if isinstance(deployment.get(role), dict) else {}
        pools.append(f"{role} {w.get('devices', 1)} x {w.get('accelerator', 'this-machine')}")
    return f"{compute.get('arch')} modelled ({', '.join(pools)}; tokens in {spec.model}'s vocabulary)"


def machine_words(machine: dict | None) -> list[str]:
    """The machine's reference speed before and after the run (workers.speed), one line; none for older runs."""
    if not machine:
        return []
    said = [
        f"{when} {s['prefill_cpu_ms']:.0f} ms (load {s['load_average'][0]:.1f})"
        for when, s in (("before", machine["start"]), ("after", machine["end"]))
        if s
    ]
    return ["", "machine's reference prefill (CPU time; docs/outputs.md): " + ", ".join(said)]


def markdown(summary: Summary, meta: RunMetadata) -> str:
    """summary.md: the tables a reader looks at first (meta: a serving run's, with its spec)."""
    per = {v: s.model_dump(mode="json") for v, s in summary.variants.items()}  # sections read as mappings
    spec = meta.require("spec")
    lines = [
        f"# {meta.experiment}: {spec.profile}",
        "",
        f"complete: {meta.complete}; backend: {meta.topology.backend if meta.topology else None}; "
        f"model: {compute_words(spec)}; SLO: TTFT ≤ {summary.slo['ttft_ms']:g} ms, "
        f"TPOT ≤ {summary.slo['tpot_ms']:g} ms",
        *machine_words(summary.machine),
        "",
        *main_table(summary),
    ]
    lines += _warnings_section(summary.warnings)
    lines += _intervals_section(per)
    lines += _comparisons_section([c.model_dump() for c in summary.comparisons])
    lines += similarity_section(summary.similarity)
    lines += cost.markdown_section(summary.cost)
    lines += published.markdown_section(summary.published)
    lines += per_line.markdown(summary.lines)
    lines += _rest(per, summary, meta)
    return "\n".join(lines) + "\n"


def figures(summary: Summary) -> list[str]:
    """The figures docs/ keeps of a run (scripts/docs_figures.py): the per-variant table, the intervals and the
    comparisons."""
    per = {v: s.model_dump(mode="json") for v, s in summary.variants.items()}
    return [
        *main_table(summary),
        *_intervals_section(per),
        *_comparisons_section([c.model_dump() for c in summary.comparisons]),
    ]


def main_table(summary: Summary) -> list[str]:
    """The per-variant table, its Column figures last, and its notes."""
    typed, extra = summary.variants, columns()
    lines = [
        "| variant | done | TTFT p50 / p90 / p99 ms | TTFT-decode p50 / p90 / p99 ms | TPOT p50 ms | "
        "decode batch | ITL p99 ms | E2E p50 ms | goodput rps | WAN KV bytes offered / delivered | "
        + "".join(f"{c.heading} | " for _, c in extra),
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(extra),
    ]
    for v, s in typed.items():
        t, d = s.ttft_ms, s.ttft_decode_ms
        lines.append(
            f"| {v} | {_done(s)} | {_q(t, 'p50')} / {_q(t, 'p90')} / {_q(t, 'p99')} | "
            f"{_q(d, 'p50')} / {_q(d, 'p90')} / {_q(d, 'p99')} | "
            f"{_q(s.tpot_ms, 'p50', 1)} | {_f(s.decode_batch.mean, 1)} | "
            f"{_q(s.itl_ms, 'p99')} | {_q(s.e2e_ms, 'p50')} | "
            f"{_f(s.goodput_rps, 3)} | {_mb(s.wan_bytes_offered)} / "
            f"{_mb((s.wan_bytes or {}).get('delivered'))} | "
            + "".join(f"{_f(getattr(s, n), c.digits)} | " for n, c in extra)
        )
    lines += [
        "",
        "done: completed / sent; '+N not sent': requests due past the spec's timeouts.issue_s (the "
        "variant was too slow for its window); 'N on the reference reply': later turns whose previous "
        "turn failed, sent with the colocated variant's reply in their prompt. Latencies are over every "
        "request sent: one that did not complete ranks worst ('failed': the percentile lands on such requests).",
        "WAN KV bytes offered: what the KV senders put on the WAN, counted by the capture before the shaper "
        "(headers, retransmissions and what the link then dropped included; – without captures); delivered: "
        "the KV of completed transfers.",
        "decode batch: mean size of the batched engine steps that decoded a request's tokens, over "
        "requests (1 = decoded alone; a worker batches the steps of its concurrent sessions).",
    ]
    return lines


def _rest(per: dict, summary: Summary, meta: RunMetadata) -> list[str]:
    """The sections after the comparisons, read as mappings."""
    lines = _kv_section(per)
    lines += limits.markdown_section(per)
    lines += _wan_bytes_section(per)
    lines += _fallback_section(per)
    lines += _workers_section(per)
    lines += rolecpu.markdown_section(summary)
    lines += _pdd_section(per.get("pdd"), summary.model_dump(mode="json"))
    lines += _settle_lines(meta)
    lines += _handoff_section(per)
    lines += _bucket_section(per)
    lines += _ablation_section(summary.ablation)
    lines += _streams_section(summary.streams)
    return lines


def _ablation_section(abl: dict | None) -> list[str]:
    """pdd-ablation: does the ablation's MD hit fall behind P's while its RLD saturates (PDD.md point 6)?"""
    if not abl:
        return []
    v, name = abl["verdict"], abl["ablation_variant"]
    gap, rld, ttft = v["md_hit_gap_pp"], v["rld_sessions"], v["ttft_p50_ms"]
    holds = "holds" if v["claim_holds"] else "does not hold here"
    lines = [
        "",
        "## Why every pipeline ends at the MD (the ablation)",
        "",
        f"Over the last third of each run (the highest load): the MD's hit behind P's by {_f(gap['pdd'], 1)} "
        f"points in pdd and {_f(gap['ablation'], 1)} in {name}; RLD open sessions {_f(rld['pdd'], 1)} vs "
        f"{_f(rld['ablation'], 1)}; TTFT p50 {_f(ttft['pdd'])} vs {_f(ttft['ablation'])} ms. The claim (the "
        f"MD falls behind: {v['md_hit_falls_behind']}; the RLD saturates: {v['rld_saturates']}) {holds}.",
        "",
        "| variant | " + " | ".join(f"{b['t_s']:g} s" for b in abl["variants"][name]) + " |",
        "|---|" + "---|" * len(abl["variants"][name]),
    ]
    for variant, bins in abl["variants"].items():
        cells = [f"{_f(b['p_hit'])}/{_f(b['md_hit'])}% · {_f(b['on_rld'])}% · {_f(b['rld_sessions'], 1)}" for b in bins]
        lines.append(f"| {variant} | {' | '.join(cells)} |")
    lines += ["", "cells: P hit / MD hit (% of the prompt) · finished on the RLD (%) · RLD open sessions (mean)"]
    return lines


def _warnings_section(warnings: list[dict]) -> list[str]:
    if not warnings:
        return []
    return ["", "## Warnings", ""] + [f"- **{w['message']}**" for w in warnings]


INTERVAL_COLUMNS = (("TTFT p50", "ttft_ms", "p50"), ("TTFT p90", "ttft_ms", "p90"), ("TPOT p50", "tpot_ms", "p50"),
                    ("E2E p50", "e2e_ms", "p50"), ("E2E mean", "e2e_ms", "mean"))  # fmt: skip


def _end(x, digits: int) -> str:
    return "failed" if x is None else _f(x, digits)


def _with_ci(st: dict, key: str, digits: int = 0) -> str:
    """A statistic with its interval: [lo, hi]; "(too few)" where the sample cannot support one; an end on
    failed requests reads "failed"."""
    if key in (st.get("beyond_completed") or ()):
        return "failed"
    cis = st.get("ci95") or {}
    ci = cis.get(key)
    ends = f" [{_end(ci[0], digits)}, {_end(ci[1], digits)}]" if ci else (" (too few)" if key in cis else "")
    return f"{_f(st.get(key), digits)}{ends}"


def _intervals_section(per: dict) -> list[str]:
    """Each variant's main latencies with their 95% intervals (absent from summaries made before them)."""
    if not any("ci95" in s["ttft_ms"] for s in per.values()):
        return []
    lines = [
        "",
        "## With 95% confidence intervals (ms)",
        "",
        "| variant | " + " | ".join(c[0] for c in INTERVAL_COLUMNS) + " |",
        "|---|" + "---|" * len(INTERVAL_COLUMNS),
    ]
    for v, s in per.items():
        cells = [_with_ci(s[metric], key, 1 if metric == "tpot_ms" else 0) for _, metric, key in INTERVAL_COLUMNS]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Over every request sent, a failed one ranked worst. The unit is the session (its turns share a prefix and "
        "a queue, so they are not independent): percentiles by Woodruff's interval with a cluster-robust "
        "variance, means by the delete-one-session jackknife (experiments/analysis/confidence.py). '(too few)': "
        "this run's requests and sessions cannot support an interval for that statistic (a tail needs hundreds "
        "of requests). These intervals speak for this run only.",
    ]
    return lines


def _comparisons_section(comps: list[dict]) -> list[str]:
    if not comps:
        return []
    names = list(dict.fromkeys(c["metric"] for c in comps))
    subject = comps[0]["variant"]
    lines = [
        "",
        f"## {subject} over each baseline: ratio [95% interval]",
        "",
        "| baseline | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    by = {(c["baseline"], c["metric"]): c for c in comps}
    for base in dict.fromkeys(c["baseline"] for c in comps):
        cells = []
        for n in names:
            c = by.get((base, n))
            if c is None or c["ratio"] is None:
                cells.append("–")
                continue
            ends = f" [{_ratio_end(c['ci95'][0])}, {_ratio_end(c['ci95'][1])}]" if c["ci95"] else ""
            short = {"no significant difference": "n.s."}.get(c["verdict"], c["verdict"])
            cells.append(f"{c['ratio']:.2f}{ends} {short}{' †' if c.get('caveat') else ''}")
        lines.append(f"| {base} | " + " | ".join(cells) + " |")
    caveats = sorted({c["caveat"] for c in comps if c.get("caveat")})
    lines += [
        "",
        f"Ratio of {subject}'s statistic to the baseline's, with its 95% interval (on the log scale). Paired: both "
        "variants replayed the same requests, so the interval compares each request with itself and resamples "
        "sessions, the run's independent units. lower / higher: the interval excludes 1; n.s.: it holds 1; not "
        "judged: no interval (too few sessions, or the statistic lands on failed requests). These verdicts speak "
        "for this run only: a claim needs them to repeat (pddlab sweep --repeat N, then pddlab compare).",
    ]
    lines += [f"† not judged: {c} (the machinery, not the link, was part of what was measured)" for c in caveats]
    return lines


def _kv_section(per: dict) -> list[str]:
    rows = [(v, path, k) for v, s in per.items() for path, k in (s.get("kv_paths") or {}).items() if k["transfers"]]
    if not rows:
        return []
    lines = [
        "",
        "## KV transfers by path",
        "",
        "| variant | path | ok / failed / cancelled (retried) | time p50 / p90 / p99 / max ms | "
        "retrans segs per MB | RTT p50 ms | cwnd p50 | congestion used (requested) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, path, k in rows:
        t = k["time_ms"]
        lines.append(
            f"| {v} | {path} | {k['ok']} / {k['failed']} / {k['cancelled']} ({k['retried']}) | "
            f"{_f(t.get('p50'))} / {_f(t.get('p90'))} / {_f(t.get('p99'))} / {_f(t.get('max'))} | "
            f"{_f(k['retrans_segs_per_mb'], 2)} | {_f(k['rtt_ms_p50'], 1)} | {_f(k['cwnd_p50'])} | "
            f"{', '.join(k['congestion_used']) or '–'} ({', '.join(k['congestion_requested']) or '–'}) |"
        )
    lines += [
        "",
        "time: kv_send_start to kv_send_end of completed transfers; RTT and cwnd: medians of the "
        "connections' TCP_INFO samples (kv_tcp_info); – where the run did not record them.",
    ]
    for v, s in per.items():
        r = s.get("wan_retrans_by_impairment")
        if r:
            lines.append(
                f"- {v}: WAN KV retransmissions {_f(r['retrans_per_s_impaired'], 1)} segments/s while the "
                f"schedule impaired the link ({_f(r['impaired_s'], 1)} s) vs {_f(r['retrans_per_s_clear'], 1)}/s "
                "outside"
            )
    return lines


def _wan_bytes_section(per: dict) -> list[str]:
    rows = [(v, s["wan_bytes"]) for v, s in per.items() if s.get("wan_bytes")]
    if not rows:
        return []
    lines = [
        "",
        "## WAN bytes three ways",
        "",
        "| variant | on the wire (pcap A→B, all / KV flows) | delivered KV | wasted | resumed KV | TCP retransmitted |",
        "|---|---|---|---|---|---|",
    ]
    for v, b in rows:
        lines.append(
            f"| {v} | {_mb(b['on_wire_pcap'])} / {_mb(b['on_wire_kv_pcap'])} | {_mb(b['delivered'])} | "
            f"{_mb(b['wasted'])} | {_mb(b['resumed'])} | {_mb(b['bytes_retrans'])} |"
        )
    lines += [
        "",
        "On the wire: what the capture at gwb saw arrive from A in the variant's window (headers and "
        "TCP retransmissions included). Delivered: KV of completed transfers (kv_send_end). Wasted: every "
        "byte of failed and cancelled transfers plus what earlier attempts of retried transfers sent "
        "(wire_bytes − kv_bytes). Resumed: KV a retry did not resend because the receiver held it. "
        "Paths wan (P→MD) and handoff (RLD→MD KV).",
    ]
    return lines


def _fallback_section(per: dict) -> list[str]:
    causes = sorted({c for s in per.values() for c in s["fallbacks"]})
    lines = [
        "",
        "## Fallbacks by cause, and what the RLD took on",
        "",
        "| variant | "
        + " | ".join(causes)
        + (" | " if causes else "")
        + "RLD token share | RLD sessions | RLD open at once: mean / max |",
        "|---|" + "---|" * (len(causes) + 3),
    ]
    for v, s in per.items():
        occ = s.get("rld_occupancy") or {}
        lines.append(
            f"| {v} | "
            + "".join(f"{s['fallbacks'].get(c, 0)} | " for c in causes)
            + f"{_pct(s['rld_token_share'])} | {occ.get('sessions', '–')} | "
            f"{_f(occ.get('mean'), 2)} / {occ.get('max', '–')} |"
        )
    return lines


def _workers_section(per: dict) -> list[str]:
    """Each worker on its own (summary.json `variants.<v>.workers`, experiments.analysis.per_worker): a pool the
    variant did not use is left out, an idle worker of a pool it used is not (absent from older summaries)."""
    rows = [(v, w, f) for v, s in per.items() for w, f in (s.get("workers") or {}).items() if _pool_used(s, f)]
    if not rows:
        return []
    lines = [
        "",
        "## Per worker",
        "",
        "| variant | worker | KV tokens · threads | requests | tokens | queue p50 / p90 ms | load | prefix hit % | "
        "KV sent | KV received | handoffs · relays |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, w, f in rows:
        q = f["queue_ms"]
        lines.append(
            f"| {v} | {w} | {_limits(f['limits'])} | {f['requests']} | {f['tokens']} "
            f"({_f(100 * f['token_share'])}%) | {_f(q.get('p50'), 1)} / {_f(q.get('p90'), 1)} | {_load(f)} | "
            f"{_hit(f['prefix_hit'])} | {_sent(f['kv_sent'])} | "
            f"{_received(f['kv_received'])} | {_passed_on(f)} |"
        )
    lines += [
        "",
        "Every request of the variant counts, warm-ups included. requests: routed to the worker; tokens: "
        "received from it (token 0 is the P's). queue: P prefill_arrival → prefill_start (its engine prefills "
        "one at a time), decode workers decode_arrival → decode_open (admission). load: P busy prefilling, % of "
        "the window; decode workers open sessions mean / max over the window and the KV slots they reserved "
        "(prompt + max tokens), mean % of capacity. prefix hit: cached / prompt tokens, mean (sessions): P's "
        "prefills, the RLD's local prefills, every MD session (its DRC; 0 where the route asks for none: pd-cross). "
        "KV: delivered bytes by path → receiver; received: transfers held whole (count).",
    ]
    return lines


def _pool_used(s: dict, f: dict) -> bool:
    """Whether any worker of f's role took part in the variant."""
    same = [g for g in s["workers"].values() if g["role"] == f["role"]]
    return any(g["requests"] or g["sessions"] or g["tokens"] for g in same)


def _hit(h: dict) -> str:
    return f"{_f(100 * h['mean'], 1)} ({h['n']})" if h.get("n") else "–"


def _limits(lim: dict) -> str:
    out = f"{_f(lim.get('capacity_tokens'))} · {_f(lim.get('threads'))}"
    if lim.get("cpus") is not None or lim.get("memory_mb") is not None:
        out += f" · {_f(lim.get('cpus'), 1)} CPU · {_f(lim.get('memory_mb'))} MiB"
    return out


def _load(f: dict) -> str:
    if f["occupancy"] is None:
        return f"busy {_f(f['busy_pct'], 1)}%"
    o = f["occupancy"]
    return f"{_f(o['sessions_mean'], 2)} / {o['sessions_max']} open · KV {_f(o['reserved_pct_mean'], 1)}%"


def _sent(paths: dict) -> str:
    parts = []
    for path, k in paths.items():
        if not k["transfers"]:
            continue
        to = ", ".join(f"{_mb(t['kv_bytes'])} → {w}" for w, t in k["to"].items())
        failed = k["failed"] + k["cancelled"] + k["unfinished"]
        parts.append(f"{path} {to}" + (f" ({failed} not delivered)" if failed else ""))
    return "; ".join(parts) or "–"


def _received(kinds: dict) -> str:
    return "; ".join(f"{kind} {_mb(k['kv_bytes'])} ({k['transfers']})" for kind, k in kinds.items()) or "–"


def _passed_on(f: dict) -> str:
    h, r = f["handoffs"], f["relay_outputs"]
    parts = [(h["sent"], "handoffs out"), (h["received"], "handoffs in"), (r["sent"], "relays out"),
             (r["received"], "relays in")]  # fmt: skip
    return ", ".join(f"{n} {what}" for n, what in parts if n) or "–"


# ../shared/PDD.md, point 3: a 100-token handoff over the WAN.
def _bucket_section(per: dict) -> list[str]:
    names = bucket_names()
    lines = [
        "",
        "## By expected hit-rate bucket (%): requests, TTFT p50 ms, mean WAN KB per request",
        "",
        "| variant | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for v, s in per.items():
        b = s["hit_rate"]["buckets"]
        lines.append(
            f"| {v} | "
            + " | ".join(
                f"{b[n]['requests']}: {_f(b[n]['ttft_p50_ms'])} ms, {_f((b[n]['wan_bytes_mean'] or 0) / 1e3)} KB"
                if b[n]["requests"]
                else "0"
                for n in names
            )
            + " |"
        )
    return lines


def _streams_section(streams: dict) -> list[str]:
    lines = ["", f"## Token streams vs {streams['reference']}", ""]
    for v, s in streams["variants"].items():
        line = f"- {v}: {s['equal']} equal, {s['diverged']} diverged"
        if s["diverged"]:
            verdicts = [
                f"{s[k]} {k.replace('_', ' ')}"
                for k in ("near_ties", "unexplained", "prompt_differs", "unjudged")
                if s.get(k)
            ]
            first = ", ".join(
                f"{d['request_id']}@{d['index']}"
                + (f" margin {d['margin']:.1e}" if d.get("margin") is not None else "")
                for d in s["divergences"][:3]
            )
            line += f" ({', '.join(verdicts) or 'not judged'}; first: {first})"
        lines.append(line)
    lines.append("")
    from workers.sampling import TIE_MARGIN

    lines.append(
        "A divergence is a near tie when the reference model's top-2 logit margin at the first differing "
        f"token is below {TIE_MARGIN:g}: there float rounding alone may flip a greedy choice. 'prompt differs': "
        "an earlier turn of the session diverged, so the requests were not the same."
    )
    return lines
