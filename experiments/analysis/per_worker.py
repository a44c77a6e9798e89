"""Each worker of a variant on its own: what it served, its queue, its load, its cache hits, its KV traffic.

Responsible for: one `WorkerFigures` per P, RLD and MD worker of a variant (pure functions over the
variant's request records and events), every worker its deployment had - one that served nothing
included, with zeros - and any other the events name. The router is left out: its figures are the
variant's own (experiments.analysis.metrics).
Not responsible for: reading files (experiments.analysis.records, experiments.analysis.runmeta), the per-variant figures
(experiments.analysis.metrics, transfers, occupancy) or rendering (experiments.analysis.summary_md).

Each figure, its unit and its source (every request of the variant counts, warm-ups included, as in
experiments.analysis.transfers: a worker's load is everything it did):

    requests      requests whose record names it among its `workers` (the router's pick, a fallback's)
    sessions      P: prefills it began (prefill_arrival); RLD, MD: decode sessions it opened (decode_open)
    tokens        output tokens the client received from it (the records' token_workers; token 0 counts
                  for the P that prefilled it); token_share: of the variant's
    queue_ms      P: prefill_arrival -> prefill_start, the wait for its engine (one prefill at a time);
                  RLD, MD: decode_arrival -> decode_open, the wait to be admitted (the engine's lock, which a
                  batched decode step or a local prefill holds). n, p50, p90, max (ms)
    busy_pct      P: its prefills' prefill_start -> prefill_done, summed, in % of the window; None for a
                  decode worker (its steps are batched: no event gives one session's share of a step)
    occupancy     RLD, MD: open sessions and the KV slots they reserve, time-weighted mean and max over the
                  window (experiments.analysis.occupancy.worker_occupancy); reserved_pct_mean: that mean in % of the
                  worker's capacity_tokens. None for P. No role logs the KV blocks it holds: this is what
                  its sessions reserved, the router's own measure of a worker's load
    prefix_hit    cached / prompt tokens where its cache could answer: P's prefills (prefill_done), an RLD's
                  local prefills (decode_open source local: colocated, fallbacks, resumes), every MD
                  session (its DRC hit as the session pinned it; 0 where the route asked for no DRC,
                  pd-cross). n, mean over them, token_weighted (sum cached / sum prompt)
    kv_sent       per path (fast, wan; an RLD's handoff in the `kv` mode): transfers by outcome, kv_bytes
                  delivered, wire_bytes written (experiments.analysis.transfers), and `to`: per receiving worker
                  (kv_send_start's target, named through the deployment) transfers and kv_bytes delivered
    kv_received   per kind (prompt, handoff): transfers it held whole (kv_recv_end), kv_bytes, wire_bytes
    handoffs      sent: handoffs it completed (a final handoff_end), payload_bytes_sent (every step's);
                  received: requests whose handoff it absorbed (handoff_recv_end)
    relay_outputs sent (relay_output_sent) and received (relay_output): a request the RLD finished alone
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import asdict, dataclass, field

from experiments.analysis import occupancy, transfers
from experiments.spec.deployment import KV_PORTS, role_of, worker_ip
from experiments.rundir.metadata import VariantRecord
from experiments.analysis.metrics import percentile
from experiments.analysis.records import RequestRecord
from experiments.analysis.runmeta import WorkerSetup

ROLES = ("p", "rld", "md")
SENT_PATHS = {"p": ("fast", "wan"), "rld": ("handoff",), "md": ()}  # the KV paths each role sends on


@dataclass
class Limits:
    """What the worker was given (experiments.analysis.runmeta.WorkerSetup; None: not known, or not enforced)."""

    capacity_tokens: int | None = None
    threads: int | None = None
    cpus: float | None = None
    memory_mb: int | None = None


@dataclass
class WorkerFigures:
    """One worker of one variant (see the module docstring for each figure's unit and source)."""

    worker: str
    role: str
    limits: Limits
    requests: int = 0
    sessions: int = 0
    tokens: int = 0
    token_share: float = 0.0
    queue_ms: dict = field(default_factory=dict)
    busy_pct: float | None = None
    occupancy: dict | None = None
    prefix_hit: dict = field(default_factory=dict)
    kv_sent: dict = field(default_factory=dict)
    kv_received: dict = field(default_factory=dict)
    handoffs: dict = field(default_factory=dict)
    relay_outputs: dict = field(default_factory=dict)


@dataclass
class VariantView:
    """What each worker's figures read of its variant: every event (ordered by t_ns), its window, the KV
    transfers sent in it (experiments.analysis.transfers) and KV address -> worker (kv_names)."""

    events: list[dict]
    window: VariantRecord | None
    sent: list[transfers.Transfer]
    kv_names: dict[str, str]


def emitter(e: dict) -> str:
    """The worker that wrote an event: its `worker`, except the router's, whose `worker` may name the worker
    the event is about (session_open, first_token)."""
    return "router" if e.get("role") == "router" else str(e.get("worker", ""))


def quantiles(xs: list[float]) -> dict:
    """{"n", "p50", "p90", "max"} (None without values)."""
    return {
        "n": len(xs),
        "p50": percentile(xs, 50) if xs else None,
        "p90": percentile(xs, 90) if xs else None,
        "max": max(xs) if xs else None,
    }


def waits_ms(evs: list[dict], start: str, end: str) -> list[float]:
    """ms from each `start` event of a request to its next `end` event (the n-th start pairs with the n-th end)."""
    open_: dict[str, deque] = defaultdict(deque)
    out = []
    for e in evs:
        if e["event"] == start:
            open_[e.get("request_id")].append(e["t_ns"])
        elif e["event"] == end and open_[e.get("request_id")]:
            out.append((e["t_ns"] - open_[e.get("request_id")].popleft()) / 1e6)
    return out


def hit(pairs: list[tuple[int, int]]) -> dict:
    """{"n", "mean", "token_weighted"} of (cached, prompt) token pairs with a prompt."""
    pairs = [(c, n) for c, n in pairs if n]
    return {
        "n": len(pairs),
        "mean": sum(c / n for c, n in pairs) / len(pairs) if pairs else None,
        "token_weighted": sum(c for c, _ in pairs) / sum(n for _, n in pairs) if pairs else None,
    }


def _p_hits(evs: list[dict]) -> dict:
    done = [e for e in evs if e["event"] == "prefill_done"]
    cached = [(e.get("cached_tokens") or 0, e.get("computed_tokens") or 0) for e in done]
    return hit([(c, c + n) for c, n in cached])


def _decode_hits(evs: list[dict], role: str) -> dict:
    prompt = {e.get("request_id"): e.get("prompt_tokens") or 0 for e in evs if e["event"] == "decode_arrival"}
    opens = [e for e in evs if e["event"] == "decode_open" and (role == "md" or e.get("source") == "local")]
    return hit([(e.get("cached_tokens") or 0, prompt.get(e.get("request_id"), 0)) for e in opens])


def window_ns(events: list[dict], window: VariantRecord | None) -> int:
    """The variant's window (ns): t_ready_ns .. t_end_ns where recorded, else its first to last event."""
    if window and window.t_end_ns and (window.t_ready_ns or window.t_start_ns):
        return window.t_end_ns - (window.t_ready_ns or window.t_start_ns)
    return events[-1]["t_ns"] - events[0]["t_ns"] if events else 0


def kv_sent(sent: list[transfers.Transfer], paths: tuple[str, ...], names: dict[str, str]) -> dict:
    """path -> {transfers, ok, failed, cancelled, unfinished, kv_bytes, wire_bytes, to: {worker: {transfers,
    kv_bytes}}}; names: KV address -> worker."""
    out = {}
    for path in paths:
        mine = [t for t in sent if t.path == path]
        by = Counter(t.outcome for t in mine)
        to: dict[str, dict] = {}
        for t in mine:
            row = to.setdefault(names.get(t.target or "", t.target or "?"), {"transfers": 0, "kv_bytes": 0})
            row["transfers"] += 1
            row["kv_bytes"] += t.kv_bytes if t.outcome == "ok" else 0
        out[path] = {
            "transfers": len(mine),
            **{k: by[k] for k in ("ok", "failed", "cancelled", "unfinished")},
            "kv_bytes": sum(t.kv_bytes for t in mine if t.outcome == "ok"),
            "wire_bytes": sum(t.wire_bytes for t in mine),
            "to": dict(sorted(to.items())),
        }
    return out


def kv_received(evs: list[dict]) -> dict:
    """kind -> {transfers, kv_bytes, wire_bytes} of the transfers the worker held whole (kv_recv_end)."""
    out: dict[str, dict] = {}
    for e in evs:
        if e["event"] == "kv_recv_end":
            row = out.setdefault(e.get("kind") or "?", {"transfers": 0, "kv_bytes": 0, "wire_bytes": 0})
            row["transfers"] += 1
            row["kv_bytes"] += e.get("kv_bytes") or 0
            row["wire_bytes"] += e.get("wire_bytes") or 0
    return dict(sorted(out.items()))


def handoffs(evs: list[dict]) -> dict:
    ends = [e for e in evs if e["event"] == "handoff_end"]
    return {
        "sent": sum(1 for e in ends if e.get("final")),
        "payload_bytes_sent": sum(e.get("payload_bytes") or 0 for e in ends),
        "received": len({e.get("request_id") for e in evs if e["event"] == "handoff_recv_end"}),
    }


def figures(name: str, setup: WorkerSetup | None, evs: list[dict], view: VariantView) -> WorkerFigures:
    """One worker's figures from the events it wrote (evs) and its variant's (the records' figures:
    variant_workers)."""
    role = role_of(name)
    lim = Limits(setup.capacity_tokens, setup.threads, setup.cpus, setup.memory_mb) if setup else Limits()
    sent = [t for t in view.sent if t.sender == name]
    f = WorkerFigures(name, role, lim, kv_sent=kv_sent(sent, SENT_PATHS.get(role, ()), view.kv_names))
    f.kv_received, f.handoffs = kv_received(evs), handoffs(evs)
    f.relay_outputs = {
        "sent": sum(e["event"] == "relay_output_sent" for e in evs),
        "received": sum(e["event"] == "relay_output" for e in evs),
    }
    if role == "p":
        f.sessions = sum(e["event"] == "prefill_arrival" for e in evs)
        f.queue_ms = quantiles(waits_ms(evs, "prefill_arrival", "prefill_start"))
        span = window_ns(view.events, view.window)
        busy = sum(waits_ms(evs, "prefill_start", "prefill_done"))
        f.busy_pct = 100 * busy * 1e6 / span if span else None
        f.prefix_hit = _p_hits(evs)
        return f
    f.sessions = sum(e["event"] == "decode_open" for e in evs)
    f.queue_ms = quantiles(waits_ms(evs, "decode_arrival", "decode_open"))
    f.occupancy = occupancy.worker_occupancy(view.events, name, view.window)
    cap = setup.capacity_tokens if setup else None
    f.occupancy["reserved_pct_mean"] = 100 * f.occupancy["reserved_tokens_mean"] / cap if cap else None
    f.prefix_hit = _decode_hits(evs, role)
    return f


def _order(name: str) -> tuple[int, int, str]:
    role = role_of(name)
    index = name[len(role) :]
    return (ROLES.index(role), int(index) if index.isdigit() else 0, name)


def worker_names(records: list[RequestRecord], events: list[dict], setups: list[WorkerSetup]) -> list[str]:
    """The variant's workers: its deployment's, then any other its events or records name, in role and index
    order (p1, p2, rld1, md1, ...)."""
    seen = {s.name for s in setups}
    seen |= {emitter(e) for e in events}
    seen |= {w for r in records for w in r.workers.values()}
    return sorted((n for n in seen if n and role_of(n) in ROLES), key=_order)


def kv_names(setups: list[WorkerSetup], workers: list[str]) -> dict[str, str]:
    """KV address (host:port) -> worker: the deployment's addresses; else (no deployment recorded) as
    experiments.spec.deployment derives them from topology.naming."""
    out = {s.kv_address: s.name for s in setups if s.kv_address}
    return out or {f"{worker_ip(w)}:{KV_PORTS[role_of(w)]}": w for w in workers if role_of(w) in KV_PORTS}


def variant_workers(
    records: list[RequestRecord],
    events: list[dict],
    setups: list[WorkerSetup] | None = None,
    window: VariantRecord | None = None,
) -> list[WorkerFigures]:
    """Every worker of one variant (records and events: that variant's alone; setups: its deployment,
    experiments.analysis.runmeta; window: its metadata record)."""
    setups = setups or []
    by_name = {s.name: s for s in setups}
    names = worker_names(records, events, setups)
    own: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        own[emitter(e)].append(e)
    view = VariantView(events, window, transfers.pair_transfers(events), kv_names(setups, names))
    tokens = Counter(w for r in records for w in r.token_workers)
    total = sum(tokens.values())
    out = []
    for name in names:
        f = figures(name, by_name.get(name), own[name], view)
        f.requests = sum(name in r.workers.values() for r in records)
        f.tokens, f.token_share = tokens[name], tokens[name] / total if total else 0.0
        out.append(f)
    return out


def prefill_steps(events: list[dict]) -> dict:
    """P's chunked prefill over a variant (its prefill_step events): steps, tokens per step, and the steps whose
    only chunk was a prompt's last, short one (lone_tail: a step that could not be filled, PDD.md's bathtub)."""
    steps = [e for e in events if e["event"] == "prefill_step"]
    lone = sum(bool(e.get("lone_tail")) for e in steps)
    tokens = [e.get("tokens") or 0 for e in steps]
    return {
        "steps": len(steps),
        "lone_tail_steps": lone,
        "lone_tail_share": lone / len(steps) if steps else None,
        "tokens_per_step_mean": sum(tokens) / len(steps) if steps else None,
        "shared_steps": sum(len(e.get("chunks") or ()) > 1 for e in steps),
    }


def to_json(figs: list[WorkerFigures]) -> dict[str, dict]:
    """worker -> its figures, as summary.json holds them (`variants.<v>.workers`)."""
    return {f.worker: {k: v for k, v in asdict(f).items() if k != "worker"} for f in figs}
