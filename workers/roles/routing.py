"""The route decision of the router, as policy apart from plumbing (pure: no sockets, no gRPC).

Responsible for: the route names (`Route`), `decide_route` (mode, prompt, the MD's
expected DRC hit, the WAN estimate -> a `RouteDecision`), the WAN transfer-time
estimate it rests on (static or measured), and `DRCMirror`, the router's own
estimate of what the MD's DRC holds.
Also the picks of a worker within a pool (pick_p, pick_rld, pick_md), among them
pick_md's line_measured: where each MD sits behind a line of its own, the MD whose
line delivers the request's KV soonest (`LineView`, `LineContext`).
Not responsible for: carrying a decision out (router.py) or measuring the WAN
(wanestimate.py).

Routes: colocated (RLD prefills and decodes), p-rld (pd-intra), p-md
(pd-cross, or pdd with a high DRC hit), p-rld-md (pdd), p-rld-singular,
p-rld-ablation, p-rld-fallback (a pdd P->MD request whose WAN target failed
before its first token, re-routed to the RLD by the router).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum

from workers.roles.wanestimate import WanEstimate


class Route(StrEnum):
    COLOCATED = "colocated"
    P_RLD = "p-rld"
    P_MD = "p-md"
    P_RLD_MD = "p-rld-md"
    P_RLD_SINGULAR = "p-rld-singular"
    P_RLD_ABLATION = "p-rld-ablation"
    P_RLD_FALLBACK = "p-rld-fallback"


ENDS_AT_MD = (Route.P_MD, Route.P_RLD_MD)  # the pipelines whose sequence the MD's DRC keeps


@dataclass(frozen=True)
class RouteDecision:
    """route: see the module docstring; md_cached_tokens: DRC hit (tokens); wan_estimate_ms: the estimate used
    (inf: the measured line is congested); wan_source: static | measured"""

    route: Route
    md_cached_tokens: int
    wan_estimate_ms: float
    singular: bool
    use_drc: bool = True  # False in pd-cross: the naive baseline sends the whole prompt
    wan_source: str = "static"


@dataclass(frozen=True)
class LineView:
    """What the router knows of one line when it picks (pick_md: line_measured): name; rate_mbit, delay_ms: its
    static figures (policy.lines; delay one way); estimate: P's latest measurement of it (None: none yet);
    idle_s: since its last fresh measurement, or since a request was sent to explore it."""

    name: str
    rate_mbit: float
    delay_ms: float = 0.0
    estimate: WanEstimate | None = None
    idle_s: float = 0.0

    @property
    def measured(self) -> bool:
        return self.estimate is not None and self.estimate.measured

    def transfer_ms(self, kv_bytes: int) -> tuple[float, str]:
        """The expected transfer time of kv_bytes on this line and what it rests on: measured once P has
        measured the line (its rate and half its smoothed RTT, a queue included), else static (serialisation
        at rate_mbit plus delay_ms)."""
        if self.measured:
            return self.estimate.transfer_ms(kv_bytes), "measured"
        return kv_bytes * 8 / (self.rate_mbit * 1e3) + self.delay_ms, "static"


def wan_transfer_ms(kv_bytes: int, policy, wan: WanEstimate | None, line: LineView | None = None) -> tuple[float, str]:
    """The estimated WAN transfer time of kv_bytes and what it rests on (pure). measured: P's TCP_INFO
    figures once it has any (a congested line: inf, so the request goes P->RLD->MD); static otherwise:
    serialisation at policy.wan_rate_mbit, or at the line's static rate where the MD sits behind a named
    line (no delay term either way, so a route decision means the same on one WAN and on several lines)."""
    if policy.wan_estimate == "measured" and wan is not None and wan.measured:
        return (math.inf if wan.congested else wan.transfer_ms(kv_bytes)), "measured"
    rate_mbit = policy.wan_rate_mbit if line is None else line.rate_mbit
    return kv_bytes * 8 / (rate_mbit * 1e3), "static"


def decide_route(
    mode: str,
    prompt_tokens: int,
    max_tokens: int,
    md_cached_tokens: int,
    kv_bytes_per_token: int,
    policy,
    wan: WanEstimate | None = None,
    line: LineView | None = None,
) -> RouteDecision:
    """Pure route decision for one request (wan: the chosen MD's line as P measured it; line: its static
    figures, where it is a named line of policy.lines)."""
    if mode == "colocated":
        return RouteDecision(Route.COLOCATED, 0, 0.0, False)
    if mode == "pd-intra":
        return RouteDecision(Route.P_RLD, 0, 0.0, False)
    uncached = prompt_tokens - (md_cached_tokens if mode == "pdd" else 0)
    est_ms, source = wan_transfer_ms(uncached * kv_bytes_per_token, policy, wan, line)
    if mode == "pd-cross":
        return RouteDecision(Route.P_MD, 0, est_ms, False, use_drc=False)
    singular = uncached >= policy.singular_min_uncached_tokens and max_tokens <= policy.singular_max_output_tokens
    if est_ms <= policy.direct_max_transfer_ms and not singular:
        return RouteDecision(Route.P_MD, md_cached_tokens, est_ms, False, wan_source=source)
    if singular:
        return RouteDecision(Route.P_RLD_SINGULAR, md_cached_tokens, est_ms, True, wan_source=source)
    if policy.ablation_local_rld:
        return RouteDecision(Route.P_RLD_ABLATION, md_cached_tokens, est_ms, False, wan_source=source)
    return RouteDecision(Route.P_RLD_MD, md_cached_tokens, est_ms, False, wan_source=source)


class DRCMirror:
    """The router's estimate of what the MD's DRC holds, without a WAN round trip per request: the
    block-aligned prefixes of every sequence that ended at the MD (PDD ends every pipeline there so that
    the MD's cache follows P's), as a chain of block hashes, least recently used evicted beyond the MD's
    capacity. Used for the route decision only; P sends the WAN copy from the MD's own answer."""

    def __init__(self, block_size: int, capacity_blocks: int):
        self.block_size, self.capacity_blocks = block_size, max(1, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def _chain(self, tokens: list[int]) -> list[int]:
        bs, h, out = self.block_size, 0, []
        for i in range(0, len(tokens) - len(tokens) % bs, bs):
            h = hash((h, tuple(tokens[i : i + bs])))
            out.append(h)
        return out

    def match(self, prompt: list[int]) -> int:
        """Tokens of prompt the MD is expected to hold (whole blocks, at most len - 1, as the MD matches)."""
        n = 0
        with self._lock:
            for h in self._chain(prompt[: len(prompt) - 1]):
                if h not in self._blocks:
                    break
                self._blocks.move_to_end(h)
                n += self.block_size
        return n

    def insert(self, tokens: list[int]) -> None:
        with self._lock:
            for h in self._chain(tokens):
                self._blocks[h] = None
                self._blocks.move_to_end(h)
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)


