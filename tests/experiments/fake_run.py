"""A synthetic run directory (what the runner writes), to test the analysis without a topology.

make_run(root) is a run of the data plane before TCP_INFO (no kv_tcp_info, no congestion or retransmission
fields, no link changes); make_run(root, tcp=True) adds what the newer data plane and runner record
(see TCP_* below for the figures the tests expect) and WAN captures with real TCP/UDP headers;
make_run(root, pools={"p": 2, "md": 2}) is a run of worker pools whose roles log what each worker did (see
POOL_* below): P alternates between p1 and p2, pd-cross's MD between md1 and md2, pdd sends every request
to md1 (the cache-aware pick), so md2 serves nothing there."""

import json
import struct
from pathlib import Path

from experiments.rundir import clientlog, metadata
from experiments.run import deploy
from experiments.spec import experiment as specmod, workload as wl
from experiments.rundir.clientlog import ClientRecord, Done, TokenRow
from experiments.spec.deployment import KV_PORTS, role_of, worker_ip
from experiments.rundir.metadata import RunMetadata, VariantRecord
from topology.profiles import LinkParams, Profile

T0 = 10_000_000_000  # monotonic ns of the first send
MS = 1_000_000


def _client(variant: str, req, i: int, prefill_ms: float, decode_ms: float, worker_seq: list[str]) -> ClientRecord:
    t_send = T0 + i * 500 * MS
    toks, t = [], t_send + int(prefill_ms * MS)
    for k in range(req.max_tokens):
        toks.append(TokenRow(k, (7 * k + i) % 256, worker_seq[k], t, t))
        t += int((decode_ms if k else 0) * MS) if k else int(decode_ms * MS)
    rec = clientlog.new_record(
        req.request_id, variant, variant, req.session, req.turn, req.kind, req.max_tokens, req.head_tokens, T0
    )
    rec.prompt_tokens, rec.t_send_ns, rec.t_done_ns, rec.tokens = req.prompt_len, t_send, t, toks
    rec.done = Done(
        route=ROUTE[variant],
        finish_reason="length",
        duplicates=0,
        md_cached_tokens=req.cached_tokens if variant == "pdd" else 0,
        notes=[],
    )
    return rec


PROVENANCE = {
    "git": {"commit": None, "dirty": None},
    "kernel": "6.1.0",
    "python": "3.11.2",
    "hostname": "fake",
    "argv": ["fake_run"],
    "tools": {"tc": None},
    "started_at": "2026-12-01T09:00:00+0000",
}


def topology_record(rate_mbit: float = 200.0) -> dict:
    """What Testbed.metadata() says, for a topology that never ran."""
    wan = Profile(
        "fake", "", LinkParams(rate_mbit=rate_mbit, delay_ms=30), LinkParams(rate_mbit=rate_mbit, delay_ms=30)
    )
    lan = Profile("lan", "", LinkParams(), LinkParams())
    return {
        "backend": "userspace",
        "backend_requested": "auto",
        "backend_reason": "fake",
        "lan_shaping": None,
        "wan_profile": wan.to_dict(),
        "lan_profile": lan.to_dict(),
        "hosts": [],
        "seed": 1,
        "snaplen_bytes": 128,
        "link_changes": [],
    }


ROUTE = {"colocated": "colocated", "pd-intra": "p-rld", "pd-cross": "p-md", "pdd": "p-rld-md"}


HEADER_BYTES = 100  # framing of one transfer (tcp=True)
RETRY_EXTRA_BYTES = 5000  # what the first attempt of the retried transfer sent
FAILED_WIRE_BYTES = 1000  # the failed WAN transfer of r0002 in pdd
RESUMED_BYTES = 2048  # KV the retry of r0003 did not resend
RLD_SESSION_MS = 300  # pdd: each request holds the RLD this long (r0005: 797 ms, overlapping r0006)


def _wan_time_ms(i: int) -> int:
    return 50 + 10 * i  # request i's WAN transfer (tcp=True): 50, 60, ... 140 ms


