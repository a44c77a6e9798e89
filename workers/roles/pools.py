"""The router's view of its worker pools: what each worker has in flight from this router, which failed lately,
and what each MD's DRC is expected to hold.

Responsible for: load accounting per worker (sessions and tokens, taken when the router opens a session or
a prefill and given back when it ends; a pick counts as a session on its worker from the moment it is made
until that session is taken, so requests that arrive together do not all see the same idle worker), marking a
worker that failed as down for a while (DOWN_S) so new requests go to the others, one DRC mirror per MD, and
turning those into the `WorkerLoad`s the pure picks of routing.py decide on.
With pick_md: line_measured, also what each line measures (`LineBook`: P's latest estimate per line, and
how long each has gone without a fresh one).
Not responsible for: the picks themselves (routing.pick_p / pick_rld / pick_md), the route (routing.decide_route)
or carrying a request out (router.py).

The router is the only source of a worker's load here: every request of the deployment passes through it, so
what it has in flight on a worker is what the worker has (the testbed runs one router).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

from workers.roles.config import DeploymentConfig, WorkerConfig
from workers.roles.routing import DRCMirror, LineContext, LineView, Pick, WorkerLoad, pick_md, pick_p, pick_rld
from workers.roles.wanestimate import WanEstimate

DOWN_S = 5.0  # a worker whose call failed gets no new request for this long (then it is tried again)
# A pick not followed by its session within this long (the request failed before opening it) stops counting.
# Pick to take is milliseconds (the route, then the streams open without waiting for the worker).
PICKED_S = 5.0


@dataclass
class _Held:
    sessions: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class Choice:
    """A worker picked for one request: the worker, why, and what every candidate looked like then."""

    worker: WorkerConfig
    pick: Pick
    loads: tuple[WorkerLoad, ...]
    tokens: int = 0  # what the request will hold there (counted in the worker's load until it is taken up)

    def record(self) -> dict:
        """For the route event: the worker, the reason, [name, sessions, tokens, hit] per candidate, and
        (line_measured) each candidate's expected cost (ms)."""
        out = {
            "worker": self.worker.name,
            "reason": self.pick.reason,
            "loads": [
                [w.name, w.sessions, w.tokens, w.hit_tokens] + ([] if w.healthy else ["down"]) for w in self.loads
            ],
        }
        if self.pick.costs_ms:
            out["costs_ms"] = {name: round(ms, 3) for name, ms in self.pick.costs_ms}
        return out


class LineBook:
    """What each line measures, as P's replies report it (PrefillReply.wan: the one WAN, line ""; .lines: each
    named line): the latest estimate per line, from whichever P sent it; and when each named line was last
    measured afresh (a P's sample count of it moved) or given a request to explore it. Thread-safe."""

    def __init__(self, cfg: DeploymentConfig, clock=time.monotonic):
        self.cfg, self.clock = cfg, clock
        self._lock = threading.Lock()
        self._estimates: dict[str, WanEstimate] = {}
        self._samples: dict[tuple[str, str], int] = {}  # (P, line) -> its sample count last reported
        start = clock()
        self._seen = {md.line: start for md in cfg.md if md.line}  # line -> last fresh measurement or explore

    @property
    def names(self) -> list[str]:
        """The named lines, in the MDs' order ([] for the one WAN)."""
        return list(self._seen)

    def report(self, p: str, line: str, estimate: WanEstimate) -> None:
        """P's estimate of a line, from one of its replies."""
        with self._lock:
            self._estimates[line] = estimate
            if self._samples.get((p, line)) != estimate.samples:
                self._samples[(p, line)] = estimate.samples
                if line in self._seen:
                    self._seen[line] = self.clock()

    def estimate(self, line: str) -> WanEstimate | None:
        with self._lock:
            return self._estimates.get(line)

    def view(self, line: str) -> LineView | None:
        """A named line as the picks see it (its static figures: policy.lines, else policy.wan_rate_mbit with no
        delay); None for the one WAN."""
        if line not in self._seen:
            return None
        static = self.cfg.policy.lines.get(line)
        rate, delay = (static.rate_mbit, static.delay_ms) if static else (self.cfg.policy.wan_rate_mbit, 0.0)
        with self._lock:
            return LineView(line, rate, delay, self._estimates.get(line), self.clock() - self._seen[line])

    def explored(self, line: str) -> None:
        """A request was sent to explore the line: its next exploration waits another policy.line_explore_s."""
        with self._lock:
            if line in self._seen:
                self._seen[line] = self.clock()

    def record(self) -> dict:
        """For the route event: each named line's figures the pick rested on."""
        out = {}
        for name in self.names:
            v = self.view(name)
            e = v.estimate if v.measured else None
            out[name] = {
                "source": "measured" if e else "static",
                "rate_mbit": round(e.rate_mbit if e else v.rate_mbit, 3),
                "delay_ms": round(e.rtt_ms / 2 if e else v.delay_ms, 3),  # one way
                "congested": bool(e and e.congested),
                "samples": e.samples if e else 0,
                "idle_s": round(v.idle_s, 3),
            }
        return out