# ---------------------------------------------------------------- which worker of a pool


@dataclass(frozen=True)
class WorkerLoad:
    """What the router knows of one worker when it picks: name; sessions: its requests in flight from this
    router (P: prefills, RLD/MD: decode sessions); tokens: P: prompt tokens it still has to prefill, RLD/MD:
    KV slots its sessions reserved (prompt + max_tokens); capacity_tokens: its KV slots; healthy: no recent
    failure; hit_tokens: the prompt's prefix its cache is expected to hold (tokens; MD: its DRC, P: its own)."""

    name: str
    sessions: int = 0
    tokens: int = 0
    capacity_tokens: int = 0
    healthy: bool = True
    hit_tokens: int = 0

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.tokens


@dataclass(frozen=True)
class Pick:
    """The worker picked and why: only (a pool of one, or one candidate), least_load, round_robin, affinity
    (the longest cached prefix), balance (the pool out of balance: the least loaded), cap (the affine worker
    at its load cap: the least loaded below it), unhealthy (every worker failed lately: the least loaded),
    line (line_measured: the least expected cost), explore (line_measured: a line gone stale). costs_ms:
    line_measured, (MD, expected cost) per candidate."""

    worker: str
    reason: str
    costs_ms: tuple[tuple[str, float], ...] = ()