def _tcp_events(variant: str, req, i: int, n_bytes: int) -> tuple[list[tuple[float, str, dict]], dict]:
    """What the newer data plane adds around request i's WAN transfer (times are offsets in ms from send)."""
    t_start = 5 if variant == "pdd" else 3  # the kv_send_start's offset in _events
    t_end = t_start + _wan_time_ms(i)
    cc = "bbr" if variant == "pdd" else "cubic"  # pd-cross's kernel fell back: a warning
    ev = []
    for conn in (0, 1):
        for k, phase in enumerate(("start", "sample", "end")):
            ev.append(
                (
                    t_start + k * (t_end - t_start) / 2,
                    "p1",
                    {
                        "event": "kv_tcp_info",
                        "path": "wan",
                        "attempt": 1,
                        "conn": conn,
                        "phase": phase,
                        "cc": cc,
                        "rtt_us": 30_000 + 10_000 * k,
                        "snd_cwnd": 10 * (k + 1),
                        "total_retrans": 5 * i + k,
                        "bytes_retrans": (5 * i + k) * 1448,
                        "snd_mss": 1448,
                    },
                )
            )
    end = {
        "t_ns_ms": t_end,
        "kv_bytes": n_bytes,
        "wire_bytes": n_bytes + HEADER_BYTES,
        "attempts": 1,
        "congestion_requested": "bbr",
        "congestion_used": [cc, cc],
    }
    if variant == "pdd":
        end.update(retrans_segs=4, bytes_retrans=4 * 1448)  # pd-cross: derived from the samples (2 per connection)
    if variant == "pdd" and req.request_id == "r0003":
        end.update(attempts=2, wire_bytes=n_bytes + HEADER_BYTES + RETRY_EXTRA_BYTES, resumed_kv_bytes=RESUMED_BYTES)
        ev.append((t_start + 10, "p1", {"event": "kv_send_retry", "path": "wan", "attempt": 1, "reason": "stall"}))
    if variant == "pdd" and req.request_id == "r0002":
        ev += [
            (t_end + 1, "p1", {"event": "kv_send_start", "path": "wan", "congestion": "bbr"}),
            (t_end + 2, "p1", {"event": "kv_send_retry", "path": "wan", "attempt": 1, "reason": "reset"}),
            (
                t_end + 3,
                "p1",
                {
                    "event": "kv_send_failed",
                    "path": "wan",
                    "kv_bytes": 0,
                    "attempts": 2,
                    "wire_bytes": FAILED_WIRE_BYTES,
                    "reason": "failed: reset",
                },
            ),
        ]
    if variant == "pdd" and req.request_id == "r0004":
        ev.append(
            (
                1,
                "router",
                {
                    "event": "route_fallback",
                    "from_route": "p-md",
                    "to_route": "p-rld-md",
                    "reason": "md1 unavailable: connection refused",
                },
            )
        )
    if variant == "pd-cross" and i == 1:
        ev.append(
            (
                2,
                "p1",
                {
                    "event": "kv_congestion_refused",
                    "path": "wan",
                    "requested": "bbr",
                    "used": "cubic",
                    "reason": "module not loaded",
                },
            )
        )
    if variant == "pdd":
        close = 797 if req.request_id == "r0005" else RLD_SESSION_MS
        ev += [(3, "rld1", {"event": "decode_open"}), (3 + close, "rld1", {"event": "decode_close"})]
    return ev, end


ROLES_OF = {"colocated": ("rld",), "pd-intra": ("p", "rld"), "pd-cross": ("p", "md"), "pdd": ("p", "rld", "md")}


def picks(variant: str, i: int, pools: dict | None = None) -> dict[str, str]:
    """role -> the worker request i of the variant used (see the module docstring)."""
    n = {"p": 1, "md": 1, **(pools or {})}
    md = "md1" if variant == "pdd" else f"md{1 + i % n['md']}"
    return {r: {"p": f"p{1 + i % n['p']}", "rld": "rld1", "md": md}[r] for r in ROLES_OF[variant]}


def _kv_address(worker: str) -> str:
    return f"{worker_ip(worker)}:{KV_PORTS[role_of(worker)]}"


