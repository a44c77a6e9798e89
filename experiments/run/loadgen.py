"""The load generator: runs inside the `client` host and drives the router's `Generate` stream.

Responsible for: readiness (`health ADDR...`: every role's gRPC health
SERVING, never a sleep), and `run`: sending a workload's requests on time
(Poisson starters at `arrival_s`; a later turn `think_s` after the previous
turn's reply, its prompt = previous prompt + the actual reply + head_tokens),
warm-up requests first and alone, recording per request every token's index,
id, producing worker and client receipt time (time.monotonic_ns(), the clock
the roles log with), and printing one progress line per finished request.
A later turn whose previous turn failed is still sent, with the reference
reply (`--reference`: the colocated variant's client log, the greedy reference
every variant must reproduce) in the prompt, so one failure does not drop the
rest of a session; its record says `prompt_source: reference`. With
`--settle ADDR...` (the variant's MDs, where its mode ships KV across the WAN)
the clock starts only once the warm-up has filled what it is for: some MD's
DRC holds the warm-up prompt's whole blocks (Decode.Lookup, polled), or
`--settle-timeout-s` has passed; a `settle ok=... s=... cached=.../...` line
says which. Without it, pdd's RLD finishes the warm-up long before its WAN
copy lands on a slow line (26 MB, 20-30 s on wan-lossy), and every first
turn's MD session waits on that copy inside the window. Past
`--issue-until-s` into the run no request is sent: the rest are recorded as
not issued (`issued: false`), so a baseline too slow for the window ends with
every request it was given measured, and the count of those it was not.
Not responsible for: metrics (experiments.analysis.metrics reads what this writes).

Output: one ClientRecord per line (experiments.rundir.clientlog: the layout, its writer
and reader), appended as each request ends, so an
interrupted run keeps every finished request; on SIGINT, SIGTERM or SIGHUP
the requests in flight are recorded as interrupted (their calls cancelled)
and those not sent as not issued, so the log holds the whole workload.

    python -m experiments.run.loadgen health --timeout-s 120 10.1.0.11:50050 ...
    python -m experiments.run.loadgen run --workload W.jsonl --router ADDR --variant pdd --out client.jsonl
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from experiments.rundir import clientlog
from experiments.rundir.clientlog import ClientRecord
from experiments.spec.workload import WorkloadRequest, read
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.client import wait_healthy

log = logging.getLogger("loadgen")


class Recorder:
    """Thread-safe JSON-lines writer with a progress counter."""

    def __init__(self, path: Path, total: int):
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.total, self.done, self.failed, self.not_issued = total, 0, 0, 0
        self.written: set[str] = set()

    def write(self, record: ClientRecord) -> None:
        """Append one request's record; a second record for the same request is dropped (an interrupted
        run records what was in flight, and the RPC's own end may follow)."""
        with self.lock:
            if record.request_id in self.written:
                return
            self.written.add(record.request_id)
            self.file.write(clientlog.line(record))
            self.done += 1
            self.failed += record.issued and record.error is not None
            self.not_issued += not record.issued
            print(
                f"progress {self.done}/{self.total} failed={self.failed} not_issued={self.not_issued} "
                f"last={record.request_id}",
                flush=True,
            )