def _candidates(loads: list[WorkerLoad]) -> tuple[list[WorkerLoad], bool]:
    healthy = [w for w in loads if w.healthy]
    return (healthy, True) if healthy else (list(loads), False)


def _least(loads: list[WorkerLoad], key) -> WorkerLoad:
    """The worker of the least key; ties to the earliest in the pool (min keeps the first of equal keys)."""
    return min(loads, key=key)


def _first_pass(loads: list[WorkerLoad]) -> tuple[list[WorkerLoad], Pick | None]:
    if not loads:
        raise ValueError("a pool needs at least one worker")
    if len(loads) == 1:
        return loads, Pick(loads[0].name, "only")
    cands, healthy = _candidates(loads)
    if not healthy:
        return cands, Pick(_least(cands, lambda w: w.sessions).name, "unhealthy")
    if len(cands) == 1:
        return cands, Pick(cands[0].name, "only")
    return cands, None


def _round_robin(cands: list[WorkerLoad], turn: int, **_) -> Pick:
    return Pick(cands[turn % len(cands)].name, "round_robin")


def _p_least_load(cands: list[WorkerLoad], turn: int, **_) -> Pick:
    """The fewest prompt tokens still to prefill, then the fewest prefills."""
    return Pick(_least(cands, lambda w: (w.tokens, w.sessions)).name, "least_load")


def _rld_least_load(cands: list[WorkerLoad], turn: int, **_) -> Pick:
    """The most free KV, then the fewest sessions."""
    return Pick(_least(cands, lambda w: (-w.free_tokens, w.sessions)).name, "least_load")


def _md_least_load(cands: list[WorkerLoad], turn: int, **_) -> Pick:
    return Pick(_least(cands, lambda w: (w.sessions, w.tokens)).name, "least_load")


def _p_cache_aware(cands: list[WorkerLoad], turn: int, **_) -> Pick:
    """The P expected to hold the longest prefix of the prompt in its own prefix cache (hit_tokens: the router's
    mirror of what each P prefilled), ties to the fewest prompt tokens still to prefill, then the fewest prefills:
    a session's next turn goes where its context is. No balance rule (pick_md's): a P's queue of cached turns is
    short work, and at published scale (docs/simulator.md, sweep (c)) pick_md's thresholds moved 3 of 4 turns off
    their P, and a pick by expected end (queue + uncached tokens, as Mooncake's conductor) half of them, each
    recomputing its context. Reason affinity where the pick holds more of the prompt than some other P."""
    best = _least(cands, lambda w: (-w.hit_tokens, w.tokens, w.sessions))
    more = best.hit_tokens > min(w.hit_tokens for w in cands)
    return Pick(best.name, "affinity" if more else "least_load")


def _md_cache_aware(
    cands: list[WorkerLoad], turn: int, load_cap: int, balance_abs: int, balance_rel: float, **_
) -> Pick:
    """As SGLang's cache-aware router and llm-d's prefix scorer: the longest expected DRC hit, ties to the least
    loaded; but the least loaded while the pool is out of balance (the busiest has more than balance_abs
    sessions more than the idlest and more than balance_rel times as many), and never an MD at load_cap
    sessions while another is below it."""
    below = [w for w in cands if w.sessions < load_cap] or cands
    busiest, idlest = max(w.sessions for w in cands), min(w.sessions for w in cands)
    if busiest - idlest > balance_abs and busiest > balance_rel * idlest:
        return Pick(_least(below, lambda w: (w.sessions, w.tokens)).name, "balance")
    best = _least(cands, lambda w: (-w.hit_tokens, w.sessions, w.tokens))
    if best not in below:
        return Pick(_least(below, lambda w: (-w.hit_tokens, w.sessions, w.tokens)).name, "cap")
    return Pick(best.name, "affinity" if best.hit_tokens > 0 else "least_load")