class Pools:
    """cfg: the deployment (its pools and policy); clock: seconds, monotonic (tests pass their own)."""

    def __init__(self, cfg: DeploymentConfig, clock=time.monotonic):
        self.cfg, self.clock = cfg, clock
        self._lock = threading.Lock()
        self._held = {w.name: _Held() for w in cfg.workers}
        self._down_until: dict[str, float] = {}
        # picks not yet taken up by a session: (when, the prompt or KV tokens the session will hold there)
        self._picked: dict[str, deque[tuple[float, int]]] = {w.name: deque() for w in cfg.workers}
        self._turns = {role: 0 for role in ("p", "rld", "md")}
        self.mirrors = {w.name: DRCMirror(cfg.block_size, w.capacity_tokens // cfg.block_size) for w in cfg.md}
        # pick_p cache_aware: what each P prefilled (its own prefix cache), as the MDs' mirrors
        p_aware = cfg.policy.pick_p == "cache_aware"
        self.p_mirrors = {
            w.name: DRCMirror(cfg.block_size, w.capacity_tokens // cfg.block_size) for w in cfg.p if p_aware
        }
        self.lines = LineBook(cfg, clock)

    # ------------------------------------------------------------ picks

    def choose(
        self,
        role: str,
        hits: dict[str, int] | None = None,
        kv_bytes: dict[str, int] | None = None,
        tokens: int = 0,
    ) -> Choice:
        """Pick a worker of a pool by the deployment's policy (hits: MD name -> expected DRC hit; kv_bytes: MD
        name -> the KV the request would send it, for line_measured; tokens: what the request will hold there,
        counted in the worker's load from the pick, not only once its session or prefill starts: requests that
        arrive together would otherwise all see the same worker as the least loaded)."""
        policy = self.cfg.policy
        lines = self._line_context(kv_bytes or {}) if role == "md" and policy.pick_md == "line_measured" else None
        with self._lock:  # look and pick at once: the next request sees this one's pick
            loads = tuple(self._load(w, (hits or {}).get(w.name, 0)) for w in self.cfg.pool(role))
            turn = self._turns[role]
            self._turns[role] += 1
            if role == "p":
                pick = pick_p(list(loads), policy.pick_p, turn)
            elif role == "rld":
                pick = pick_rld(list(loads), policy.pick_rld, turn)
            else:
                cap = policy.md_load_cap or self.cfg.decode.max_sessions
                pick = pick_md(
                    list(loads), policy.pick_md, turn, cap, policy.md_balance_abs, policy.md_balance_rel, lines
                )
            self._picked[pick.worker].append((self.clock(), tokens))
        worker = self.cfg.worker(pick.worker)
        if pick.reason == "explore":
            self.lines.explored(worker.line)
        return Choice(worker, pick, loads, tokens)

    def _line_context(self, kv_bytes: dict[str, int]) -> LineContext:
        policy = self.cfg.policy
        return LineContext(
            {name: self.lines.view(name) for name in self.lines.names},
            {md.name: md.line for md in self.cfg.md},
            kv_bytes,
            policy.line_ms_per_session,
            policy.line_explore_s,
        )

    def release(self, choice: Choice) -> None:
        """A pick the request will not use (its route did not need that pool after all)."""
        with self._lock:
            self._forget_pick(choice.worker.name, choice.tokens)

    def hits(self, prompt: list[int]) -> dict[str, int]:
        """MD name -> the tokens of prompt its DRC is expected to hold (the router's mirrors)."""
        return {name: mirror.match(prompt) for name, mirror in self.mirrors.items()}

    def p_hits(self, prompt: list[int]) -> dict[str, int] | None:
        """P name -> the tokens of prompt its own prefix cache is expected to hold (pick_p cache_aware; else None)."""
        return {name: mirror.match(prompt) for name, mirror in self.p_mirrors.items()} or None

    def prefilled(self, worker: WorkerConfig, prompt: list[int]) -> None:
        """P prefilled prompt: its cache holds the prompt's whole blocks (pick_p cache_aware's mirror)."""
        if (mirror := self.p_mirrors.get(worker.name)) is not None:
            mirror.insert(prompt)

    def _load(self, w: WorkerConfig, hit: int) -> WorkerLoad:
        """A worker's load now (the caller holds the lock): its sessions, and its picks not yet taken up."""
        held, now = self._held[w.name], self.clock()
        picked = self._picked[w.name]
        while picked and picked[0][0] <= now - PICKED_S:
            picked.popleft()
        healthy = self._down_until.get(w.name, 0.0) <= now
        pending = sum(tokens for _, tokens in picked)
        return WorkerLoad(w.name, held.sessions + len(picked), held.tokens + pending, w.capacity_tokens, healthy, hit)

    def _forget_pick(self, name: str, tokens: int) -> None:
        """The pick that became a session (or was released): the oldest of those tokens, else the oldest."""
        picked = self._picked[name]
        for i, (_, t) in enumerate(picked):
            if t == tokens:
                del picked[i]
                return
        if picked:
            picked.popleft()

    # ------------------------------------------------------------ accounting

    @contextmanager
    def holding(self, worker: WorkerConfig, tokens: int):
        """A session (or a prefill) of `tokens` on worker for the duration of the block."""
        self.take(worker, tokens)
        try:
            yield
        finally:
            self.give_back(worker, tokens)

    def take(self, worker: WorkerConfig, tokens: int) -> None:
        with self._lock:
            self._forget_pick(worker.name, tokens)  # the pick became this session
            held = self._held[worker.name]
            held.sessions += 1
            held.tokens += tokens

    def give_back(self, worker: WorkerConfig, tokens: int) -> None:
        with self._lock:
            held = self._held[worker.name]
            held.sessions -= 1
            held.tokens -= tokens

    def failed(self, worker: WorkerConfig) -> None:
        """A call to worker failed as if it were gone (UNAVAILABLE): no new request goes there for DOWN_S."""
        with self._lock:
            self._down_until[worker.name] = self.clock() + DOWN_S

    def down(self) -> list[str]:
        now = self.clock()
        with self._lock:
            return sorted(n for n, t in self._down_until.items() if t > now)
