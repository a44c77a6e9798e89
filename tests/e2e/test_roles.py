"""End-to-end: the PDD roles as real processes on loopback (router, P, RLD, MD), the MD's KV behind a WAN proxy.

Every mode must return the colocated greedy reference tokens (a difference
is allowed only where the reference logits nearly tie: reported as a
warning); every index arrives exactly once, in order. Timing-dependent
mechanisms (handoff after eager tokens, chunking) are made deterministic by
slowing the WAN proxy, not by sleeps.
"""

import errno
import json
import socket
import threading
import time
import warnings

import grpc
import pytest
import torch

from pdd_harness import CHUNK_TOKENS
from workers.kvwire import BEGIN, FRAME_HEADER, pack_frame
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.client import Generation, generate, stats, wait_healthy
from workers.sampling import greedy_divergence

KV_BYTES_PER_TOKEN = 512  # tiny: 2 layers x 2 x 2 kv heads x 16 dims x 4 B
SLOW_WAN_MBIT = 8.0  # 50 tokens x 512 B = 25.6 KB -> ~26 ms: the RLD decodes tens of tokens meanwhile
_seed = iter(range(1000, 100000))


def fresh_prompt(n: int) -> list[int]:
    """A prompt no earlier test used (so no prefix cache hits unless a test wants them)."""
    g = torch.Generator().manual_seed(next(_seed))
    return torch.randint(0, 256, (n,), generator=g).tolist()


def check_stream(gen, max_tokens: int, repeats_allowed: bool = False) -> None:
    """Every index once, in order. repeats_allowed: a worker that took over regenerated tokens the client
    already has; the router dropped them (counted) and each agreed with the one sent (no divergence note)."""
    idx = [t.index for t in gen.tokens]
    assert idx == list(range(max_tokens)), f"indices {idx}"
    assert gen.done is not None, "no done message"
    if repeats_allowed:
        assert "divergence" not in " ".join(gen.done.notes), gen.done
    else:
        assert gen.done.duplicates == 0, gen.done


def check_reference(reference, prompt, got: list[int], max_tokens: int, what: str) -> None:
    want = reference(prompt, max_tokens)
    d = greedy_divergence(got, want, lambda i: reference.engine.reference_logits(prompt + want[:i])[-1])
    if d is None:
        return
    assert d.is_tie, f"{what}: token {d.index} is {d.got}, reference {d.want} (margin {d.margin:.2e})"
    warnings.warn(f"{what}: near-tie divergence at token {d.index} (margin {d.margin:.2e})")


def events_of(dep, worker: str, rid: str, name: str | None = None):
    return [e for e in dep.events(worker) if e.request_id == rid and (name is None or e.event == name)]