@dataclass(frozen=True)
class LineContext:
    """What line_measured picks on beyond the loads: views: line name -> LineView; line_of: MD name -> its line;
    kv_bytes: MD name -> the KV this request would send it (the prompt less that MD's expected DRC hit);
    ms_per_session: an MD's load as time (policy.line_ms_per_session); explore_s: policy.line_explore_s."""

    views: dict[str, LineView]
    line_of: dict[str, str]
    kv_bytes: dict[str, int]
    ms_per_session: float = 0.0
    explore_s: float = 0.0

    def view(self, md: str) -> LineView:
        return self.views[self.line_of[md]]

    def cost_ms(self, w: WorkerLoad) -> float:
        """The request's expected KV transfer on w's line plus w's load (ms)."""
        return self.view(w.name).transfer_ms(self.kv_bytes.get(w.name, 0))[0] + self.ms_per_session * w.sessions

    def stale(self, w: WorkerLoad) -> bool:
        return self.explore_s > 0 and self.view(w.name).idle_s > self.explore_s


def _md_line_measured(cands: list[WorkerLoad], turn: int, load_cap: int, lines: LineContext | None = None, **_) -> Pick:
    """The MD whose line delivers this request's KV soonest, its load counted as time: the least
    LineContext.cost_ms, never an MD at load_cap while another is below it (the balance rule does not apply:
    it would undo the line's preference). Except: an MD below the cap behind a line gone stale (idle longer
    than explore_s) takes the request, the stalest line first, so every line keeps a fresh estimate."""
    if lines is None:
        raise ValueError("pick_md line_measured needs the lines' context")
    below = [w for w in cands if w.sessions < load_cap] or cands
    costs = tuple((w.name, lines.cost_ms(w)) for w in cands)
    stale = [w for w in below if lines.stale(w)]
    if stale:
        w = _least(stale, lambda w: (-lines.view(w.name).idle_s, w.sessions, w.tokens))
        return Pick(w.name, "explore", costs)
    best = _least(below, lambda w: (lines.cost_ms(w), w.sessions))
    overall = _least(cands, lambda w: (lines.cost_ms(w), w.sessions))
    return Pick(best.name, "line" if best is overall else "cap", costs)


# The pick policies of each pool (workers.roles.config's PickP, PickRLD, PickMD), by name: the one place a
# policy's name becomes its function.
P_PICKS = {"cache_aware": _p_cache_aware, "least_load": _p_least_load, "round_robin": _round_robin}
RLD_PICKS = {"least_load": _rld_least_load, "round_robin": _round_robin}
MD_PICKS = {
    "cache_aware": _md_cache_aware,
    "least_load": _md_least_load,
    "round_robin": _round_robin,
    "line_measured": _md_line_measured,
}


def pick_p(loads: list[WorkerLoad], policy: str, turn: int) -> Pick:
    """The P that prefills (P_PICKS[policy]: cache_aware, least_load or round_robin)."""
    cands, pick = _first_pass(loads)
    return pick if pick is not None else P_PICKS[policy](cands, turn)


def pick_rld(loads: list[WorkerLoad], policy: str, turn: int) -> Pick:
    """The RLD (RLD_PICKS[policy]: least_load or round_robin)."""
    cands, pick = _first_pass(loads)
    return pick if pick is not None else RLD_PICKS[policy](cands, turn)


def pick_md(
    loads: list[WorkerLoad],
    policy: str,
    turn: int,
    load_cap: int,
    balance_abs: int,
    balance_rel: float,
    lines: LineContext | None = None,
) -> Pick:
    """The MD a request ends at (MD_PICKS[policy]: cache_aware, least_load, round_robin or line_measured, which
    needs lines)."""
    cands, pick = _first_pass(loads)
    if pick is not None:
        return pick
    return MD_PICKS[policy](
        cands, turn, load_cap=load_cap, balance_abs=balance_abs, balance_rel=balance_rel, lines=lines
    )
