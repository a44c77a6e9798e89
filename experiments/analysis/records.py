"""Per-request records: the client's view of each request joined with the roles' events.

Responsible for: reading a run directory's raw files (variants/<v>/client.jsonl
through experiments.rundir.clientlog, and variants/<v>/events/*.jsonl), merging every role's events into one
events.jsonl (ordered by t_ns, tagged with the variant), and writing
requests.jsonl: one line per request and variant with its route, the workers
it used, hit rates, token timeline, bytes per path, handoff, fallbacks.
Not responsible for: statistics across requests (experiments.analysis.metrics).

Times: every t_ns is time.monotonic_ns() (shared by all namespaces of the
host); per-request times are ms relative to the client's send.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path

from experiments.rundir import clientlog
from experiments.rundir.clientlog import ClientRecord
from experiments.spec.deployment import role_of
from experiments.spec.workload import WorkloadRequest, read as read_workload

FALLBACK_EVENTS = (
    "completed_on_rld",
    "kv_timeout",
    "handoff_failed",
    "relay_lost",
    "source_failed",
    "kv_send_failed",
    "handoff_diverged",
    "failed",
    "route_fallback",
    "resumed_on_rld",
    "kv_send_retry",
    "prefix_lost",
    "kv_room_wait",  # not a fallback: a decode worker's cache was full for now and the session queued for room
)
REASON_KEYED = ("completed_on_rld", "route_fallback")  # their cause is `event:reason` (see fallback_cause)
CAUSE_REASON_CHARS = 40  # a free-text reason (an error message) is cut to its first clause and this length
HANDOFF_GAP_WINDOW = 3  # tokens on each side of the RLD->MD switch searched for the largest gap
# Events that name the worker taking a request's part in its role: P's own, a decode worker's own, and the
# router's session_open (its `worker` is the decode worker that accepted the session).
SERVED_BY = ("prefill_arrival", "decode_open", "session_open")


@dataclass
class RequestRecord:
    """One request in one variant (see the module docstring for times and units)."""

    variant: str
    request_id: str
    session: str
    turn: int
    kind: str
    ok: bool
    error: str | None
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    route: str | None
    expected_hit: float | None  # workload's expected DRC hit (same in every variant); None: not in workload.jsonl
    drc_hit: float | None  # the MD's measured hit (pdd only; None where the DRC is not used)
    md_cached_tokens: int
    token_ids: list[int]
    token_ms: list[float]  # client receipt of each token, from send (ms)
    token_workers: list[str]
    t_send_ns: int
    t_done_ns: int
    ttft_ms: float | None  # first token at the client
    ttft_decode_ms: float | None  # first token produced by a decode worker (index 1): includes the KV transfer
    tpot_ms: float | None
    e2e_ms: float | None
    fast_kv_bytes: int = 0  # P->RLD prompt KV (wire bytes)
    wan_kv_bytes: int = 0  # P->MD prompt KV (wire bytes)
    wan_handoff_bytes: int = 0  # RLD->MD handoff payload (token IDs, or KV in `kv` mode)
    wan_bytes: int = 0  # everything this request sent across the WAN (KV + handoff)
    kv_bytes_saved: int = 0  # singular: WAN transfer blocked
    rld_tokens: int = 0
    md_tokens: int = 0
    p_tokens: int = 0
    decode_batch: float | None = None  # mean batch of the decode steps that made its tokens (step-weighted)
    handoff: dict | None = None  # mode, tokens, payload_bytes, duration_ms, extend_ms, switch_index, gap_ms
    fallbacks: list[str] = field(default_factory=list)
    inflight_tokens: int = 0  # prompt tokens P did not ship: an earlier turn's WAN copy still under way brings them
    relay_absorbed: bool = False  # the RLD finished alone and the MD recomputed its output (its DRC keeps it)
    spans: dict = field(default_factory=dict)  # timeline phases: name -> [start_ms, end_ms] from send
    mode: str = ""  # the serving mode (= variant, unless the spec's variant_defs names it)
    issued: bool = True  # False: never sent (past the variant's timeouts.issue_s)
    prompt_source: str = ""  # workload | previous | reference (a failed turn's reply from colocated)
    workers: dict[str, str] = field(default_factory=dict)  # role (p, rld, md) -> the worker that took its part
    handoff_requested: str | None = None  # the handoff mode the client asked for (None: the deployment's)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed writer
    return out


def variant_events(vdir: Path, variant: str) -> list[dict]:
    """Every role's events of one variant, tagged and sorted by t_ns."""
    evs = []
    for path in sorted((vdir / "events").glob("*.jsonl")):
        for e in _read_jsonl(path):
            e["variant"] = variant
            evs.append(e)
    return sorted(evs, key=lambda e: e["t_ns"])