def wait_for(pred, timeout_s: float = 10.0, what: str = "condition", poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def generate_holding_wan(dep, prompt: list[int], n: int, rid: str, release_at: int) -> Generation:
    """One chunked pdd request whose WAN (P's KV to the MD) is held until the client has the RLD's token
    release_at: the RLD is then that far ahead whatever the host's speed, and the MD ready soon after."""
    stub = pdd_pb2_grpc.RouterStub(dep.channel)
    req = pdd_pb2.GenerateRequest(request_id=rid, prompt_tokens=prompt, max_tokens=n, mode="pdd", handoff="chunked")
    tokens, done, t0 = [], None, time.monotonic_ns()
    dep.proxy.hold = True
    try:
        for ev in stub.Generate(req, timeout=120):
            if ev.WhichOneof("kind") != "token":
                done = ev.done
                continue
            tokens.append(ev.token)
            if ev.token.worker == "rld1" and ev.token.index >= release_at:
                dep.proxy.hold = False
    finally:
        dep.proxy.hold = False
    return Generation(tuple(tokens), done, time.monotonic_ns() - t0)


@pytest.fixture
def slow_wan(dep):
    dep.proxy.faults.rate_mbit = SLOW_WAN_MBIT
    yield dep.proxy
    dep.proxy.faults.rate_mbit = 0.0


@pytest.fixture(scope="module")
def baseline(dep):
    """Worker stats after one warm-up request of every route (channels and pools exist by then)."""
    for mode in ("colocated", "pd-intra", "pd-cross", "pdd"):
        generate(dep.channel, fresh_prompt(40), 8, mode=mode)
    return {w: stats(dep.cfg.pool(w)[0].grpc_address) for w in ("p", "rld", "md")}


# ---------------------------------------------------------------- modes


@pytest.mark.parametrize(
    "mode,handoff",
    [
        ("colocated", ""),
        ("pd-intra", ""),
        ("pd-cross", ""),
        ("pdd", "oneshot"),
        ("pdd", "chunked"),
        ("pdd", "auto"),
        ("pdd", "kv"),
    ],
)
def test_mode_matches_colocated_reference(dep, reference, slow_wan, baseline, mode, handoff):
    # 40 prompt tokens cross the slow WAN in ~20 ms (8 Mbit/s) while the RLD decodes ~1 token/ms: the MD
    # takes over well before the 80th token. chunked must have more tokens to hand over than one chunk (8) when the
    # MD is ready, and a rate cannot promise that (the RLD's speed is the host's: a loaded one was not a chunk
    # ahead at 8 Mbit/s, an idle one finished all 80 at 2): the WAN holds P's KV until the RLD is past a chunk.
    prompt, n = fresh_prompt(40), 80
    rid = f"m-{mode}-{handoff}"
    if handoff == "chunked":
        slow_wan.faults.rate_mbit = 0.0
        gen = generate_holding_wan(dep, prompt, n, rid, release_at=CHUNK_TOKENS + 4)
    else:
        gen = generate(dep.channel, prompt, n, mode=mode, handoff=handoff, request_id=rid)
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, f"{mode}/{handoff}")
    rid = gen.done.request_id
    workers = set(gen.workers)
    expect = {"colocated": {"rld1"}, "pd-intra": {"p1", "rld1"}, "pd-cross": {"p1", "md1"}}
    if mode in expect:
        assert workers == expect[mode]
        return
    # pdd: P's first token, eager tokens from the RLD, the rest from the MD after the handoff
    assert gen.done.route == "p-rld-md" and workers == {"p1", "rld1", "md1"}, (gen.done, workers)
    assert gen.workers.index("md1") > max(i for i, w in enumerate(gen.workers) if w == "rld1")
    starts = events_of(dep, "rld1", rid, "handoff_start")
    ends = events_of(dep, "rld1", rid, "handoff_end")
    assert starts and ends[-1].fields["final"], starts
    if handoff == "chunked":
        # the RLD was more than a chunk (and P's token) ahead once the MD was ready: a chunk goes first
        first = starts[0].fields
        assert not first["final"] and first["tokens"] >= CHUNK_TOKENS, f"no chunk before the final handoff: {first}"
    if handoff == "kv":
        assert events_of(dep, "md1", rid, "kv_recv_end")[-1].fields["kind"] == "handoff"
    assert events_of(dep, "md1", rid, "extend") or handoff == "kv"


def test_p_sends_on_both_paths_concurrently(dep, reference, slow_wan):
    prompt = fresh_prompt(60)
    gen = generate(dep.channel, prompt, 30, mode="pdd")
    rid = gen.done.request_id
    span = {}
    for path in ("fast", "wan"):
        start = [e for e in events_of(dep, "p1", rid, "kv_send_start") if e.fields["path"] == path]
        # the request may end (the RLD decodes fast) before the slow WAN copy does: it finishes anyway
        end = wait_for(
            lambda: [e for e in events_of(dep, "p1", rid, "kv_send_end") if e.fields["path"] == path],
            what=f"the {path} transfer to complete",
        )
        assert start and end, f"no complete {path} transfer"
        span[path] = (start[0].t_ns, end[0].t_ns)
    (fs, fe), (ws, we) = span["fast"], span["wan"]
    assert fs < we and ws < fe, f"fast {span['fast']} and wan {span['wan']} do not overlap"
    # the fast path lands first: the RLD starts decoding while the WAN copy is in flight
    assert events_of(dep, "rld1", rid, "kv_imported")[0].t_ns < events_of(dep, "md1", rid, "kv_imported")[0].t_ns


def test_warm_drc_sends_only_the_suffix_over_the_wan(dep, reference):
    shared = fresh_prompt(64)  # 4 whole blocks of 16
    first = generate(dep.channel, shared + fresh_prompt(8), 8, mode="pdd")
    check_stream(first, 8)
    dep.proxy.reset_counters()
    prompt = shared + fresh_prompt(24)  # 88 tokens; the DRC holds the first 64
    gen = generate(dep.channel, prompt, 8, mode="pdd")
    check_stream(gen, 8)
    check_reference(reference, prompt, gen.ids, 8, "warm DRC")
    rid = gen.done.request_id
    assert gen.done.md_cached_tokens == 64
    assert events_of(dep, "p1", rid, "drc_query")[0].fields["cached_tokens"] == 64
    wan = [e for e in events_of(dep, "p1", rid, "kv_send_end") if e.fields["path"] == "wan"][0]
    assert wan.fields["kv_bytes"] == KV_BYTES_PER_TOKEN * (len(prompt) - 64)
    framing = wan.fields["wire_bytes"] - wan.fields["kv_bytes"]
    assert 0 < framing < 2048, f"framing {framing} bytes"  # headers + the JSON BEGIN/END
    assert dep.proxy.bytes_forwarded == wan.fields["wire_bytes"]  # what really crossed the WAN


