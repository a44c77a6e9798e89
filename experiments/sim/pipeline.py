"""The simulated PDD pipeline: each request routed as the router routes it and carried through the roles in SimPy.

Responsible for: `Simulation` (one variant: its P, RLD and MD pools, the A->B line, the MDs' prefix caches) and,
per request, its path: the route decision (workers.roles.routing.decide_route, the emulated router's own pure
function), the worker picks, P's prefill, the fast path to the RLD (the host links' KV export and import), the
WAN copy to the MD (export, line, import), eager decoding on the RLD, the handoff by token IDs (or by KV, mode
kv) and the MD's extend, the singular filter and the ablation's P->RLD; then one
experiments.analysis.records.RequestRecord per request, as the emulated run's analysis reads it.
Not responsible for: step times (the roofline, through experiments.sim.workers) or the line (experiments.sim.wan).

The decode-side hit (the MD's DRC): the workload's expected hit of a request (what an MD that saw every earlier
turn holds) where the request's previous turn ended at this MD, else what this MD holds of the session (its
last turn that ended here, or the shared system prompt). So the ablation, whose low-hit turns end on the RLD,
sees the MD's hit fall behind P's. P's own hit is the workload's expected hit (it prefilled every turn).

Times: TTFT is when the decode side holds the prompt's KV and forwards P's first token (as the emulated
client sees it: P's token reaches the client through the decode side); ttft_decode is the first token a
decode worker made. Chunked and auto handoffs are simulated as one-shot (docs/simulator.md).
"""

from __future__ import annotations

import random
import zlib
from collections import defaultdict
from dataclasses import replace

import simpy

from experiments.analysis.records import RequestRecord
from experiments.sim.config import HANDOFF_ID_BYTES, SimConfig
from experiments.sim.realcompute import kv_export_s, kv_import_s
from experiments.sim.wan import Calibration, Line
from experiments.sim.workers import DecodeWorker, PrefillWorker, Session
from experiments.spec.workload import WorkloadRequest
from workers.roles.routing import Route, decide_route