def _ms(t_ns: int, t0_ns: int) -> float:
    return (t_ns - t0_ns) / 1e6


def _span(evs: list[dict], start: str, end: str, t0: int, **match) -> list[float] | None:
    """[start_ms, end_ms] of the first start event and the last end event matching the fields."""

    def ok(e):
        return all(e.get(k) == v for k, v in match.items())

    s = [e["t_ns"] for e in evs if e["event"] == start and ok(e)]
    f = [e["t_ns"] for e in evs if e["event"] == end and ok(e)]
    return [_ms(min(s), t0), _ms(max(f), t0)] if s and f else None


def _bytes(evs: list[dict], rec: RequestRecord) -> None:
    """The request's bytes by path. A chunked handoff's chunk logs its payload at its handoff_start (its
    handoff_end has none): a chunk the MD acknowledged counts that payload."""
    chunk_payload = None
    for e in evs:
        if e["event"] == "kv_send_end":
            if e.get("path") == "fast":
                rec.fast_kv_bytes += e.get("wire_bytes", 0)
            elif e.get("path") == "wan":
                rec.wan_kv_bytes += e.get("wire_bytes", 0)
            elif e.get("path") == "handoff":
                pass  # counted in handoff_end's payload_bytes
        elif e["event"] == "handoff_start" and e.get("final") is False:
            chunk_payload = e.get("payload_bytes")
        elif e["event"] == "handoff_end":
            payload = e.get("payload_bytes") if e.get("final", True) else chunk_payload
            rec.wan_handoff_bytes += payload or 0
        elif e["event"] == "wan_blocked":
            rec.kv_bytes_saved += e.get("kv_bytes_saved", 0)
    rec.wan_bytes = rec.wan_kv_bytes + rec.wan_handoff_bytes


def _md_cache(evs: list[dict], rec: RequestRecord) -> None:
    """What the MD's in-flight DRC spared this request's copy, and whether the MD kept the RLD's output."""
    for e in evs:
        if e["event"] == "drc_inflight":
            rec.inflight_tokens += e.get("inflight_tokens", 0) - e.get("cached_tokens", 0)
        elif e["event"] == "relay_absorbed":
            rec.relay_absorbed = True


def _handoff(evs: list[dict], rec: RequestRecord, t0: int) -> None:
    ends = [e for e in evs if e["event"] == "handoff_end" and e.get("final")]
    if not ends:
        return
    e = ends[-1]
    switch = next((i for i, w in enumerate(rec.token_workers) if w.startswith("md")), None)
    gaps = [rec.token_ms[i] - rec.token_ms[i - 1] for i in range(1, len(rec.token_ms))]
    gap = None
    if switch is not None and gaps:
        lo, hi = max(0, switch - 1 - HANDOFF_GAP_WINDOW), min(len(gaps), switch + HANDOFF_GAP_WINDOW)
        gap = max(gaps[lo:hi]) if hi > lo else None
    extends = [x.get("extend_ns", 0) for x in evs if x["event"] == "handoff_recv_end"]
    # ready: from the RLD's decision to hand off (its handoff_end less the duration it measured from there,
    # before any KV export) to the MD's handoff_recv_end of the final message, after its extend or KV import:
    # the same two points for every mode, on the host's one monotonic clock
    recv = [x for x in evs if x["event"] == "handoff_recv_end" and x.get("final")]
    started = e["t_ns"] - e["duration_ns"] if e.get("duration_ns") is not None else None
    ready = (recv[-1]["t_ns"] - started) / 1e6 if recv and started is not None else None
    rec.handoff = {
        "mode": e.get("mode"),
        "tokens": e.get("tokens"),
        # every message of the handoff (a chunked one's chunks and its final message); None: none logged one
        "payload_bytes": rec.wan_handoff_bytes
        if any(x.get("payload_bytes") is not None for x in evs if x["event"].startswith("handoff_"))
        else None,
        "duration_ms": e["duration_ns"] / 1e6 if e.get("duration_ns") is not None else None,
        "extend_ms": (extends[-1] / 1e6) if extends else None,
        "ready_ms": ready,
        "chunks": sum(1 for x in evs if x["event"] == "handoff_end"),
        "switch_index": switch,
        "gap_ms": gap,
    }