def _events(
    variant: str, rec: ClientRecord, req, kv_bpt: int, i: int = 0, tcp: bool = False, pools: dict | None = None
) -> list[tuple[str, dict]]:
    rid, t = rec.router_id, rec.t_send_ns
    w = picks(variant, i, pools)
    p, md = w.get("p", "p1"), w.get("md", "md1")
    route = {"event": "route", "route": ROUTE[variant], "md_cached_tokens": rec.done.md_cached_tokens, "workers": w}
    done = {
        "event": "prefill_done",
        "cached_tokens": req.cached_tokens,
        "computed_tokens": req.prompt_len - req.cached_tokens,
    }
    ev = [("router", route)] + ([(p, {"event": "prefill_arrival"}), (p, done)] if "p" in w else [])
    fast_bytes = req.prompt_len * kv_bpt
    if variant in ("pd-intra", "pdd"):
        ev += [
            (p, {"event": "kv_send_start", "path": "fast", "target": _kv_address("rld1")}),
            (
                p,
                {
                    "event": "kv_send_end",
                    "path": "fast",
                    "wire_bytes": fast_bytes,
                    **({"kv_bytes": fast_bytes} if pools else {}),
                },
            ),
        ]
    extra = []
    if variant in ("pd-cross", "pdd"):
        n = req.prompt_len - (req.cached_tokens if variant == "pdd" else 0)
        end = {"wire_bytes": n * kv_bpt, **({"kv_bytes": n * kv_bpt} if pools else {})}
        if tcp:
            extra, end = _tcp_events(variant, req, i, n * kv_bpt)
        ev += [
            (
                p,
                {
                    "event": "kv_send_start",
                    "path": "wan",
                    "target": _kv_address(md),
                    **({"congestion": "bbr"} if tcp else {}),
                },
            ),
            (p, {"event": "kv_send_end", "path": "wan", **end}),
        ]
    if pools:
        extra += _pool_events(variant, req, w, kv_bpt)
    decoder = md if variant in ("pd-cross", "pdd") else "rld1"
    ev += [
        (decoder, {"event": "decode_done", "steps": 4, "mean_batch": 2.0}),  # a step-weighted mean of 1.5
        (decoder, {"event": "decode_done", "steps": 12, "mean_batch": 1.333333}),
    ]
    if variant == "pdd":
        ev += [
            ("rld1", {"event": "handoff_start", "final": True}),
            (md, {"event": "handoff_recv_end", "extend_ns": 2 * MS}),
            (
                "rld1",
                {
                    "event": "handoff_end",
                    "final": True,
                    "mode": "oneshot",
                    "tokens": 3,
                    "payload_bytes": 40,
                    "duration_ns": 70 * MS,
                },
            ),
        ]
    out = [
        (w, {"t_ns": t + int(e.pop("t_ns_ms", k) * MS), "worker": w, "role": role_of(w), "request_id": rid, **e})
        for k, (w, e) in enumerate(ev)
    ]
    return out + [
        (w, {"t_ns": t + int(at * MS), "worker": w, "role": role_of(w), "request_id": rid, **e}) for at, w, e in extra
    ]


P_QUEUE_MS = {"p1": 0.2, "p2": 0.6}  # pools: prefill_arrival (at 1 ms) -> prefill_start; prefill_done at 2 ms
DECODE_ARRIVAL_MS = 2.5  # pools: each decode session's decode_arrival, from send
DECODE_QUEUE_MS = {"rld1": 0.3, "md1": 0.5, "md2": 1.5}  # pools: decode_arrival -> decode_open
DECODE_SESSION_MS = 100  # pools: decode_arrival -> decode_close (requests are 500 ms apart: one open at a time)


def _pool_events(variant: str, req, w: dict[str, str], kv_bpt: int) -> list[tuple[float, str, dict]]:
    """What the roles of a pools run log beside the rest: P's prefill_start, each decode session's arrival, open
    (with the router's session_open naming it) and close, and each KV transfer's receipt."""
    ev = []
    if "p" in w:
        ev.append((1 + P_QUEUE_MS[w["p"]], w["p"], {"event": "prefill_start", "cached_tokens": req.cached_tokens}))
    for role in ("rld", "md"):
        if role not in w:
            continue
        d, opened = w[role], DECODE_ARRIVAL_MS + DECODE_QUEUE_MS[w[role]]
        local = variant == "colocated"
        cached = req.cached_tokens if local or (role == "md" and variant == "pdd") else 0
        kv = (req.prompt_len - cached) if role == "md" else req.prompt_len
        arrival = {"event": "decode_arrival", "prompt_tokens": req.prompt_len, "max_tokens": req.max_tokens}
        ev += [
            (DECODE_ARRIVAL_MS, d, arrival),
            (opened, d, {"event": "decode_open", "cached_tokens": cached, "source": "local" if local else "peer"}),
            (opened + 0.1, "router", {"event": "session_open", "worker": d, "cached_tokens": cached}),
            (DECODE_ARRIVAL_MS + DECODE_SESSION_MS, d, {"event": "decode_close"}),
        ]
        if not local:
            recv = {"event": "kv_recv_end", "kind": "prompt", "kv_bytes": kv * kv_bpt, "wire_bytes": kv * kv_bpt}
            ev.append((opened + 1, d, recv))
    return ev