class Simulation:
    """One variant of a spec over a workload.

    cfg: the variant (experiments.sim.config.sim_config); requests: the workload (warm-up dropped: the
    system prompt is taken as cached everywhere, as after the emulated warm-up); seed: the line's jitter;
    calibration: the WAN table (None: formula only)"""

    def __init__(
        self, cfg: SimConfig, requests: list[WorkloadRequest], seed: int = 0, calibration: Calibration | None = None
    ):
        self.cfg, self.env = cfg, simpy.Environment()
        self.line = Line(self.env, cfg.line, calibration, random.Random(seed), congestion=cfg.wan_congestion)
        self.p = [PrefillWorker(self.env, w) for w in cfg.workers["p"]]
        self.rld = [DecodeWorker(self.env, w) for w in cfg.workers["rld"]]
        self.md = [DecodeWorker(self.env, w) for w in cfg.workers["md"]]
        self.requests = [r for r in requests if r.kind != "warmup"]
        self.next_turns: dict[str, list[WorkloadRequest]] = defaultdict(list)
        self.base: dict[str, int] = {}  # session -> its shared head's cached tokens (the system prompt)
        self.held: dict[str, dict[str, int]] = {m.name: {} for m in self.md}  # MD -> session -> tokens held
        self.records: list[RequestRecord] = []
        self._rr = 0

    def run(self) -> list[RequestRecord]:
        """Simulate every request to its end; the records in the workload's order."""
        ids = {r.request_id for r in self.requests}
        for r in self.requests:
            if r.after and r.after in ids:
                self.next_turns[r.after].append(r)
            else:
                self.base.setdefault(r.session, r.cached_tokens)
                self.env.process(self._client(r, r.arrival_s))
        self.env.run()
        order = {r.request_id: i for i, r in enumerate(self.requests)}
        return sorted(self.records, key=lambda rec: order[rec.request_id])

    def _client(self, req: WorkloadRequest, at_s: float):
        issue_s = self.cfg.issue_s
        if issue_s and max(at_s, self.env.now) > issue_s:  # as the load generator: this turn and the rest unsent
            self._not_issued(req, f"not issued: due past the variant's issue deadline ({issue_s:g} s)")
            return
        if at_s > self.env.now:
            yield self.env.timeout(at_s - self.env.now)
        yield from self._serve(req)
        for nxt in self.next_turns.get(req.request_id, ()):
            self.env.process(self._client(nxt, self.env.now + nxt.think_s))

    def _not_issued(self, req: WorkloadRequest, error: str) -> None:
        """req and every later turn of its session recorded as never sent (issued false, as the client does)."""
        rec = _Rec(req, "", self.env.now, self.cfg).record(self.env.now)
        self.records.append(replace(rec, ok=False, issued=False, error=error))
        for nxt in self.next_turns.get(req.request_id, ()):
            self._not_issued(nxt, error)

    # ------------------------------------------------------------ picks

    def _pick_md(self, session: str) -> DecodeWorker:
        pol = self.cfg.policy
        if pol.pick_md == "cache_aware":  # where the session's prefix lives: its sticky MD
            return self.md[zlib.crc32(session.encode()) % len(self.md)]
        return self._pick(self.md, pol.pick_md, lambda w: w.sessions)

    def _pick(self, pool: list, how: str, load):
        if how == "round_robin" or len(pool) == 1:
            self._rr += 1
            return pool[self._rr % len(pool)]
        return min(pool, key=load)

    def md_hit(self, req: WorkloadRequest, md: DecodeWorker) -> int:
        """Tokens of req's prompt the MD's DRC holds (module docstring)."""
        held = self.held[md.name].get(req.session, self.base.get(req.session, 0))
        return min(req.cached_tokens, held) if req.after else req.cached_tokens

    def _md_keeps(self, md: DecodeWorker, req: WorkloadRequest) -> None:
        self.held[md.name][req.session] = (req.prompt_len + req.max_tokens - 1) // self._block * self._block

    @property
    def _block(self) -> int:
        return self.cfg.deployment.block_size

    # ------------------------------------------------------------ one request

    def _serve(self, req: WorkloadRequest):
        cfg, env = self.cfg, self.env
        t0 = env.now
        md = self._pick_md(req.session) if cfg.mode in ("pd-cross", "pdd") else None
        md_cached = self.md_hit(req, md) if cfg.mode == "pdd" else 0
        decision = decide_route(
            cfg.mode, req.prompt_len, req.max_tokens, md_cached, cfg.route_kv_bytes_per_token, cfg.policy
        )
        rec = _Rec(req, decision.route, t0, cfg)
        rec.drc_hit = md_cached / req.prompt_len if cfg.mode == "pdd" and decision.use_drc else None
        rec.md_cached = md_cached if decision.use_drc else 0
        route = decision.route
        if route == Route.COLOCATED:
            yield from self._colocated(req, rec)
        elif route in (Route.P_RLD, Route.P_RLD_SINGULAR, Route.P_RLD_ABLATION):
            yield from self._p_rld(req, rec, singular=route == Route.P_RLD_SINGULAR)
        elif route == Route.P_MD:
            yield from self._p_md(req, rec, md)
        else:
            yield from self._p_rld_md(req, rec, md)
        self.records.append(rec.record(env.now))

    def _prefill(self, req: WorkloadRequest, rec: _Rec) -> PrefillWorker:
        p = self._pick(self.p, self.cfg.policy.pick_p, lambda w: w.queued_tokens)
        rec.workers["p"] = p.name
        yield from p.prefill(req.prompt_len - req.cached_tokens, req.cached_tokens)
        rec.p_tokens = 1
        return p

    def _rld(self) -> DecodeWorker:
        return self._pick(self.rld, self.cfg.policy.pick_rld, lambda w: w.sessions)

    def _colocated(self, req: WorkloadRequest, rec: _Rec):
        rld = self._rld()
        rec.workers["rld"] = rld.name
        yield rld.step_job(req.prompt_len - req.cached_tokens, req.cached_tokens)
        rec.first(self.env.now, rld.name)
        s = rld.join(Session(self.env, req.max_tokens - 1, req.prompt_len))
        yield s.released
        rec.add(s, rld.name, "rld")

    def _fast_path_s(self, p: PrefillWorker, rld: DecodeWorker, tokens: int) -> float:
        """P -> RLD inside cluster A: KV export from P's devices and import into the RLD's (host links; real
        compute: the measured import, the export streamed during the prefill)."""
        return kv_export_s(p.model.roofline, tokens) + kv_import_s(rld.model.roofline, tokens)

    def _p_rld(self, req: WorkloadRequest, rec: _Rec, singular: bool):
        p = yield from self._prefill(req, rec)
        rld = self._rld()
        rec.workers["rld"] = rld.name
        yield self.env.timeout(self._fast_path_s(p, rld, req.prompt_len))
        rec.fast_kv = req.prompt_len * self.cfg.kv_bytes_per_token
        if singular:
            rec.kv_saved = (req.prompt_len - rec.md_cached) * self.cfg.kv_bytes_per_token
        rec.first(self.env.now, p.name)
        s = rld.join(Session(self.env, req.max_tokens - 1, req.prompt_len))
        yield s.released
        rec.add(s, rld.name, "rld")

    def _wan_copy(self, p: PrefillWorker, md: DecodeWorker, tokens: int):
        """P's KV of `tokens` tokens to the MD: export, the line, import (a SimPy generator)."""
        yield self.env.timeout(kv_export_s(p.model.roofline, tokens))
        yield self.line.transfer(tokens * self.cfg.kv_bytes_per_token, self.cfg.wan_connections)
        yield self.env.timeout(kv_import_s(md.model.roofline, tokens))

    def _p_md(self, req: WorkloadRequest, rec: _Rec, md: DecodeWorker):
        p = yield from self._prefill(req, rec)
        rec.workers["md"] = md.name
        tokens = req.prompt_len - rec.md_cached
        yield from self._wan_copy(p, md, tokens)
        rec.wan_kv = tokens * self.cfg.kv_bytes_per_token
        rec.first(self.env.now, p.name)
        s = md.join(Session(self.env, req.max_tokens - 1, req.prompt_len))
        yield s.released
        rec.add(s, md.name, "md")
        self._md_keeps(md, req)

    def _p_rld_md(self, req: WorkloadRequest, rec: _Rec, md: DecodeWorker):
        env, cfg = self.env, self.cfg
        p = yield from self._prefill(req, rec)
        rld = self._rld()
        rec.workers.update(rld=rld.name, md=md.name)
        tokens = req.prompt_len - rec.md_cached
        wan = env.process(self._wan_copy(p, md, tokens))
        rec.wan_kv = tokens * cfg.kv_bytes_per_token
        yield env.timeout(self._fast_path_s(p, rld, req.prompt_len))
        rec.fast_kv = req.prompt_len * cfg.kv_bytes_per_token
        rec.first(env.now, p.name)
        s = rld.join(Session(env, req.max_tokens - 1, req.prompt_len))
        yield wan | s.released
        if not s.released.triggered:
            rld.stop(s)  # the MD holds the prompt: hand over after the RLD's current step
        yield s.released
        rec.add(s, rld.name, "rld")
        left = req.max_tokens - 1 - s.made
        if left <= 0:  # the RLD finished alone; the WAN copy lands and the MD recomputes the output later
            rec.relay_absorbed = True
            if wan.triggered:
                self._md_keeps(md, req)
            else:
                wan.callbacks.append(lambda _e: self._md_keeps(md, req))
            return
        yield from self._handoff(req, rec, md, s.made, left)

    def _handoff(self, req: WorkloadRequest, rec: _Rec, md: DecodeWorker, made: int, left: int):
        """The RLD's tokens (P's first + its `made`) to the MD: their IDs and one extend step over all but the
        last (mode kv: their KV and an import), then the MD decodes the rest from the last."""
        env, cfg = self.env, self.cfg
        t, tokens = env.now, made + 1
        by_kv = cfg.handoff == "kv"
        payload = tokens * (cfg.kv_bytes_per_token if by_kv else HANDOFF_ID_BYTES)
        yield self.line.transfer(payload, cfg.wan_connections if by_kv else 1)
        t_ready = env.now
        if by_kv:
            yield env.timeout(kv_import_s(md.model.roofline, made))
        else:
            yield md.step_job(made, req.prompt_len, 1)
        extend_ms = (env.now - t_ready) * 1e3
        s = md.join(Session(env, left, req.prompt_len + made))
        yield s.released
        rec.add(s, md.name, "md")
        rec.handoff = {
            "mode": cfg.handoff if cfg.handoff in ("oneshot", "kv") else f"{cfg.handoff} (as oneshot)",
            "tokens": tokens,
            "payload_bytes": payload,
            "ready_ms": (t_ready - t) * 1e3,
            "duration_ms": ((s.times[0] if s.times else env.now) - t) * 1e3,
            "extend_ms": None if by_kv else extend_ms,
        }
        rec.wan_handoff = payload
        self._md_keeps(md, req)


