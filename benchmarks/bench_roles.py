"""PDD roles benchmark: KV data plane vs iperf3 on loopback; a 100-token handoff, IDs vs KV; a decode worker's TPOT
while it prefills a long prompt.

Responsible for: measuring, in one run on 127.0.0.1, (1) the KV data plane
(workers/kvwire/: framing, crc32c on both ends, N connections,
delivery as an engine blob, ACK) sending default-model KV from this process
to a receiver in a child process, next to iperf3 TCP with the same number of
streams on the same path, and next to two plain-TCP references that move the
same memory from Python (without, then with, crc32c on both ends), in
alternating windows so that a noisy host treats all alike; CPU seconds per GB
on each side; (2) a 100-token handoff on the default model:
token IDs (protobuf HandoffRequest + the MD's recompute, `DecodeSteps.extend`)
vs shipping the tokens' KV (export, data plane, import); (3) an RLD's
DecodeServicer in process (its own code, called as gRPC calls it): the time
per output token of SESSIONS colocated sessions while a LONG_PROMPT_TOKENS
prompt is prefilled on the same worker, under each `decode.step_budget_tokens`
(0: whole, between two of their steps; 256: in chunks mixed into them),
alternately. Prints one table per section; --json writes them.
Not responsible for: WAN effects (the PDD experiments run this over the
emulated topology).

    .venv/bin/python benchmarks/bench_roles.py [--mbytes 256] [--rounds 3] [--seconds 2] [--json out.json]
        [--sections dataplane handoff decode] [--model default] [--budgets 0 256]

Published counterparts (PDD.md): 100-token handoff as KV 4649 KB, 185 ms mean
(peaks 512.6 ms) over the WAN; as token IDs 1.5 KB, 305 ms mean, 4.8 ms std.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from crc32c import crc32c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topology import iperf  # noqa: E402
from workers.kvwire import Inbox, KVReceiver, KVSender, TransferMeta, recv_exact, send_all  # noqa: E402
from workers.model import DEFAULT  # noqa: E402
from workers.roles.config import PathConfig  # noqa: E402
from workers.roles.events import NullLog  # noqa: E402

log = logging.getLogger("bench_roles")
FINGERPRINT = "00" * 16
HANDOFF_TOKENS = 100
HANDOFF_CONTEXT = 512  # prompt tokens before the handoff
SECTIONS = ("dataplane", "handoff", "decode")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """True when a TCP socket listens on port (read from /proc/net/tcp: connecting would use up iperf3 -1)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            return True
    return False


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Readiness: return once something listens on port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if listening(port):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on port {port}")


# ---------------------------------------------------------------- data plane vs iperf3


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _receiver_main(port: int, stop, ready, report) -> None:
    """Receive transfers bench-0, bench-1, ... until `stop`; report [CPU seconds when each was delivered]."""
    inbox, cpu = Inbox(), []
    with KVReceiver("127.0.0.1", port, FINGERPRINT, inbox, NullLog(), max_transfer_bytes=4 << 30):
        ready.set()
        i = 0
        inbox.expect("bench-0", "prompt")
        while not stop.is_set():
            inbox.expect(f"bench-{i + 1}", "prompt")
            got = inbox.wait(f"bench-{i}", "prompt", 0.5)
            if got is None:
                continue
            got.release()  # as a decode worker does once it has imported the KV
            cpu.append(cpu_seconds())
            i += 1
    report.put(cpu)