def test_a_turn_the_rld_finished_ends_at_the_md_and_the_next_ships_only_what_is_new(dep, reference):
    """PDD ends every pipeline at the MD. A P->RLD->MD request the RLD finished alone (its WAN copy held):
    the RLD gives the MD its output, which the MD recomputes once the copy lands, so its DRC keeps prompt +
    output. The next turn, routed while that copy is still under way, ships only what lies beyond it (the
    MD's in-flight DRC): on wan-lossy every turn used to ship its whole prompt again, the copies crowded
    the line and none landed in time (0 handoffs). The router's mirror counts only what the MD holds: a
    turn it sent P->MD on a guess met a cold MD (60 s first tokens)."""
    first_prompt = fresh_prompt(64)
    dep.proxy.faults.blackhole = True  # the WAN copies are held: the RLD finishes both turns alone
    try:
        first = generate(dep.channel, first_prompt, 30, mode="pdd")
        wait_for(lambda: events_of(dep, "md1", first.done.request_id, "relay_output"), what="the RLD's output")
        follow = first_prompt + first.ids + fresh_prompt(8)
        second = generate(dep.channel, follow, 8, mode="pdd")
    finally:
        dep.proxy.faults.blackhole = False
    check_stream(first, 30)
    check_stream(second, 8)
    check_reference(reference, follow, second.ids, 8, "second turn")
    rid1, rid2 = first.done.request_id, second.done.request_id
    [route] = events_of(dep, "router", rid2, "route")
    assert route.fields["md_cached_tokens"] == 0, "the mirror counted a prompt the MD does not hold yet"
    [inflight] = events_of(dep, "md1", rid2, "drc_inflight")
    assert inflight.fields["after"] == rid1 and inflight.fields["inflight_tokens"] == 80  # 64 + 30 -> 5 blocks
    [drc] = events_of(dep, "p1", rid2, "drc_query")
    assert drc.fields["cached_tokens"] == 80
    [wan] = [e for e in events_of(dep, "p1", rid2, "kv_send_start") if e.fields["path"] == "wan"]
    assert (wan.fields["start"], wan.fields["end"]) == (80, len(follow))  # not the whole prompt again
    for rid in (rid1, rid2):  # the held copies are retried and land; the MD's sessions end
        wait_for(lambda: events_of(dep, "md1", rid, "decode_close"), what="the MD to close")
    [absorbed] = events_of(dep, "md1", rid1, "relay_absorbed")
    assert absorbed.fields["tokens"] == 29  # P's first token came with the KV
    [ready] = events_of(dep, "md1", rid2, "drc_inflight_ready")
    assert ready.fields["cached_tokens"] >= 80
    learned = wait_for(lambda: events_of(dep, "router", rid1, "drc_learned"), what="drc_learned")
    assert learned[0].fields == {"tokens": 94, "cause": "md_absorbed_relay"}
    third = generate(dep.channel, follow + fresh_prompt(8), 8, mode="pdd")
    check_stream(third, 8)
    rid = third.done.request_id
    [route] = events_of(dep, "router", rid, "route")
    [drc] = events_of(dep, "p1", rid, "drc_query")
    assert route.fields["md_cached_tokens"] == drc.fields["cached_tokens"] == 96, (route.fields, drc.fields)


