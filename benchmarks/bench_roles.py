"""PDD roles benchmark: KV data-plane throughput next to iperf3 on loopback; a 100-token handoff, IDs vs KV.

Responsible for: measuring, in one run on 127.0.0.1, (1) the KV data plane
(workers/roles/kvwire.py: framing, crc32 on both ends, N connections,
delivery as an engine blob, ACK) sending default-model KV from this process
to a receiver in a child process, next to iperf3 TCP with the same number of
streams on the same path; (2) a 100-token handoff on the default model:
token IDs (protobuf HandoffRequest + the MD's extend step) vs shipping the
tokens' KV (export, data plane, import). Prints one table; --json writes it.
Not responsible for: WAN effects (the PDD experiments run this over the
emulated topology).

    .venv/bin/python benchmarks/bench_roles.py [--mbytes 256] [--repeats 3] [--json out.json]

Published counterparts (PDD.md): 100-token handoff as KV 4649 KB, 185 ms mean
(peaks 512.6 ms) over the WAN; as token IDs 1.5 KB, 305 ms mean, 4.8 ms std.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.model import DEFAULT  # noqa: E402
from workers.roles.config import PathConfig  # noqa: E402
from workers.roles.events import NullLog  # noqa: E402
from workers.roles.kvwire import Inbox, KVReceiver, KVSender, TransferMeta  # noqa: E402

log = logging.getLogger("bench_roles")
FINGERPRINT = "00" * 16
HANDOFF_TOKENS = 100
HANDOFF_CONTEXT = 512     # prompt tokens before the handoff
IPERF_SECONDS = 3


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


def _receiver_main(port: int, n_transfers: int, ready) -> None:
    inbox = Inbox()
    for i in range(n_transfers):
        inbox.expect(f"bench-{i}", "prompt")
    with KVReceiver("127.0.0.1", port, FINGERPRINT, inbox, NullLog(), max_transfer_bytes=4 << 30):
        ready.set()
        for i in range(n_transfers):
            got = inbox.wait(f"bench-{i}", "prompt", 120)
            if got is None:
                raise SystemExit(f"transfer {i} never arrived")
            got.release()  # as a decode worker does once it has imported the KV


WARMUP_TRANSFERS = 2   # until the receiver's buffer pool holds a buffer of this size (the first two land in
                       # fresh memory: a decode worker in steady state reuses its buffers)


def bench_kvwire(mbytes: int, connections: int, repeats: int) -> dict:
    """Gbit/s of `repeats` transfers of ~mbytes of default-model KV each, after WARMUP_TRANSFERS
    (their rates are reported apart as cold_gbit_s)."""
    c = DEFAULT
    row = c.n_kv_head * c.head_dim * c.dtype_bytes
    n_tokens = max(1, mbytes * 2**20 // (c.n_layer * 2 * row))
    layers = [np.random.default_rng(i).integers(0, 255, (2, n_tokens, row), dtype=np.uint8) for i in range(c.n_layer)]
    port, ctx = free_port(), mp.get_context("fork")
    ready = ctx.Event()
    total = WARMUP_TRANSFERS + repeats
    child = ctx.Process(target=_receiver_main, args=(port, total, ready))
    child.start()
    try:
        ready.wait(30)
        rates = []
        for i in range(total):
            meta = TransferMeta(f"bench-{i}", "prompt", 0, n_tokens, tuple(range(n_tokens)), FINGERPRINT,
                                c.n_layer, c.n_kv_head, c.head_dim, c.dtype)
            sender = KVSender(f"127.0.0.1:{port}", meta, PathConfig(connections=connections, stall_timeout_ms=30000,
                                                                    deadline_ms=120000), "bench", NullLog())
            t0 = time.perf_counter()
            sender.start()
            for layer, kv in enumerate(layers):
                sender.put_layer(layer, kv)
            sender.finish(None)
            result = sender.wait()
            dt = time.perf_counter() - t0
            if not result.ok:
                raise RuntimeError(f"transfer failed: {result.reason}")
            rates.append(meta.kv_bytes * 8 / dt / 1e9)
        return {"connections": connections, "kv_bytes": meta.kv_bytes, "gbit_s": rates[WARMUP_TRANSFERS:],
                "cold_gbit_s": rates[:WARMUP_TRANSFERS]}
    finally:
        child.join(60)


def bench_iperf3(streams: int) -> float:
    """iperf3 TCP goodput (Gbit/s) on 127.0.0.1 with this many parallel streams."""
    if shutil.which("iperf3") is None:
        raise RuntimeError("iperf3 not installed")
    port = free_port()
    server_cmd = ["iperf3", "-s", "-1", "-p", str(port), "-B", "127.0.0.1"]
    log.info("running %s", " ".join(server_cmd))
    server = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        client_cmd = ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(IPERF_SECONDS), "-P", str(streams), "-J"]
        log.info("running %s", " ".join(client_cmd))
        out = subprocess.run(client_cmd, capture_output=True, text=True, check=True, timeout=60)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# ---------------------------------------------------------------- handoff: IDs vs KV


def bench_handoff(repeats: int) -> dict:
    """A 100-token handoff on the default model, as token IDs (+ extend) and as KV (+ import), on loopback."""
    import torch
    from workers.engine import Engine, GenerationRequest
    from workers.proto import pdd_pb2
    from workers.roles.kvwire import meta_for
    torch.set_num_threads(1)
    eng = Engine("default", capacity_tokens=8192, block_size=16, device="cpu", prefix_cache=False)
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
            # IDs: the message the RLD sends, parsed by the MD, then one extend step
            t0 = time.perf_counter()
            msg = pdd_pb2.HandoffRequest(request_id=f"ids{r}", start_index=0, token_ids=gen[:n + 1], final=True)
            wire = msg.SerializeToString()
            got = pdd_pb2.HandoffRequest.FromString(wire)
            ids_next = eng.extend(f"ids{r}", list(got.token_ids[1:])).next_token
            ids_ms.append((time.perf_counter() - t0) * 1e3)
            ids_payload = len(wire)
            # KV: export, send on the data plane, import, then the one token without KV
            inbox.expect(f"kv{r}", "handoff")
            t0 = time.perf_counter()
            blob = eng.export_kv("rld", L, L + n)
            meta = meta_for(eng, f"kv{r}", "handoff", L, L + n, gen[:n])
            body = np.frombuffer(blob, np.uint8, offset=len(blob) - meta.kv_bytes).reshape(meta.n_layer, 2, n, -1)
            sender = KVSender(f"127.0.0.1:{port}", meta, PathConfig(), "handoff", NullLog()).start()
            for layer in range(meta.n_layer):
                sender.put_layer(layer, body[layer])
            sender.finish(None)
            result = sender.wait()
            received = inbox.wait(f"kv{r}", "handoff", 30)
            eng.import_kv(f"kv{r}", received.blob)
            received.release()
            eng.append_tokens(f"kv{r}", [gen[n]])
            kv_ms.append((time.perf_counter() - t0) * 1e3)
            kv_payload = result.wire_bytes
            # both MD copies now continue identically
            a, b = ids_next, eng.decode_step([f"kv{r}"])[f"kv{r}"]   # both: the token at index n + 1
            if a != b:
                log.warning("repeat %d: IDs and KV handoff continue with different tokens (%d vs %d)", r, a, b)
            eng.abort(f"ids{r}")
            eng.abort(f"kv{r}")
    return {"tokens": n, "context_tokens": L, "ids_payload_bytes": ids_payload, "kv_payload_bytes": kv_payload,
            "ids_ms": ids_ms, "kv_ms": kv_ms}


def summary(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"mean {statistics.mean(xs):8.2f}  max {max(xs):8.2f}  std {sd:6.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=int, default=256, help="KV per data-plane transfer (MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results: dict = {"dataplane": [], "handoff": None}
    print(f"KV data plane vs iperf3 on 127.0.0.1 ({args.mbytes} MiB of default-model KV per transfer, "
          f"{args.repeats} transfers after {WARMUP_TRANSFERS} warm-up ones; receiver in another process)")
    print(f"{'conns':>5} {'kvwire Gbit/s (best / mean)':>28} {'cold':>6} {'iperf3 Gbit/s':>14} {'ratio':>6}")
    for conns in args.connections:
        kv = bench_kvwire(args.mbytes, conns, args.repeats)
        ip = bench_iperf3(conns)
        best = max(kv["gbit_s"])
        results["dataplane"].append({**kv, "iperf3_gbit_s": ip, "ratio_best": best / ip})
        print(f"{conns:>5} {best:>14.2f} / {statistics.mean(kv['gbit_s']):<11.2f} {min(kv['cold_gbit_s']):>6.2f} "
              f"{ip:>14.2f} {best / ip:>6.0%}")
    print("  target: >= 80% of iperf3. kvwire checksums every byte on both ends (crc32c) and writes into the\n"
          "  receiver's pooled buffers; 'cold' = the slowest warm-up transfer, into fresh memory")
    h = bench_handoff(args.repeats + 2)
    results["handoff"] = h
    print(f"\n{h['tokens']}-token handoff on the default model (context {h['context_tokens']}), loopback, 1 thread")
    print(f"  token IDs: payload {h['ids_payload_bytes']:>9} B   latency ms {summary(h['ids_ms'])}")
    print(f"  KV       : payload {h['kv_payload_bytes']:>9} B   latency ms {summary(h['kv_ms'])}")
    print("  published (WAN): IDs 1.5 KB, 305 ms mean, 4.8 ms std; KV 4649 KB, 185 ms mean, peaks 512.6 ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
