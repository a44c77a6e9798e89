"""One simulated request's record as the pipeline builds it, and the error texts a failed one carries.

Responsible for: `Rec`, what a request gathered on its way (tokens and their workers, bytes per path, the
handoff, the decode sessions it still has open, the KV blocks it holds on each worker) and its
`experiments.analysis.records.RequestRecord` (the emulated analysis' own record); the failures' texts, each as
the emulated client records it (`streams_ended`: the router's "every worker stream ended" over the sessions'
end notes; `DEADLINE_EXCEEDED`: the client's gRPC deadline, timeouts.request_s); `cut_at_end`: the WAN KV
bytes of the copies still crossing at the variant's end left out, as the emulated analysis leaves them.
Not responsible for: the times themselves (experiments.sim.pipeline).
"""

from __future__ import annotations

from dataclasses import replace

from experiments.analysis.records import RequestRecord
from experiments.sim.config import SimConfig
from experiments.sim.workers import Session
from experiments.spec.workload import WorkloadRequest

DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED: Deadline Exceeded"  # grpc's text when the client's deadline passes


def streams_ended(req: WorkloadRequest, made: int, notes: list[str], code: str = "UNAVAILABLE") -> str:
    """The client's error when every worker stream of req ended early (workers/roles/router.py's _fail): the
    first error's status (UNAVAILABLE when the streams only ended), the tokens it got, each stream's note."""
    return (
        f"{code}: request {req.request_id}: every worker stream ended after {made} of {req.max_tokens} tokens "
        f"({'; '.join(notes)})"
    )


class Rec:
    """A request's record as it is built (times in s of simulated time).

    live: decode sessions it has open (worker, session): a request past its deadline stops them; rooms: role ->
    (KVRoom, blocks, admitted event or None) it holds or waits for; error: why it failed (None: it did not)"""

    def __init__(self, req: WorkloadRequest, t0: float, cfg: SimConfig):
        self.req, self.route, self.t0, self.cfg = req, "", t0, cfg
        self.times: list[float] = []
        self.token_workers: list[str] = []
        self.workers: dict[str, str] = {}
        self.counts = {"p": 0, "rld": 0, "md": 0}
        self.steps = self.batch_sum = 0
        self.drc_hit, self.md_cached = None, 0
        self.fast_kv = self.wan_kv = self.wan_handoff = self.kv_saved = self.p_tokens = 0
        self.p_started = 0.0  # when P's first step of its prompt began (s): its fast-path copy streams from then
        self.answer_at = 0.0  # pdd: when its MD's DRC answer reaches P (s; Simulation._answer)
        self.relay_absorbed, self.handoff = False, None
        # pdd's in-flight DRC (experiments.sim.pipeline): while its MD session is open, `md_closed` fires at its end
        # and `promised` is what the MD keeps if it ends well; `after`, the earlier turn whose copy this one's waits on
        self.md_closed, self.promised, self.after, self.inflight_tokens = None, 0, None, 0
        self.fallbacks: list[str] = []
        self.live: list = []
        self.rooms: dict[str, list] = {}
        self.error: str | None = None
        self.final: RequestRecord | None = None  # the record once the client has its answer (the last token, or
        # the failure); a later MD outcome (relay_absorbed) amends it

    def first(self, t: float, worker: str) -> None:
        self.times.append(t)
        self.token_workers.append(worker)
        self.counts[worker.rstrip("0123456789")] += 1

    def add(self, s: Session, worker: str, role: str, late: float = 0.0) -> None:
        """s's tokens join the record; late: their way to the client after the worker (s; an MD's: the line back)."""
        self.times += [t + late for t in s.times] if late else s.times
        self.token_workers += [worker] * s.made
        self.counts[role] += s.made
        self.steps += s.steps
        self.batch_sum += s.batch_sum

    @property
    def made(self) -> int:
        """Tokens the client holds now (the finished sessions' and the open ones' so far)."""
        return len(self.times) + sum(s.made for _w, s in self.live)

    def record(self, t_end: float) -> RequestRecord:
        """The record at t_end: a failed request keeps the tokens it got before then."""
        for worker, s in self.live:  # open sessions (a failure): their tokens so far
            times = worker.times_so_far(s)
            self.times += times
            self.token_workers += [worker.name] * len(times)
            self.counts[worker.model.role] += len(times)
        self.live = []
        r, t0 = self.req, self.t0
        ms = [(t - t0) * 1e3 for t in self.times]
        n, ok = len(ms), self.error is None
        if self.handoff is not None and n > 1:
            self.handoff["gap_ms"] = max(b - a for a, b in zip(ms, ms[1:]))
        self.final = RequestRecord(
            variant=self.cfg.variant,
            request_id=r.request_id,
            session=r.session,
            turn=r.turn,
            kind=r.kind,
            ok=ok,
            error=self.error,
            prompt_tokens=r.prompt_len,
            max_tokens=r.max_tokens,
            output_tokens=n,
            route=str(self.route),
            expected_hit=r.expected_hit,
            drc_hit=self.drc_hit,
            md_cached_tokens=self.md_cached,
            token_ids=[],
            token_ms=ms,
            token_workers=list(self.token_workers),
            t_send_ns=int(self.t0 * 1e9),
            t_done_ns=int(t_end * 1e9),
            ttft_ms=ms[0] if ms else None,
            ttft_decode_ms=ms[1] if n > 1 else None,
            tpot_ms=(ms[-1] - ms[0]) / (n - 1) if n > 1 else None,
            e2e_ms=ms[-1] if ms and ok else None,
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
            fallbacks=list(self.fallbacks),
            inflight_tokens=self.inflight_tokens,
        )
        return self.final


def cut_at_end(records: list[RequestRecord], wan_ends: dict[str, float], ack_s: float) -> list[RequestRecord]:
    """The records with their WAN KV as an emulated run's analysis counts it: a copy's bytes once P's sender ended
    it (kv_send_end: its last byte in, wan_ends[request], and acknowledged, ack_s later), and the emulated variant
    stops its roles once its last request ended, so a copy still crossing then counts none (the simulated line
    carries it all the same: Line.bytes_sent), nor does the MD's absorbing a finished relay's output (relay_absorbed:
    it needs the copy in)."""
    if not records:
        return records
    end = max(r.t_done_ns for r in records) / 1e9
    late = {rid for rid, t in wan_ends.items() if t + ack_s > end}
    return [
        replace(r, wan_kv_bytes=0, wan_bytes=r.wan_handoff_bytes, relay_absorbed=False)
        if r.wan_kv_bytes and r.request_id in late
        else r
        for r in records
    ]