def _spans(evs: list[dict], rec: RequestRecord, t0: int) -> None:
    s = {
        "prefill": _span(evs, "prefill_arrival", "prefill_done", t0),
        "fast_kv": _span(evs, "kv_send_start", "kv_send_end", t0, path="fast"),
        "wan_kv": _span(evs, "kv_send_start", "kv_send_end", t0, path="wan"),
        "handoff": _span(evs, "handoff_start", "handoff_end", t0),
    }
    for who, name in (("rld", "rld_decode"), ("md", "md_decode")):
        idx = [i for i, w in enumerate(rec.token_workers) if w.startswith(who)]
        if idx:
            s[name] = [rec.token_ms[idx[0]], rec.token_ms[idx[-1]]]
    rec.spans = {k: v for k, v in s.items() if v is not None}


def _workers(route_ev: dict, evs: list[dict]) -> dict[str, str]:
    """role -> the worker the request used there: the router's picks (its route event), then every worker the
    events show taking part (SERVED_BY), the later winning: the RLD a fallback or a resume picked after the
    route is the one the request ended on."""
    out = dict(route_ev.get("workers") or {})
    for e in evs:
        if e["event"] in SERVED_BY and e.get("worker"):
            out[role_of(e["worker"])] = e["worker"]
    return out


def _decode_batch(evs: list[dict]) -> float | None:
    """Mean size of the batched engine steps this request's decode sessions ran in (their decode_done
    events, weighted by steps); None where no session reported steps (older runs, no decode steps)."""
    done = [e for e in evs if e["event"] == "decode_done" and e.get("steps")]
    steps = sum(e["steps"] for e in done)
    return sum(e["steps"] * e["mean_batch"] for e in done) / steps if steps else None


def build_record(raw: ClientRecord, wreq: WorkloadRequest | None, evs: list[dict]) -> RequestRecord:
    """One request: the client's record, its workload entry and its events."""
    t0 = raw.t_send_ns
    toks = sorted(raw.tokens)
    token_ms = [_ms(t.t_recv_ns, t0) for t in toks]
    route_ev = next((e for e in evs if e["event"] == "route"), {})
    if raw.done is not None:
        route, cached = raw.done.route or route_ev.get("route"), raw.done.md_cached_tokens
    else:  # no done message (the request failed): what the router's route event said
        route, cached = route_ev.get("route"), route_ev.get("md_cached_tokens") or 0
    n_out = len(toks)
    rec = RequestRecord(
        variant=raw.variant,
        request_id=raw.request_id,
        session=raw.session,
        turn=raw.turn,
        kind=raw.kind,
        ok=raw.error is None and n_out == raw.max_tokens,
        error=raw.error,
        prompt_tokens=raw.prompt_tokens,
        max_tokens=raw.max_tokens,
        output_tokens=n_out,
        route=route,
        expected_hit=wreq.expected_hit if wreq else None,
        drc_hit=(cached / raw.prompt_tokens) if raw.mode == "pdd" and raw.prompt_tokens else None,
        mode=raw.mode,
        md_cached_tokens=cached,
        token_ids=[t.token for t in toks],
        token_ms=token_ms,
        token_workers=[t.worker for t in toks],
        t_send_ns=t0,
        t_done_ns=raw.t_done_ns if raw.t_done_ns is not None else t0,
        ttft_ms=token_ms[0] if token_ms else None,
        ttft_decode_ms=token_ms[1] if len(token_ms) > 1 else None,
        tpot_ms=(token_ms[-1] - token_ms[0]) / (n_out - 1) if n_out > 1 else None,
        e2e_ms=_ms(raw.t_done_ns, t0) if raw.t_done_ns and raw.error is None else None,
        issued=raw.issued,
        prompt_source=raw.prompt_source,
        handoff_requested=raw.handoff,
    )
    rec.rld_tokens = sum(w.startswith("rld") for w in rec.token_workers)
    rec.md_tokens = sum(w.startswith("md") for w in rec.token_workers)
    rec.p_tokens = sum(w.startswith("p") for w in rec.token_workers)
    rec.decode_batch = _decode_batch(evs)
    rec.workers = _workers(route_ev, evs)
    _bytes(evs, rec)
    _md_cache(evs, rec)
    _handoff(evs, rec, t0)
    _spans(evs, rec, t0)
    rec.fallbacks = [fallback_cause(e) for e in evs if e["event"] in FALLBACK_EVENTS]
    return rec