class Client:
    """channel: to the router; variant: the mode sent with every request; handoff: '' = the config's, or several
    comma-separated: the modes the measured requests take in turn, in the workload's order (one window holds
    both modes of a comparison, interleaved)."""

    def __init__(
        self,
        channel: grpc.Channel,
        variant: str,
        handoff: str,
        timeout_s: float,
        recorder: Recorder,
        reference: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
        mode: str = "",
    ):
        self.stub = pdd_pb2_grpc.RouterStub(channel)
        self.variant, self.timeout_s = variant, timeout_s
        self.handoffs = tuple(m for m in handoff.split(",") if m) or ("",)
        self.turn_of: dict[str, int] = {}  # request_id -> its position among the measured requests
        self.mode = mode or variant
        self.rec = recorder
        self.outputs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # request_id -> (prompt, reply)
        self.reference = reference or {}
        self._inflight: dict[str, tuple[ClientRecord, object]] = {}  # request_id -> (its record so far, its call)
        self._lock = threading.Lock()

    def interrupt(self, requests: list[WorkloadRequest], t0_ns: int, why: str) -> None:
        """The run stops: record every request in flight as interrupted (cancelling its call) and every one
        not sent yet as not issued, so the client log holds the whole workload."""
        with self._lock:
            inflight = list(self._inflight.values())
        now = time.monotonic_ns()
        for rec, call in inflight:
            self.rec.write(
                rec.model_copy(update={"tokens": list(rec.tokens), "error": f"interrupted: {why}", "t_done_ns": now})
            )
            call.cancel()
        for req in requests:
            if req.request_id not in self.rec.written:
                self.not_issued(req, t0_ns, f"interrupted before it was sent: {why}")

    def prompt_of(self, req: WorkloadRequest) -> tuple[tuple[int, ...] | None, str]:
        """The request's prompt and where its history came from: workload | previous | reference | none."""
        if req.after is None:
            return req.head_tokens, "workload"
        for source, known in (("previous", self.outputs), ("reference", self.reference)):
            prev = known.get(req.after)
            if prev is not None:
                return prev[0] + prev[1] + req.head_tokens, source
        return None, "none"

    def handoff_of(self, req: WorkloadRequest) -> str:
        """The handoff mode the request asks for ('' = the config's): the modes in turn over the measured
        requests in the workload's order (the warm-up takes the first)."""
        return self.handoffs[self.turn_of.get(req.request_id, 0) % len(self.handoffs)]

    def _record(self, req: WorkloadRequest, prompt: tuple[int, ...] | None, t0_ns: int) -> ClientRecord:
        rec = clientlog.new_record(
            req.request_id, self.variant, self.mode, req.session, req.turn, req.kind, req.max_tokens, prompt, t0_ns
        )
        rec.handoff = self.handoff_of(req) or None
        return rec

    def not_issued(self, req: WorkloadRequest, t0_ns: int, reason: str) -> None:
        rec = self._record(req, None, t0_ns)
        rec.issued, rec.error, rec.t_done_ns = False, f"not issued: {reason}", rec.t_send_ns
        self.rec.write(rec)

    def send(self, req: WorkloadRequest, t0_ns: int) -> bool:
        """One request to the end; records it; True when it completed."""
        prompt, source = self.prompt_of(req)
        rec = self._record(req, prompt, t0_ns)
        rec.prompt_source = source
        if prompt is None:
            rec.error = f"previous turn {req.after} did not complete (and no reference reply)"
            self.rec.write(rec)
            return False
        call = self.stub.Generate(
            pdd_pb2.GenerateRequest(
                request_id=rec.router_id,
                prompt_tokens=prompt,
                max_tokens=req.max_tokens,
                mode=self.mode,
                handoff=self.handoff_of(req),
            ),
            timeout=self.timeout_s,
        )
        with self._lock:
            self._inflight[req.request_id] = (rec, call)
        try:
            for ev in call:
                clientlog.add_event(rec, ev)
        except grpc.RpcError as err:
            rec.error = f"{err.code().name}: {err.details()}"
        finally:
            with self._lock:
                self._inflight.pop(req.request_id, None)
        rec.t_done_ns = time.monotonic_ns()
        if rec.error is None:
            self.outputs[req.request_id] = (prompt, tuple(rec.reply()))
        self.rec.write(rec)
        return rec.error is None


def chains(requests: list[WorkloadRequest]) -> list[list[WorkloadRequest]]:
    """Group requests into sessions' turn chains (a request with `after` follows that request)."""
    by_id, heads, out = {r.request_id: r for r in requests}, [], []
    follower = {r.after: r for r in requests if r.after}
    for r in requests:
        if r.after is None or r.after not in by_id:
            heads.append(r)
    for head in heads:
        chain = [head]
        while chain[-1].request_id in follower:
            chain.append(follower[chain[-1].request_id])
        out.append(chain)
    return out


def _run_chain(
    client: Client, chain: list[WorkloadRequest], t0_ns: int, stop: threading.Event, issue_until_s: float = 0.0
) -> None:
    prev_done_ns = None
    for i, req in enumerate(chain):
        due_ns = t0_ns + int(req.arrival_s * 1e9)
        if prev_done_ns is not None:
            due_ns = max(due_ns, prev_done_ns + int(req.think_s * 1e9))
        if issue_until_s and max(due_ns, time.monotonic_ns()) - t0_ns > issue_until_s * 1e9:
            for late in chain[i:]:
                client.not_issued(late, t0_ns, f"due past the variant's issue deadline ({issue_until_s:g} s)")
            return
        if stop.wait(max(0.0, (due_ns - time.monotonic_ns()) / 1e9)):
            return
        client.send(req, t0_ns)
        prev_done_ns = time.monotonic_ns()


def read_reference(path: Path) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """request_id -> (prompt, reply) of every completed request of a reference client log."""
    return {
        r.request_id: (tuple(r.prompt), tuple(r.reply()))
        for r in clientlog.read(path)
        if r.error is None and r.tokens and r.prompt is not None
    }


@dataclass(frozen=True)
class Settled:
    """How the warm-up's prefix reached the MDs' DRC before the clock started."""

    ok: bool  # some MD holds `want` tokens of the warm-up prompt
    wait_s: float
    cached: int  # the best MD's hit on the warm-up prompt at the end of the wait
    want: int

    def line(self) -> str:
        return f"settle ok={int(self.ok)} s={self.wait_s:.2f} cached={self.cached}/{self.want}"

    @staticmethod
    def parse(line: str) -> Settled:
        """The inverse of line() (the runner reads it from this process's output)."""
        f = dict(w.split("=", 1) for w in line.split()[1:])
        cached, want = (int(x) for x in f["cached"].split("/"))
        return Settled(f["ok"] == "1", float(f["s"]), cached, want)