class _Rec:
    """A request's record as it is built (times in s of simulated time)."""

    def __init__(self, req: WorkloadRequest, route: Route, t0: float, cfg: SimConfig):
        self.req, self.route, self.t0, self.cfg = req, route, t0, cfg
        self.times: list[float] = []
        self.token_workers: list[str] = []
        self.workers: dict[str, str] = {}
        self.counts = {"p": 0, "rld": 0, "md": 0}
        self.steps = self.batch_sum = 0
        self.drc_hit, self.md_cached = None, 0
        self.fast_kv = self.wan_kv = self.wan_handoff = self.kv_saved = self.p_tokens = 0
        self.relay_absorbed, self.handoff = False, None

    def first(self, t: float, worker: str) -> None:
        self.times.append(t)
        self.token_workers.append(worker)
        self.counts[worker.rstrip("0123456789")] += 1

    def add(self, s: Session, worker: str, role: str) -> None:
        self.times += s.times
        self.token_workers += [worker] * s.made
        self.counts[role] += s.made
        self.steps += s.steps
        self.batch_sum += s.batch_sum

    def record(self, t_end: float) -> RequestRecord:
        r, ms = self.req, [(t - self.t0) * 1e3 for t in self.times]
        n = len(ms)
        gaps = [b - a for a, b in zip(ms, ms[1:])]
        if self.handoff is not None and gaps:
            self.handoff["gap_ms"] = max(gaps)
        return RequestRecord(
            variant=self.cfg.variant,
            request_id=r.request_id,
            session=r.session,
            turn=r.turn,
            kind=r.kind,
            ok=True,
            error=None,
            prompt_tokens=r.prompt_len,
            max_tokens=r.max_tokens,
            output_tokens=n,
            route=str(self.route),
            expected_hit=r.expected_hit,
            drc_hit=self.drc_hit,
            md_cached_tokens=self.md_cached,
            token_ids=[],
            token_ms=ms,
            token_workers=self.token_workers,
            t_send_ns=int(self.t0 * 1e9),
            t_done_ns=int(t_end * 1e9),
            ttft_ms=ms[0] if ms else None,
            ttft_decode_ms=ms[1] if n > 1 else None,
            tpot_ms=(ms[-1] - ms[0]) / (n - 1) if n > 1 else None,
            e2e_ms=ms[-1] if ms else None,
            fast_kv_bytes=self.fast_kv,
            wan_kv_bytes=self.wan_kv,
            wan_handoff_bytes=self.wan_handoff,
            wan_bytes=self.wan_kv + self.wan_handoff,
            kv_bytes_saved=self.kv_saved,
            rld_tokens=self.counts["rld"],
            md_tokens=self.counts["md"],
            p_tokens=self.counts["p"],
            decode_batch=self.batch_sum / self.steps if self.steps else None,
            handoff=self.handoff,
            relay_absorbed=self.relay_absorbed,
            mode=self.cfg.mode,
            prompt_source="workload",
            workers=dict(self.workers),
        )