def fallback_cause(e: dict) -> str:
    """The cause of one fallback event: its name, with `:reason` for completed_on_rld and route_fallback
    (md_never_ready, finished_first, or the first clause of a failure text, cut to CAUSE_REASON_CHARS)."""
    reason = e.get("reason")
    if e["event"] not in REASON_KEYED or not reason:
        return e["event"]
    return f"{e['event']}:{str(reason).split(': ')[0][:CAUSE_REASON_CHARS]}"


def collect(run_dir: Path) -> tuple[list[RequestRecord], list[dict]]:
    """Every variant's records and merged events, from the raw files of run_dir."""
    wpath = run_dir / "workload.jsonl"
    workload = {r.request_id: r for r in read_workload(wpath)} if wpath.exists() else {}
    records, events = [], []
    for vdir in sorted((run_dir / "variants").glob("*")):
        variant = vdir.name
        evs = variant_events(vdir, variant)
        events += evs
        by_req = defaultdict(list)
        for e in evs:
            if e.get("request_id"):
                by_req[e["request_id"]].append(e)
        raws = clientlog.read(vdir / "client.jsonl")
        raws += _missing(variant, raws, workload)
        for raw in raws:
            records.append(build_record(raw, workload.get(raw.request_id), by_req.get(raw.router_id, [])))
    return records, sorted(events, key=lambda e: e["t_ns"])


MISSING = "no record: the load generator stopped before it recorded this request (killed or crashed)"


def _missing(variant: str, raws: list[ClientRecord], workload: dict[str, WorkloadRequest]) -> list[ClientRecord]:
    """A record for every workload request the variant's client log lacks, so the summary counts against
    the workload, never against what happened to be written (a client log ends early when its writer dies)."""
    seen = {r.request_id for r in raws}
    t_ref = min((r.t_send_ns for r in raws), default=0)  # inside the window: the duration stays the log's
    mode = raws[0].mode if raws else variant
    return [
        ClientRecord(
            request_id=w.request_id,
            router_id=f"{variant}.{w.request_id}",
            variant=variant,
            mode=mode,
            session=w.session,
            turn=w.turn,
            kind=w.kind,
            max_tokens=w.max_tokens,
            prompt_tokens=w.prompt_len,
            tokens=[],
            error=MISSING,
            t_send_ns=t_ref,
            t_done_ns=t_ref,
        )
        for w in workload.values()
        if w.request_id not in seen
    ]


def write(run_dir: Path, records: list[RequestRecord], events: list[dict]) -> None:
    """requests.jsonl and events.jsonl."""
    # each record's fields as they are, not asdict's deep copy of every token list (~4 s at 30,000 records):
    # the fields hold JSON values only, so the text is the same
    names = [f.name for f in fields(RequestRecord)]
    (run_dir / "requests.jsonl").write_text(
        "".join(json.dumps({k: getattr(r, k) for k in names}, separators=(",", ":")) + "\n" for r in records)
    )
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


def read(run_dir: Path) -> list[RequestRecord]:
    """requests.jsonl back as records."""
    return [RequestRecord(**d) for d in _read_jsonl(run_dir / "requests.jsonl")]


def read_events(run_dir: Path) -> list[dict]:
    """events.jsonl back (every variant's events, tagged with `variant`, ordered by t_ns)."""
    return _read_jsonl(run_dir / "events.jsonl")