def back_to_back(transfer: Callable[[], object], seconds: float) -> tuple[int, float]:
    """Call transfer() until `seconds` have passed (at least twice); (calls, elapsed seconds)."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 2:
        transfer()
        n += 1
    return n, time.perf_counter() - t0


WARMUP_TRANSFERS = 2  # until the receiver's buffer pool holds a buffer of this size (the first two land in
# fresh memory: a decode worker in steady state reuses its buffers)


class KVWireBench:
    """A receiver process and the layers of one ~mbytes transfer; `measure(seconds)` sends back-to-back
    transfers for that long and returns Gbit/s and CPU seconds per GB on each side."""

    def __init__(self, mbytes: int, connections: int, frame_bytes: int = PathConfig.frame_bytes):
        c = DEFAULT
        row = c.n_kv_head * c.head_dim * c.dtype_bytes
        self.n_tokens = max(1, mbytes * 2**20 // (c.n_layer * 2 * row))
        self.layers = [
            np.random.default_rng(i).integers(0, 255, (2, self.n_tokens, row), dtype=np.uint8) for i in range(c.n_layer)
        ]
        self.connections, self.frame_bytes, self.sent = connections, frame_bytes, 0
        self.port, ctx = free_port(), mp.get_context("fork")
        self.stop, ready, self.report = ctx.Event(), ctx.Event(), ctx.Queue()
        self.child = ctx.Process(target=_receiver_main, args=(self.port, self.stop, ready, self.report))
        self.child.start()
        if not ready.wait(30):
            raise RuntimeError("receiver did not start")
        self.windows: list[tuple[int, int, float]] = []  # first, end transfer, sender CPU seconds
        self.kv_bytes = sum(layer.nbytes for layer in self.layers)

    def _transfer(self) -> float:
        c = DEFAULT
        meta = TransferMeta(
            f"bench-{self.sent}",
            "prompt",
            0,
            self.n_tokens,
            tuple(range(self.n_tokens)),
            FINGERPRINT,
            c.n_layer,
            c.n_kv_head,
            c.head_dim,
            c.dtype,
        )
        sender = KVSender(
            f"127.0.0.1:{self.port}",
            meta,
            PathConfig(
                connections=self.connections, frame_bytes=self.frame_bytes, stall_timeout_ms=30000, deadline_ms=120000
            ).send_settings(),
            "bench",
            NullLog(),
        )
        t0 = time.perf_counter()
        sender.start()
        for layer, kv in enumerate(self.layers):
            sender.put_layer(layer, kv)
        sender.finish(None)
        result = sender.wait()
        dt = time.perf_counter() - t0
        if not result.ok:
            raise RuntimeError(f"transfer failed: {result.reason}")
        self.sent += 1
        return meta.kv_bytes * 8 / dt / 1e9

    def warm_up(self) -> list[float]:
        """Gbit/s of the WARMUP_TRANSFERS transfers into fresh memory."""
        return [self._transfer() for _ in range(WARMUP_TRANSFERS)]

    def measure(self, seconds: float) -> float:
        """Send transfers back to back for about `seconds`; Gbit/s over the window."""
        first, c0 = self.sent, cpu_seconds()
        n, dt = back_to_back(self._transfer, seconds)
        self.windows.append((first, self.sent, cpu_seconds() - c0))
        return n * self.kv_bytes * 8 / dt / 1e9

    def close(self) -> dict:
        """Stop the receiver; CPU seconds per GB on each side over the measured windows."""
        self.stop.set()
        cpu = self.report.get(timeout=60)
        self.child.join(30)
        gb = sum(end - first for first, end, _ in self.windows) * self.kv_bytes / 1e9
        send = sum(cpu_s for _, _, cpu_s in self.windows)
        recv = sum(cpu[end - 1] - cpu[first - 1] for first, end, _ in self.windows)
        return {"send_cpu_s_per_gb": send / gb, "recv_cpu_s_per_gb": recv / gb}


def _pieces(layer_bytes: int, n_layer: int, piece: int) -> list[tuple[int, int]]:
    """(offset, length) of each piece of n_layer consecutive layers of layer_bytes, piece bytes at most."""
    return [
        (layer * layer_bytes + o, min(piece, layer_bytes - o))
        for layer in range(n_layer)
        for o in range(0, layer_bytes, piece)
    ]


def _raw_receiver_main(port: int, connections: int, pieces: list[tuple[int, int]], checksum: bool, ready) -> None:
    """Plain TCP reference: connection c receives pieces c, c+N, ... of each transfer into one reused
    buffer (no framing; crc32c of each piece if checksum) and answers one byte per transfer; ends at EOF."""
    buf = memoryview(np.empty(pieces[-1][0] + pieces[-1][1], np.uint8)).cast("B")
    with socket.create_server(("127.0.0.1", port)) as listener:
        ready.set()
        conns = [listener.accept()[0] for _ in range(connections)]

    def serve(c: int) -> None:
        mine = [buf[o : o + n] for o, n in pieces[c::connections]]
        go = memoryview(bytearray(1))
        while recv_exact(conns[c], go) == 1:
            for view in mine:
                recv_exact(conns[c], view)
                if checksum:
                    crc32c(view)
            conns[c].sendall(b"A")
        conns[c].close()

    threads = [threading.Thread(target=serve, args=(c,)) for c in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class RawTCPBench:
    """The same layers over plain TCP sockets from Python, moved the way kvwire moves them (distinct
    memory each way, 1 MiB sendmsg / MSG_WAITALL recv, N connections, an acknowledgement per transfer)
    with no framing, and with or without a crc32c of each piece on both ends: what moving this memory
    costs before kvwire's own work, and what the checksums alone add."""

    def __init__(
        self, data: memoryview, layer_bytes: int, n_layer: int, connections: int, checksum: bool, piece: int = 1 << 20
    ):
        self.data, self.checksum = data, checksum
        self.pieces = _pieces(layer_bytes, n_layer, piece)
        self.connections = connections
        port, ctx = free_port(), mp.get_context("fork")
        ready = ctx.Event()
        self.child = ctx.Process(target=_raw_receiver_main, args=(port, connections, self.pieces, checksum, ready))
        self.child.start()
        if not ready.wait(30):
            raise RuntimeError("raw receiver did not start")
        self.socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
        for sock in self.socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, c: int) -> None:
        sock = self.socks[c]
        sock.sendall(b"G")
        for o, n in self.pieces[c :: self.connections]:
            if self.checksum:
                crc32c(self.data[o : o + n])
            send_all(sock, [self.data[o : o + n]])
        if sock.recv(1) != b"A":
            raise RuntimeError("raw receiver went away")

    def _transfer(self) -> None:
        threads = [threading.Thread(target=self._send, args=(c,)) for c in range(self.connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def measure(self, seconds: float) -> float:
        """Transfers back to back for about `seconds`; Gbit/s."""
        n, dt = back_to_back(self._transfer, seconds)
        return n * len(self.data) * 8 / dt / 1e9

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.child.join(30)


def bench_iperf3(streams: int, seconds: float) -> dict:
    """iperf3 TCP goodput (Gbit/s) on 127.0.0.1 with this many parallel streams, and its CPU per GB."""
    if shutil.which("iperf3") is None:
        raise RuntimeError("iperf3 not installed")
    port = free_port()
    server_cmd = iperf.server_argv(port, bind="127.0.0.1", report=False)
    log.info("running %s", " ".join(server_cmd))
    server = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        client_cmd = iperf.client_argv("127.0.0.1", seconds, port, streams=streams, server_report=False)
        log.info("running %s", " ".join(client_cmd))
        out = subprocess.run(client_cmd, capture_output=True, text=True, check=True, timeout=60)
        end = json.loads(out.stdout)["end"]
        gbit = end["sum_received"]["bits_per_second"] / 1e9
        cpu = end["cpu_utilization_percent"]  # percent of one CPU over the run, sender (host) and receiver
        return {
            "gbit_s": gbit,
            "send_cpu_s_per_gb": cpu["host_total"] / 100 / (gbit / 8),
            "recv_cpu_s_per_gb": cpu["remote_total"] / 100 / (gbit / 8),
        }
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def bench_dataplane(
    mbytes: int, connections: int, rounds: int, seconds: float, frame_bytes: int = PathConfig.frame_bytes
) -> dict:
    """kvwire and iperf3 measured alternately, `rounds` windows of `seconds` each, so that both see the
    same state of a noisy host; the ratio is of the medians."""
    kv = KVWireBench(mbytes, connections, frame_bytes)
    data = memoryview(np.concatenate([layer.reshape(-1) for layer in kv.layers])).cast("B")
    raws = [RawTCPBench(data, kv.layers[0].nbytes, len(kv.layers), connections, checksum) for checksum in (False, True)]
    try:
        cold = kv.warm_up()
        for raw in raws:
            raw.measure(0)  # warm up too
        kv_rates, raw_rates, crc_rates, ip_runs = [], [], [], []
        for _ in range(rounds):
            ip_runs.append(bench_iperf3(connections, seconds))
            raw_rates.append(raws[0].measure(seconds))
            crc_rates.append(raws[1].measure(seconds))
            kv_rates.append(kv.measure(seconds))
    finally:
        for raw in raws:
            raw.close()
        cpu = kv.close()
    ip_rates = [r["gbit_s"] for r in ip_runs]
    return {
        "connections": connections,
        "kv_bytes": kv.kv_bytes,
        "gbit_s": kv_rates,
        "cold_gbit_s": cold,
        "iperf3_gbit_s": ip_rates,
        "ratio": statistics.median(kv_rates) / statistics.median(ip_rates),
        "raw_tcp_gbit_s": raw_rates,
        "raw_tcp_crc_gbit_s": crc_rates,
        "cpu_s_per_gb": cpu,
        "iperf3_cpu_s_per_gb": {
            k: statistics.mean(r[k] for r in ip_runs) for k in ("send_cpu_s_per_gb", "recv_cpu_s_per_gb")
        },
    }


# ---------------------------------------------------------------- handoff: IDs vs KV


def bench_handoff(repeats: int) -> dict:
    """A 100-token handoff on the default model, as token IDs (+ extend) and as KV (+ import), on loopback."""
    import torch

    from workers.engine import Engine, GenerationRequest
    from workers.kvcache import blob_kv_view
    from workers.kvwire import meta_for, send_blob
    from workers.proto import pdd_pb2
    from workers.roles.config import DecodeConfig
    from workers.roles.steps import DecodeSteps

    torch.set_num_threads(1)
    eng = Engine("default", capacity_tokens=8192, block_size=16, device="cpu", prefix_cache=False)
    cfg = DecodeConfig()  # the MD's recompute as the role runs it: chunked steps under the default budget
    md = DecodeSteps(eng, threading.Lock(), cfg.step_budget_tokens, cfg.max_batch, NullLog())
    prompt = tuple(np.random.default_rng(0).integers(0, DEFAULT.vocab_size, HANDOFF_CONTEXT).tolist())
    L, n = len(prompt), HANDOFF_TOKENS

    # the RLD's request: prompt + 101 generated tokens (100 to hand over + the one without KV)
    eng.open(GenerationRequest("rld", prompt, n + 2))
    eng.prefill("rld")
    while len(eng.tokens("rld")) - L < n + 1:
        eng.decode_step(["rld"])
    gen = list(eng.tokens("rld")[L:])
    inbox, port = Inbox(), free_port()
    ids_ms, kv_ms, ids_payload, kv_payload = [], [], 0, 0
    with KVReceiver("127.0.0.1", port, eng.fingerprint.hex(), inbox, NullLog(), max_transfer_bytes=1 << 30):
        for r in range(repeats):
            for rid in (f"ids{r}", f"kv{r}"):  # the MD's side: prompt KV + P's first token
                eng.open(GenerationRequest(rid, prompt, n + 4))
                eng.import_kv(rid, eng.export_kv("rld", 0, L))
                eng.append_tokens(rid, [gen[0]])
            # IDs: the message the RLD sends, parsed by the MD, then its recompute (DecodeSteps.extend)
            t0 = time.perf_counter()
            msg = pdd_pb2.HandoffRequest(request_id=f"ids{r}", start_index=0, token_ids=gen[: n + 1], final=True)
            wire = msg.SerializeToString()
            got = pdd_pb2.HandoffRequest.FromString(wire)
            md.extend(f"ids{r}", list(got.token_ids[1:]))
            ids_next = eng.tokens(f"ids{r}")[-1]
            ids_ms.append((time.perf_counter() - t0) * 1e3)
            ids_payload = len(wire)
            # KV: export, send on the data plane, import, then the one token without KV
            inbox.expect(f"kv{r}", "handoff")
            t0 = time.perf_counter()
            blob = eng.export_kv("rld", L, L + n)
            meta = meta_for(eng, f"kv{r}", "handoff", L, L + n, gen[:n])
            body = blob_kv_view(blob, meta.n_layer, n, meta.row_bytes)
            result = send_blob(f"127.0.0.1:{port}", meta, body, PathConfig().send_settings(), "handoff", NullLog())
            received = inbox.wait(f"kv{r}", "handoff", 30)
            eng.import_kv(f"kv{r}", received.blob)
            received.release()
            eng.append_tokens(f"kv{r}", [gen[n]])
            kv_ms.append((time.perf_counter() - t0) * 1e3)
            kv_payload = result.wire_bytes
            # both MD copies now continue identically
            a, b = ids_next, eng.decode_step([f"kv{r}"])[f"kv{r}"]  # both: the token at index n + 1
            if a != b:
                log.warning("repeat %d: IDs and KV handoff continue with different tokens (%d vs %d)", r, a, b)
            eng.abort(f"ids{r}")
            eng.abort(f"kv{r}")
    return {
        "tokens": n,
        "context_tokens": L,
        "ids_payload_bytes": ids_payload,
        "kv_payload_bytes": kv_payload,
        "ids_ms": ids_ms,
        "kv_ms": kv_ms,
    }


# ---------------------------------------------------------------- a decode worker: TPOT while it prefills a long prompt

SESSIONS = 8  # sessions decoding on the worker when the long prompt arrives
LONG_PROMPT_TOKENS = 2048
SESSION_PROMPT_TOKENS = 64
SESSION_MAX_TOKENS = 1024  # more than they decode while the long prompt is prefilled: stopped once it has its first
WARM_TOKENS = 4  # tokens every session has streamed before the long prompt arrives


class _InProcess:
    """What DecodeServicer.Decode uses of a grpc.ServicerContext, in this process."""

    def add_callback(self, fn) -> None:
        pass

    def abort(self, code, details: str):
        raise RuntimeError(f"{code.name}: {details}")


def decode_worker(model: str, budget_tokens: int, capacity_tokens: int = 16384, engine=None, events=None):
    """An RLD's DecodeServicer in this process, without a gRPC server: the role's own code, driven by calling
    its Decode. engine: shared between workers run one after another (default: a new one); events: its log."""
    from workers.roles.config import parse_config
    from workers.roles.decode import DecodeServicer
    from workers.roles.server import build_engine

    cfg = parse_config(
        {
            "model": model,
            "router": {"name": "router", "grpc_port": 1},
            "p": {"name": "p1", "grpc_port": 2},
            "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4, "capacity_tokens": capacity_tokens},
            "md": {"name": "md1", "grpc_port": 5, "kv_port": 6},
            "decode": {"step_budget_tokens": budget_tokens},
        }
    )
    engine = engine if engine is not None else build_engine(cfg, cfg.rld[0], prefix_cache=True)
    return DecodeServicer(cfg, cfg.rld[0], "rld", engine, Inbox(), events if events is not None else NullLog())


def colocated(rid: str, prompt: list[int], max_tokens: int):
    """A Decode request that prefills on the worker itself (colocated), past any prefix cache."""
    from workers.proto import pdd_pb2

    return pdd_pb2.DecodeRequest(
        request_id=rid, prompt_tokens=prompt, max_tokens=max_tokens, kv_source=pdd_pb2.KV_SOURCE_LOCAL
    )


class Stream(threading.Thread):
    """One session's Decode stream, read in a thread as gRPC would: when each token was emitted (ns)."""

    def __init__(self, servicer, request):
        super().__init__(name=f"stream-{request.request_id}", daemon=True)
        self.servicer, self.request = servicer, request
        self.t_ns: list[int] = []
        self.ended = ""  # the end reason, if the stream ended before it was stopped
        self.error: Exception | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        gen = self.servicer.Decode(self.request, _InProcess())
        try:
            for ev in gen:
                if ev.WhichOneof("kind") == "token":
                    self.t_ns.append(ev.token.t_ns)
                elif ev.WhichOneof("kind") == "end":
                    self.ended = ev.end.reason
                if self._halt.is_set():
                    break
        except Exception as err:  # raised in stop()
            self.error = err
        finally:
            gen.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(120)
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class PrefillStall:
    """Sessions decoding on a worker while a long prompt is prefilled there.

    ttft_s: the prompt's arrival to its first token (s)
    gaps_s: the sessions' gaps between consecutive tokens that overlap that span (s)
    alone_s: their median gap before it arrived (s)
    """

    ttft_s: float
    gaps_s: tuple[float, ...]
    alone_s: float

    @property
    def worst_s(self) -> float:
        return max(self.gaps_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.gaps_s)


def prefill_stall(servicer, prompt: list[int], sessions: int, tag: str, seed: int = 0) -> PrefillStall:
    """Start `sessions` colocated sessions on the servicer, then the long prompt once each has streamed
    WARM_TOKENS; how its prefill held their tokens. The sessions stop once it has its first token."""
    rng = np.random.default_rng(seed)
    vocab = servicer.engine.config.vocab_size
    prompts = [rng.integers(0, vocab, SESSION_PROMPT_TOKENS).tolist() for _ in range(sessions)]
    streams = [Stream(servicer, colocated(f"{tag}-s{i}", p, SESSION_MAX_TOKENS)) for i, p in enumerate(prompts)]
    for st in streams:
        st.start()
    try:
        deadline = time.monotonic() + 120
        while min(len(st.t_ns) for st in streams) < WARM_TOKENS:
            if time.monotonic() > deadline or any(not st.is_alive() for st in streams):
                raise RuntimeError(f"the sessions did not start decoding: {[len(st.t_ns) for st in streams]}")
            time.sleep(0.005)
        t0 = time.monotonic_ns()
        long = servicer.Decode(colocated(f"{tag}-long", prompt, 1), _InProcess())
        t_first = next(ev.token.t_ns for ev in long if ev.WhichOneof("kind") == "token")
        long.close()
    finally:
        for st in streams:
            st.stop()
    if any(st.ended for st in streams):
        raise RuntimeError("a session ended before the long prompt's first token: raise SESSION_MAX_TOKENS")
    gaps, alone = [], []
    for st in streams:
        for a, b in zip(st.t_ns, st.t_ns[1:]):
            if b > t0 and a < t_first:
                gaps.append((b - a) / 1e9)
            elif b <= t0:
                alone.append((b - a) / 1e9)
    return PrefillStall((t_first - t0) / 1e9, tuple(gaps), statistics.median(alone))


def bench_decode_worker(model: str, budgets: list[int], repeats: int, prompt_tokens: int, sessions: int) -> dict:
    """prefill_stall on one engine under each step budget, alternately (so each sees the same load)."""
    from workers.model import get_config

    n = min(prompt_tokens, get_config(model).max_seq_len - 1)
    workers = {}
    for budget in budgets:
        engine = next(iter(workers.values())).engine if workers else None
        workers[budget] = decode_worker(model, budget, engine=engine)
    runs: dict[int, list[PrefillStall]] = {b: [] for b in budgets}
    for r in range(repeats):
        prompt = np.random.default_rng(100 + r).integers(0, get_config(model).vocab_size, n).tolist()
        for budget, servicer in workers.items():
            runs[budget].append(prefill_stall(servicer, prompt, sessions, f"b{budget}-r{r}", seed=r))
    for servicer in workers.values():
        servicer.close()
    return {"model": model, "prompt_tokens": n, "sessions": sessions, "runs": runs}


def summary(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"mean {statistics.mean(xs):8.2f}  max {max(xs):8.2f}  std {sd:6.2f}"


def print_dataplane(args, results: dict) -> None:
    print(
        f"KV data plane vs iperf3 on 127.0.0.1: {args.mbytes} MiB of default-model KV per transfer, back to back, "
        f"receiver in another process;\n{args.rounds} alternating windows of {args.seconds:g} s each "
        f"(iperf3, plain TCP, plain TCP + crc32c, kvwire), after {WARMUP_TRANSFERS} warm-up transfers. Medians:"
    )
    print(
        f"{'conns':>5} {'iperf3':>7} {'plain TCP':>10} {'+ crc32c':>9} {'kvwire':>7} {'kvwire/iperf3':>14}   "
        f"{'kvwire CPU s/GB send / recv':>28}   {'iperf3 s/GB':>12} {'cold':>6}"
    )
    for conns in args.connections:
        d = bench_dataplane(args.mbytes, conns, args.rounds, args.seconds, args.frame_kib << 10)
        results["dataplane"].append(d)
        cpu, icpu = d["cpu_s_per_gb"], d["iperf3_cpu_s_per_gb"]
        med = {k: statistics.median(d[k]) for k in ("iperf3_gbit_s", "raw_tcp_gbit_s", "raw_tcp_crc_gbit_s", "gbit_s")}
        print(
            f"{conns:>5} {med['iperf3_gbit_s']:>7.2f} {med['raw_tcp_gbit_s']:>10.2f} {med['raw_tcp_crc_gbit_s']:>9.2f} "
            f"{med['gbit_s']:>7.2f} {d['ratio']:>14.0%}   "
            f"{cpu['send_cpu_s_per_gb']:>17.3f} / {cpu['recv_cpu_s_per_gb']:<8.3f}   "
            f"{icpu['send_cpu_s_per_gb']:>5.3f} / {icpu['recv_cpu_s_per_gb']:<5.3f} {min(d['cold_gbit_s']):>6.2f}"
        )
        print(
            "      windows, Gbit/s: kvwire "
            + " ".join(f"{x:.1f}" for x in d["gbit_s"])
            + "; iperf3 "
            + " ".join(f"{x:.1f}" for x in d["iperf3_gbit_s"])
            + "; plain TCP "
            + " ".join(f"{x:.1f}" for x in d["raw_tcp_gbit_s"])
            + "; + crc32c "
            + " ".join(f"{x:.1f}" for x in d["raw_tcp_crc_gbit_s"])
        )
    print(
        "  Gbit/s of payload. target: kvwire >= 80% of iperf3. iperf3 sends one cache-hot 128 KiB buffer\n"
        "  unchecked; 'plain TCP' moves the same distinct memory as kvwire (256 MiB out, 256 MiB in, 1 MiB\n"
        "  sendmsg / recv from Python, same connections, an ack per transfer) without framing or checksums;\n"
        "  '+ crc32c' adds a crc32c of every MiB on both ends; kvwire adds its frames, chunk bookkeeping and\n"
        "  per-transfer BEGIN/END/ACK. CPU s/GB: CPU seconds per GB moved, all threads of a\n"
        "  side (on loopback the sender also pays the receive path's TCP work). 'cold' = the slowest\n"
        "  warm-up transfer, into fresh (not pooled) memory"
    )


def print_handoff(args, results: dict) -> None:
    h = bench_handoff(args.repeats + 2)
    results["handoff"] = h
    print(f"\n{h['tokens']}-token handoff on the default model (context {h['context_tokens']}), loopback, 1 thread")
    print(f"  token IDs: payload {h['ids_payload_bytes']:>9} B   latency ms {summary(h['ids_ms'])}")
    print(f"  KV       : payload {h['kv_payload_bytes']:>9} B   latency ms {summary(h['kv_ms'])}")
    print("  published (WAN): IDs 1.5 KB, 305 ms mean, 4.8 ms std; KV 4649 KB, 185 ms mean, peaks 512.6 ms")


def print_decode_worker(args, results: dict) -> None:
    d = bench_decode_worker(args.model, args.budgets, args.repeats, LONG_PROMPT_TOKENS, SESSIONS)
    print(
        f"\nAn RLD (DecodeServicer in process, model {d['model']}, 1 thread): {d['sessions']} colocated sessions "
        f"decoding when a {d['prompt_tokens']}-token prompt arrives there;\n{args.repeats} alternating runs per "
        "decode.step_budget_tokens (0: the prompt prefilled whole between two steps). Medians of the runs:"
    )
    print(
        f"{'budget':>7} {'TPOT alone':>11} {'TPOT while prefilled':>21} {'worst':>8} {'prompt TTFT':>12}  worst per run"
    )
    for budget, runs in d["runs"].items():
        ms = {
            k: statistics.median(getattr(r, k) for r in runs) * 1e3
            for k in ("alone_s", "median_s", "worst_s", "ttft_s")
        }
        print(
            f"{budget:>7} {ms['alone_s']:>8.1f} ms {ms['median_s']:>18.1f} ms {ms['worst_s']:>5.0f} ms "
            f"{ms['ttft_s']:>9.0f} ms   " + " ".join(f"{r.worst_s * 1e3:.0f}" for r in runs)
        )
    print(
        "  TPOT: a session's gap between consecutive tokens (median over every gap that overlaps the prompt's\n"
        "  prefill; worst: the longest such gap); prompt TTFT: its arrival to its first token"
    )
    results["decode_worker"] = {**d, "runs": {b: [asdict(r) for r in runs] for b, runs in d["runs"].items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=int, default=256, help="KV per data-plane transfer (MiB)")
    parser.add_argument(
        "--frame-kib",
        type=int,
        default=PathConfig.frame_bytes >> 10,
        help="kvwire frame payload (kv.<path>.frame_bytes)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating kvwire / iperf3 windows")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each window")
    parser.add_argument("--repeats", type=int, default=3, help="handoff repeats (+2)")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", default="default", help="model of the decode worker section")
    parser.add_argument("--budgets", type=int, nargs="+", default=[0, 256], help="decode.step_budget_tokens")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results: dict = {"dataplane": [], "handoff": None, "decode_worker": None}
    if "dataplane" in args.sections:
        print_dataplane(args, results)
    if "handoff" in args.sections:
        print_handoff(args, results)
    if "decode" in args.sections:
        print_decode_worker(args, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