def test_a_late_drc_answer_does_not_hold_back_the_first_token(dep):
    """P's reply (and so the first token, which the RLD sends) must not wait for the MD's DRC answer: on a
    congested WAN that answer queues behind KV for seconds. Here the DRC "MD" accepts TCP and never speaks,
    so its PrefixLength runs into P's 5 s deadline; the fast-path copy and the reply do not wait for it."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        stub = pdd_pb2_grpc.PrefillStub(grpc.insecure_channel(dep.cfg.p[0].grpc_address))
        targets = [
            pdd_pb2.KVTarget(path="fast", kv_address=dep.cfg.rld[0].kv_address, start_tokens=0),
            pdd_pb2.KVTarget(
                path="wan", kv_address=dep.cfg.md[0].kv_address, drc_address=f"127.0.0.1:{silent.getsockname()[1]}"
            ),
        ]
        t0 = time.monotonic()
        reply = stub.Prefill(
            pdd_pb2.PrefillRequest(request_id="late-drc", prompt_tokens=fresh_prompt(40), targets=targets),
            timeout=30,
        )
        took_s = time.monotonic() - t0
        assert took_s < 2.0, f"P's reply waited {took_s:.1f} s for the WAN target's DRC"
        assert reply.sent_from_tokens == [0]  # the fast path only, so far
        failed = wait_for(lambda: events_of(dep, "p1", "late-drc", "drc_query_failed"), 15, "the DRC query to fail")
        assert "DEADLINE_EXCEEDED" in failed[0].fields["reason"]
    finally:
        silent.close()


def test_singular_request_never_completes_a_wan_transfer(dep, reference):
    prompt, n = fresh_prompt(60), 3
    gen = generate(dep.channel, prompt, n, mode="pdd")
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, "singular")
    rid = gen.done.request_id
    assert gen.done.route == "p-rld-singular" and "md1" not in gen.workers
    assert not [e for e in events_of(dep, "p1", rid, "kv_send_end") if e.fields["path"] == "wan"]
    assert not events_of(dep, "md1", rid, "kv_recv_end")
    blocked = events_of(dep, "router", rid, "wan_blocked")
    assert blocked and blocked[0].fields["kv_bytes_saved"] == 60 * KV_BYTES_PER_TOKEN


# ---------------------------------------------------------------- WAN faults


def test_wan_connection_cut_mid_transfer_is_retried(dep, reference):
    dep.proxy.faults.cut_after_bytes = 3000
    prompt, n = fresh_prompt(60), 20
    gen = generate(dep.channel, prompt, n, mode="pdd")
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, "WAN cut")
    rid = gen.done.request_id
    assert "cut" in dep.proxy.events
    retries = [e for e in events_of(dep, "p1", rid, "kv_send_retry") if e.fields["path"] == "wan"]
    assert retries, "the cut WAN transfer was not retried"
    # the MD kept what arrived before the cut and the retry resumed that transfer instead of starting over
    assert events_of(dep, "md1", rid, "kv_recv_orphaned"), "the cut transfer was not kept for a resume"
    resumed = events_of(dep, "md1", rid, "kv_recv_resume")
    assert resumed and resumed[0].fields["state"] == "partial", resumed


def test_stalled_wan_transfer_is_retried(dep, reference):
    dep.proxy.faults.stall_after_bytes = 1000
    prompt, n = fresh_prompt(60), 20
    gen = generate(dep.channel, prompt, n, mode="pd-cross")  # no RLD to finish first: only a retry saves it
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, "WAN stall")
    rid = gen.done.request_id
    retries = [e for e in events_of(dep, "p1", rid, "kv_send_retry") if e.fields["path"] == "wan"]
    assert retries and "stalled" in retries[0].fields["reason"], retries


def test_wan_down_past_the_deadline_completes_on_the_rld(dep, reference):
    dep.proxy.faults.blackhole = True
    try:
        prompt, n = fresh_prompt(60), 60
        gen = generate(dep.channel, prompt, n, mode="pdd")
    finally:
        dep.proxy.faults.blackhole = False
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, "WAN down")
    rid = gen.done.request_id
    assert set(gen.workers) == {"p1", "rld1"}
    done = wait_for(lambda: events_of(dep, "rld1", rid, "completed_on_rld"), what="completed_on_rld")  # written
    assert done[0].fields["reason"] == "md_never_ready"  # just after the last token


def test_corrupted_kv_frame_is_refused_and_retried(dep, reference):
    dep.proxy.faults.corrupt_at_byte = 1500  # inside the first LAYER payload
    prompt, n = fresh_prompt(60), 20
    gen = generate(dep.channel, prompt, n, mode="pd-cross")
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, "corrupted frame")
    rid = gen.done.request_id
    errors = [e for e in dep.events("md1") if e.event == "kv_frame_error" and "checksum" in e.fields["reason"]]
    assert errors, "no checksum error recorded"
    assert [e for e in events_of(dep, "p1", rid, "kv_send_retry") if e.fields["path"] == "wan"]


# ---------------------------------------------------------------- bad input


def rpc_error(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


@pytest.mark.parametrize(
    "prompt,max_tokens,mode,needle",
    [
        ([], 4, "", "prompt is empty"),
        ([1, 2, 300], 4, "", "outside the vocabulary"),
        ([1, 2, 3], 0, "", "max_tokens=0"),
        (list(range(1, 128)) * 2, 4, "", "at most 127"),
        ([1, 2, 3], 4, "warp", "mode 'warp'"),
    ],
)
def test_malformed_requests_get_invalid_argument(dep, prompt, max_tokens, mode, needle):
    err = rpc_error(lambda: generate(dep.channel, prompt, max_tokens, mode=mode))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in err.details(), err.details()


def test_oversized_request_gets_resource_exhausted(dep):
    err = rpc_error(lambda: generate(dep.channel, [1] * (5 << 20), 4))  # 5 MiB of packed varints > the 4 MiB limit
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_duplicate_request_id_is_refused_and_the_original_completes(dep, reference, slow_wan):
    """A second Generate with the id of one in flight used to open its own sessions under that id and, on
    its way out, cancel P's transfers for it: the original lost its KV."""
    slow_wan.faults.rate_mbit = 0.2  # 20 KB of KV take ~0.8 s: the first request is in flight meanwhile
    prompt, out = fresh_prompt(40), {}
    first = threading.Thread(
        target=lambda: out.setdefault("gen", generate(dep.channel, prompt, 8, mode="pd-cross", request_id="dup"))
    )
    first.start()
    wait_for(lambda: events_of(dep, "router", "dup", "route"), what="the first request to be routed")
    err = rpc_error(lambda: generate(dep.channel, fresh_prompt(40), 8, mode="pd-cross", request_id="dup"))
    first.join(30)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "in flight" in err.details(), err.details()
    gen = out["gen"]
    check_stream(gen, 8)
    check_reference(reference, prompt, gen.ids, 8, "the original of a duplicate id")