def make_run(
    root: Path, variants=("colocated", "pd-intra", "pd-cross", "pdd"), tcp: bool = False, pools: dict | None = None
) -> Path:
    assert not (tcp and pools), "a pools run is of the older data plane's figures"
    over = [f"pools.{role}.workers={n}" for role, n in (pools or {}).items()]
    s = specmod.load_spec("pdd-smoke", [f"variants=[{', '.join(variants)}]", *over])
    reqs = wl.build(s)
    run = root / "run"
    run.mkdir()
    wl.write(reqs, run / "workload.jsonl")
    kv_bpt = 512
    timing = {"colocated": (40, 5), "pd-intra": (20, 5), "pd-cross": (90, 5), "pdd": (20, 5)}
    meta = RunMetadata(
        experiment="pdd-smoke",
        complete=True,
        provenance=PROVENANCE,
        spec=specmod.to_dict(s),
        runtime="process",
        topology=topology_record(),
    )
    for j, v in enumerate(variants):
        vdir = run / "variants" / v
        (vdir / "events").mkdir(parents=True)
        lines, evs = [], {}
        deploy.write_deployment(s, vdir / "deployment.yaml", vdir / "events", v, pools=specmod.variant_pools(s, v))
        for i, r in enumerate(reqs):
            w = picks(v, i, pools)
            seq = {
                "colocated": ["rld1"] * r.max_tokens,
                "pd-intra": [w.get("p")] + ["rld1"] * r.max_tokens,
                "pd-cross": [w.get("p")] + [w.get("md")] * r.max_tokens,
                "pdd": [w.get("p")] + ["rld1"] * 2 + [w.get("md")] * r.max_tokens,
            }[v]
            rec = _client(v, r, i, *timing[v], seq)
            lines.append(clientlog.line(rec))
            for worker, e in _events(v, rec, r, kv_bpt, i, tcp, pools):
                evs.setdefault(worker, []).append(json.dumps(e))
        (vdir / "client.jsonl").write_text("".join(lines))
        for w, ls in evs.items():
            (vdir / "events" / f"{w}.jsonl").write_text("\n".join(ls) + "\n")
        window = {"status": "ok", "wall_start": 1000.0 + 10 * j, "wall_end": 1009.0 + 10 * j}
        if tcp or pools:
            window.update(WINDOW_NS, **(TCP_META.get(v, {}) if tcp else {}))
        meta.variants[v] = VariantRecord.model_validate(window)
    metadata.write(run, meta)
    if tcp:
        from fake_pcap import write_wan_pcaps

        write_wan_pcaps(run / "pcap", t0_s=1000.0 + 10 * variants.index("pdd") if "pdd" in variants else 1000.0)
    else:
        _pcap(run / "pcap" / "wan-a.pcap")
        _pcap(run / "pcap" / "wan-b.pcap")
    return run


WINDOW_NS = {"t_start_ns": T0 - 1000 * MS, "t_ready_ns": T0, "t_end_ns": T0 + 5000 * MS}
TCP_META = {
    "pd-cross": {
        "link_changes": [
            {
                "t_ns": T0 + 1000 * MS,
                "offset_s": 2.0,
                "direction": "a_to_b",
                "params": {"loss_pct": 5},
                "cause": "schedule",
            }
        ]
    },
    "pdd": {
        "cross_traffic": [
            {
                "name": "bulk",
                "kind": "udp",
                "direction": "a_to_b",
                "start_ns": T0,
                "end_ns": T0 + 2000 * MS,
                "port": 5201,
                "iperf_json": "variants/pdd/cross/bulk.json",
                "streams": 1,
                "congestion": None,
                "rate_mbit": 50.0,
            }
        ]
    },
}


def _pcap(path: Path) -> None:
    """Two frames a->b (cluster A source) and one b->a, 1500 and 66 bytes on the wire."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 128, 1))
    for t, src, size in (
        (1000.1, bytes([10, 1, 0, 21]), 1500),
        (1000.2, bytes([10, 1, 0, 21]), 1500),
        (1000.3, bytes([10, 2, 0, 61]), 66),
    ):
        frame = b"\x00" * 12 + b"\x08\x00" + b"\x45" + b"\x00" * 11 + src + bytes([10, 2, 0, 61])
        out += struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(frame), size) + frame
    path.write_bytes(bytes(out))