def drc_blocks(prompt_len: int, block_size: int) -> int:
    """The DRC hit a worker that holds a prompt reports for it: its whole blocks short of the last token."""
    return (prompt_len - 1) // block_size * block_size if prompt_len > 1 else 0


def settle(
    lookups: Sequence[Callable[[], int]], want: int, timeout_s: float, poll_s: float = 0.1, clock=time.monotonic
) -> Settled:
    """Poll every MD's hit on the warm-up prompt (lookups: one call per MD, its hit now; an unreachable MD
    counts 0) until one holds `want` tokens or timeout_s has passed."""
    t0, best = clock(), 0
    while True:
        best = max((lookup() for lookup in lookups), default=0)
        waited = clock() - t0
        if best >= want or waited >= timeout_s:
            return Settled(best >= want, waited, best, want)
        time.sleep(poll_s)


def _lookup(stub, prompt: Sequence[int]) -> Callable[[], int]:
    def hit() -> int:
        try:
            return stub.Lookup(pdd_pb2.LookupRequest(prompt_tokens=prompt), timeout=5).cached_tokens
        except grpc.RpcError:
            return 0

    return hit


def settle_warmup(client: Client, warm: list[WorkloadRequest], args) -> None:
    """After the warm-ups, wait for their prompts in the MDs' DRC (--settle) and print the settle line."""
    done = [r for r in warm if r.request_id in client.outputs]
    if not args.settle or not done:
        return
    channels = [grpc.insecure_channel(a) for a in args.settle]
    try:
        stubs = [pdd_pb2_grpc.DecodeStub(ch) for ch in channels]
        for r in done:
            prompt = client.outputs[r.request_id][0]
            lookups = [_lookup(stub, prompt) for stub in stubs]
            print(settle(lookups, drc_blocks(len(prompt), args.block_size), args.settle_timeout_s).line(), flush=True)
    finally:
        for ch in channels:
            ch.close()


def run(args) -> int:
    requests = read(Path(args.workload))
    warm = [r for r in requests if r.kind == "warmup"]
    measured = [r for r in requests if r.kind != "warmup"]
    rec = Recorder(Path(args.out), len(requests))
    stop = threading.Event()
    with grpc.insecure_channel(
        args.router, options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    ) as ch:
        reference = read_reference(Path(args.reference)) if args.reference else {}
        client = Client(ch, args.variant, args.handoff, args.request_timeout_s, rec, reference, args.mode)
        client.turn_of = {r.request_id: i for i, r in enumerate(measured)}
        t0 = None
        try:
            for r in warm:  # alone, before the clock starts: fills the caches with the shared system prompt
                client.send(r, time.monotonic_ns())
            settle_warmup(client, warm, args)
            t0 = time.monotonic_ns()
            print(f"start t0_ns={t0} requests={len(measured)}", flush=True)
            threads = [
                threading.Thread(
                    target=_run_chain,
                    args=(client, c, t0, stop, args.issue_until_s),
                    daemon=True,
                    name=f"chain-{c[0].session}",
                )
                for c in chains(measured)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except KeyboardInterrupt as err:  # also during the warm-up or its settle: every request is recorded
            stop.set()
            client.interrupt(requests, t0 or time.monotonic_ns(), str(err) or "SIGINT")
            print("interrupted", flush=True)
            return 130
    return 0 if rec.failed == 0 else 1


def health(args) -> int:
    for address in args.addresses:
        wait_healthy(address, timeout_s=args.timeout_s)
        print(f"{address} SERVING", flush=True)
    return 0


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="experiments.run.loadgen")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("health")
    h.add_argument("--timeout-s", type=float, default=120.0)
    h.add_argument("addresses", nargs="+")
    h.set_defaults(func=health)
    r = sub.add_parser("run")
    r.add_argument("--workload", required=True)
    r.add_argument("--router", required=True)
    r.add_argument("--variant", required=True, help="the variant's name (its records and request ids)")
    r.add_argument("--mode", default="", help="the serving mode sent with every request (default: the variant)")
    r.add_argument(
        "--handoff", default="", help="handoff mode(s): '' = the config's; a,b,...: the requests take them in turn"
    )
    r.add_argument("--out", required=True)
    r.add_argument("--request-timeout-s", type=float, default=240.0)
    r.add_argument("--reference", default="", help="client log whose replies stand in for failed turns")
    r.add_argument("--issue-until-s", type=float, default=0.0, help="send no request later than this (0: no limit)")
    r.add_argument("--settle", nargs="*", default=[], metavar="ADDR", help="MDs whose DRC the warm-up must fill")
    r.add_argument("--settle-timeout-s", type=float, default=120.0)
    r.add_argument("--block-size", type=int, default=16, help="the KV block (DRC granularity) in tokens")
    r.set_defaults(func=run)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s loadgen: %(message)s")
    signal.signal(signal.SIGTERM, _interrupted)  # a variant timeout's stop: record what is left, like Ctrl-C
    signal.signal(signal.SIGHUP, _interrupted)
    try:
        return args.func(args)
    except TimeoutError as err:
        print(f"loadgen: {err}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