def test_a_stopped_load_generator_records_the_whole_workload(dep, slow_wan, tmp_path):
    """SIGTERM (a variant's timeout) or Ctrl-C used to leave in-flight and unsent requests out of the client
    log ("done 30/30" for a workload of 42): each must appear once, interrupted or not issued."""
    import signal
    import subprocess
    import sys

    from experiments.spec.workload import WorkloadRequest, write

    slow_wan.faults.rate_mbit = 0.1  # 20 KB of KV per request: ~1.6 s each over the WAN
    reqs = []
    for s in range(2):
        for turn in (1, 2, 3):
            rid = f"lg{s}-{turn}"
            after = f"lg{s}-{turn - 1}" if turn > 1 else None
            head = tuple(fresh_prompt(40 if turn == 1 else 8))
            reqs.append(WorkloadRequest(rid, f"s{s}", turn, "turn", 4, 0.0, after, 0.0, head, len(head), 0))
    write(reqs, tmp_path / "w.jsonl")
    out = tmp_path / "client.jsonl"
    argv = [sys.executable, "-m", "experiments.run.loadgen", "run", "--workload", str(tmp_path / "w.jsonl")]
    argv += ["--router", dep.cfg.router.grpc_address, "--variant", "pd-cross", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("start "):
                break
        time.sleep(0.5)  # both first turns are in flight, their successors not sent
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 130
    finally:
        proc.kill()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["request_id"] for r in rows) == sorted(r.request_id for r in reqs)
    errors = [r["error"] or "" for r in rows]
    assert sum(e.startswith("interrupted: SIGTERM") for e in errors) == 2, errors
    assert sum(e.startswith("not issued: interrupted") for e in errors) == 4, errors


def test_the_clock_starts_once_the_warmup_prefix_is_in_the_md_drc(dep, slow_wan, tmp_path):
    """pdd's RLD finishes the warm-up long before its WAN copy lands on a slow line; with --settle the load
    generator starts its clock only once the MD's DRC holds the warm-up prompt, so no measured request
    waits on that copy (on wan-lossy it took 20-30 s of a ~50 s window)."""
    import subprocess
    import sys

    from experiments.spec.workload import WorkloadRequest, write

    slow_wan.faults.rate_mbit = 0.1  # 100 tokens x 512 B = 51 KB: ~4 s over the WAN, the RLD replies first
    warm = tuple(fresh_prompt(100))
    turn = warm + tuple(fresh_prompt(8))
    reqs = [
        WorkloadRequest("sw0", "w", 1, "warmup", 16, 0.0, None, 0.0, warm, len(warm), 0),
        WorkloadRequest("sw1", "s", 1, "turn", 2, 0.0, None, 0.0, turn, len(turn), 0),
    ]
    write(reqs, tmp_path / "w.jsonl")
    md = dep.cfg.pool("md")[0].grpc_address
    argv = [sys.executable, "-m", "experiments.run.loadgen", "run", "--workload", str(tmp_path / "w.jsonl")]
    argv += ["--router", dep.cfg.router.grpc_address, "--variant", "pdd", "--out", str(tmp_path / "c.jsonl")]
    argv += ["--settle", md, "--block-size", str(dep.cfg.block_size), "--settle-timeout-s", "60"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    settled, out = None, []
    try:
        for line in proc.stdout:
            out.append(line)
            if line.startswith("settle "):
                settled = line.split()
            if line.startswith("start "):
                with grpc.insecure_channel(md) as ch:
                    hit = pdd_pb2_grpc.DecodeStub(ch).Lookup(pdd_pb2.LookupRequest(prompt_tokens=warm)).cached_tokens
                break
        assert proc.wait(60) == 0, "".join(out)
    finally:
        proc.kill()
    assert settled is not None, "".join(out)
    print(" ".join(settled), "| MD hit at t0:", hit)
    want = (len(warm) - 1) // dep.cfg.block_size * dep.cfg.block_size
    assert settled[1] == "ok=1" and settled[3] == f"cached={want}/{want}"
    assert float(settled[2].split("=")[1]) > 0.5  # it did wait: the copy was still on the slow line
    assert hit == want


def test_a_load_generator_stopped_while_it_settles_records_every_request(dep, slow_wan, tmp_path):
    """A SIGTERM during the warm-up's settle (before the clock starts) used to end the load generator with a
    traceback and no record of the measured requests; each must be in the log as not issued."""
    import signal
    import subprocess
    import sys

    from experiments.spec.workload import WorkloadRequest, write

    slow_wan.faults.rate_mbit = 0.05  # the warm-up's WAN copy takes ~8 s: the settle is still waiting
    warm = tuple(fresh_prompt(100))
    reqs = [WorkloadRequest("iw0", "w", 1, "warmup", 4, 0.0, None, 0.0, warm, len(warm), 0)]
    for s in range(3):
        head = warm + tuple(fresh_prompt(8))
        reqs.append(WorkloadRequest(f"is{s}", f"s{s}", 1, "turn", 2, 0.0, None, 0.0, head, len(head), 0))
    write(reqs, tmp_path / "w.jsonl")
    out = tmp_path / "c.jsonl"
    argv = [sys.executable, "-m", "experiments.run.loadgen", "run", "--workload", str(tmp_path / "w.jsonl")]
    argv += ["--router", dep.cfg.router.grpc_address, "--variant", "pdd", "--out", str(out)]
    argv += ["--settle", dep.cfg.pool("md")[0].grpc_address, "--block-size", str(dep.cfg.block_size)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("progress ") and "last=iw0" in line:
                break  # the warm-up is done: the settle polls the MD now
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 130, "".join(lines) + proc.stdout.read()
    finally:
        proc.kill()
    rows = {r["request_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == sorted(r.request_id for r in reqs)
    assert rows["iw0"]["error"] is None  # the warm-up itself completed
    for s in range(3):
        assert rows[f"is{s}"]["error"].startswith("not issued: interrupted before it was sent: SIGTERM")


def test_unknown_request_ids_get_not_found(dep):
    with grpc.insecure_channel(dep.cfg.md[0].grpc_address) as ch:
        stub = pdd_pb2_grpc.DecodeStub(ch)
        err = rpc_error(lambda: stub.Handoff(pdd_pb2.HandoffRequest(request_id="nope", token_ids=[1]), timeout=5))
        assert err.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.details()
        err = rpc_error(lambda: stub.KVReady(pdd_pb2.KVReadyRequest(request_id="nope"), timeout=5))
        assert err.code() == grpc.StatusCode.NOT_FOUND


def raw_kv(dep, data: bytes) -> bytes:
    """Send raw bytes to the MD's KV listener; return what it answers before closing."""
    with socket.create_connection(("127.0.0.1", dep.cfg.md[0].kv_port), timeout=5) as s:
        s.sendall(data)
        try:
            s.shutdown(socket.SHUT_WR)
            return s.recv(1024)
        # closed with our unread bytes still queued (a reset, which can come before our shutdown: ENOTCONN):
        # a refusal too; the kv_frame_error event says why
        except OSError as err:
            if err.errno in (errno.ECONNRESET, errno.ENOTCONN):
                return b""
            raise


@pytest.mark.parametrize(
    "data,needle",
    [
        (b"GET / HTTP/1.1\r\n\r\n" + bytes(32), "bad magic"),
        (pack_frame(BEGIN, 7, payload_len=100, crc=0) + b"{", "truncated payload"),
        (pack_frame(BEGIN, 8, payload_len=2, crc=0) + b"{}", "checksum"),
        (pack_frame(BEGIN, 9, payload_len=1 << 30, crc=0), "exceeds the limit"),
        (pack_frame(BEGIN, 10)[: FRAME_HEADER.size - 5], "truncated frame header"),
    ],
)
def test_bad_kv_frames_are_refused_with_an_error_event(dep, reference, data, needle):
    before = len(dep.events("md1"))
    assert raw_kv(dep, data) == b""
    wait_for(
        lambda: any(e.event == "kv_frame_error" and needle in e.fields["reason"] for e in dep.events("md1")[before:]),
        what=f"kv_frame_error with {needle!r}",
    )
    prompt = fresh_prompt(30)  # the other requests carry on
    gen = generate(dep.channel, prompt, 6, mode="pd-cross")
    check_reference(reference, prompt, gen.ids, 6, "after a bad frame")


# ---------------------------------------------------------------- leaks, then a peer that disappears


def test_nothing_leaked(dep, baseline):
    def clean():
        now = {w: stats(dep.cfg.pool(w)[0].grpc_address) for w in ("p", "rld", "md")}
        return (
            all(
                s.open_requests == 0
                and s.sessions == 0
                and s.active_transfers == 0
                and s.free_blocks == s.total_blocks
                and s.threads <= baseline[w].threads
                and s.sockets <= baseline[w].sockets
                for w, s in now.items()
            )
            and now
        )

    try:
        wait_for(clean, 10, "workers back to their baseline")
    except AssertionError:
        now = {w: stats(dep.cfg.pool(w)[0].grpc_address) for w in ("p", "rld", "md")}
        raise AssertionError(f"baseline {baseline}\nnow {now}")


def test_rld_disappearing_after_kv_ready_completes_on_the_md(dep, reference, slow_wan):
    """The RLD dies between the MD's KVReady and the handoff: the MD, waiting for the handoff, finds its
    relay gone and decodes alone; the request completes long before the router's deadline."""
    prompt, n = fresh_prompt(50), 70
    result = {}
    # The prompt KV crosses the WAN on 2 connections; the KV handoff's connections are held, so the
    # RLD is inside its handoff, after KVReady, when it is killed (however busy the machine).
    dep.proxy.reset_counters()
    dep.proxy.faults.blackhole_after = dep.cfg.kv.wan.connections

    def run():
        try:
            result["gen"] = generate(dep.channel, prompt, n, mode="pdd", handoff="kv", request_id="kill-rld")
        except Exception as exc:  # surfaced below, with the request's fate
            result["error"] = exc

    t0 = time.monotonic()
    t = threading.Thread(target=run)
    t.start()
    try:
        wait_for(
            lambda: [e for e in events_of(dep, "rld1", "kill-rld", "kv_send_start") if e.fields["path"] == "handoff"],
            timeout_s=30,
            what="the RLD's KV handoff to start",
        )
        assert events_of(dep, "md1", "kill-rld", "kv_ready_sent")
        dep.kill("rld")
        t.join(60)
    finally:
        dep.proxy.faults.blackhole_after = -1
        dep.start_role("rld")
        wait_healthy(dep.cfg.rld[0].grpc_address, timeout_s=90)
    assert "gen" in result, f"the request failed after the RLD was killed: {result.get('error')!r}"
    gen = result["gen"]
    check_stream(gen, n, repeats_allowed=True)  # the MD decodes from P's first token: the RLD's are repeats
    check_reference(reference, prompt, gen.ids, n, "RLD killed after KVReady")
    assert "md1" in gen.workers
    lost = events_of(dep, "md1", "kill-rld", "relay_lost")
    assert lost and lost[0].fields["after_kv_ready"], "the MD did not record its relay as lost"
    assert time.monotonic() - t0 < 30, "the request waited for a deadline instead of noticing the RLD was gone"
    # the restarted RLD serves the next pdd request, once the router's channel has reconnected (its
    # backoff is at most 1 s: until then a request gets UNAVAILABLE)
    wait_for(lambda: _serves(dep, "pd-intra"), timeout_s=10, what="the router to reach the restarted RLD")
    gen = generate(dep.channel, fresh_prompt(50), 20, mode="pdd")
    check_stream(gen, 20)


def test_a_dead_rld_leaves_p_rld_md_requests_to_the_md(dep, reference):
    """The RLD is down when a P->RLD->MD request arrives: P's fast copy and the RLD's stream fail, the MD
    imports the WAN copy, finds its relay lost and decodes alone, from P's token 0 (which the RLD would
    have sent): the request completes. (Before, the MD streamed from index 1 and the client never got
    token 0: the fault suite's killed RLD failed such requests with every other token decoded.)"""
    dep.kill("rld")
    try:
        prompt, n = fresh_prompt(50), 12
        gen = generate(dep.channel, prompt, n, mode="pdd", request_id="rld-down")
    finally:
        dep.start_role("rld")
        wait_healthy(dep.cfg.rld[0].grpc_address, timeout_s=90)
    check_stream(gen, n, repeats_allowed=True)
    check_reference(reference, prompt, gen.ids, n, "RLD down")
    assert gen.done.route == "p-rld-md" and set(gen.workers) == {"p1", "md1"}, (gen.done.route, gen.workers)
    assert events_of(dep, "md1", "rld-down", "relay_lost")
    wait_for(lambda: _serves(dep, "pd-intra"), timeout_s=10, what="the router to reach the restarted RLD")


def _serves(dep, mode: str) -> bool:
    try:
        generate(dep.channel, fresh_prompt(20), 2, mode=mode)
        return True
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        return False


def test_md_disappearing_mid_request_completes_on_the_rld(dep, reference, slow_wan):
    prompt, n = fresh_prompt(50), 60
    result = {}
    warm = fresh_prompt(64)  # ends at the MD: the router's DRC mirror then routes P->MD
    check_stream(generate(dep.channel, warm + fresh_prompt(8), 8, mode="pdd", request_id="warm-md"), 8)
    # The mirror learns only once the MD's session ends (drained in the background): wait for it,
    # or the blackhole below could hold that WAN copy back too and the mirror would never learn.
    wait_for(lambda: events_of(dep, "router", "warm-md", "drc_learned"), what="the mirror to learn the warm prefix")
    # Hold the WAN copy back, so the MD dies before any handoff (deterministically, however
    # busy the machine); an MD dying after it took over: test_md_after_handoff.py.
    dep.proxy.faults.blackhole = True

    def run():
        try:
            result["gen"] = generate(dep.channel, prompt, n, mode="pdd", request_id="kill-md")
        except Exception as exc:  # surfaced below, with the request's fate
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    wait_for(
        lambda: [e for e in events_of(dep, "p1", "kill-md", "kv_send_start") if e.fields["path"] == "wan"],
        what="the WAN transfer to start",
    )
    dep.kill("md")
    t.join(60)
    dep.proxy.faults.blackhole = False
    assert "gen" in result, f"the request failed after the MD was killed: {result.get('error')!r}"
    gen = result["gen"]
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, "MD killed")
    assert "md1" not in gen.workers
    # a new pdd request completes on the RLD (the MD's session and DRC query fail, recorded);
    # pd-cross, which needs the MD, gets a clear status; other modes carry on
    gen = generate(dep.channel, fresh_prompt(50), 20, mode="pdd", request_id="after-md")
    check_stream(gen, 20)
    assert "md1" not in gen.workers
    assert [
        e
        for e in dep.events("router")
        if e.event == "source_failed" and e.fields["source"] == "md" and e.request_id == "after-md"
    ]
    err = rpc_error(lambda: generate(dep.channel, fresh_prompt(50), 20, mode="pd-cross"))
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    # a pdd request routed P->MD (its prefix is in the mirror) falls back to the RLD, recorded
    direct = warm + fresh_prompt(4)
    gen = generate(dep.channel, direct, 10, mode="pdd", request_id="direct-after-md")
    check_stream(gen, 10)
    check_reference(reference, direct, gen.ids, 10, "P->MD with the MD gone")
    assert gen.done.route == "p-rld-fallback" and "md1" not in gen.workers
    fb = [e for e in dep.events("router") if e.event == "route_fallback" and e.request_id == "direct-after-md"]
    assert fb and fb[0].fields["from_route"] == "p-md", fb
    gen = generate(dep.channel, prompt, 10, mode="pd-intra")
    check_stream(gen, 10)
