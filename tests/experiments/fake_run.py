"""A synthetic run directory (what the runner writes), to test the analysis without a topology.

make_run(root) is a run of the data plane before TCP_INFO (no kv_tcp_info, no congestion or retransmission
fields, no link changes); make_run(root, tcp=True) adds what the newer data plane and runner record
(see TCP_* below for the figures the tests expect) and WAN captures with real TCP/UDP headers."""

import json
import struct
from pathlib import Path

from experiments import rundir, spec as specmod, workload as wl

T0 = 10_000_000_000  # monotonic ns of the first send
MS = 1_000_000


def _client(variant: str, req, i: int, prefill_ms: float, decode_ms: float, worker_seq: list[str]) -> dict:
    t_send = T0 + i * 500 * MS
    toks, t = [], t_send + int(prefill_ms * MS)
    for k in range(req.max_tokens):
        toks.append([k, (7 * k + i) % 256, worker_seq[k], t, t])
        t += int((decode_ms if k else 0) * MS) if k else int(decode_ms * MS)
    return {
        "request_id": req.request_id,
        "router_id": f"{variant}.{req.request_id}",
        "variant": variant,
        "session": req.session,
        "turn": req.turn,
        "kind": req.kind,
        "max_tokens": req.max_tokens,
        "prompt_tokens": req.prompt_len,
        "prompt_sha1": "x",
        "t0_ns": T0,
        "t_send_ns": t_send,
        "t_done_ns": t,
        "tokens": toks,
        "error": None,
        "done": {
            "route": ROUTE[variant],
            "finish_reason": "length",
            "duplicates": 0,
            "md_cached_tokens": req.cached_tokens if variant == "pdd" else 0,
            "notes": [],
        },
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


def _events(variant: str, rec: dict, req, kv_bpt: int, i: int = 0, tcp: bool = False) -> list[tuple[str, dict]]:
    rid, t = rec["router_id"], rec["t_send_ns"]
    ev = [
        ("router", {"event": "route", "route": ROUTE[variant], "md_cached_tokens": rec["done"]["md_cached_tokens"]}),
        ("p1", {"event": "prefill_arrival"}),
        ("p1", {"event": "prefill_done"}),
    ]
    if variant in ("pd-intra", "pdd"):
        ev += [
            ("p1", {"event": "kv_send_start", "path": "fast"}),
            ("p1", {"event": "kv_send_end", "path": "fast", "wire_bytes": req.prompt_len * kv_bpt}),
        ]
    extra = []
    if variant in ("pd-cross", "pdd"):
        n = req.prompt_len - (req.cached_tokens if variant == "pdd" else 0)
        end = {"wire_bytes": n * kv_bpt}
        if tcp:
            extra, end = _tcp_events(variant, req, i, n * kv_bpt)
        ev += [
            ("p1", {"event": "kv_send_start", "path": "wan", **({"congestion": "bbr"} if tcp else {})}),
            ("p1", {"event": "kv_send_end", "path": "wan", **end}),
        ]
    decoder = "md1" if variant in ("pd-cross", "pdd") else "rld1"
    ev += [
        (decoder, {"event": "decode_done", "steps": 4, "mean_batch": 2.0}),  # a step-weighted mean of 1.5
        (decoder, {"event": "decode_done", "steps": 12, "mean_batch": 1.333333}),
    ]
    if variant == "pdd":
        ev += [
            ("rld1", {"event": "handoff_start", "final": True}),
            ("md1", {"event": "handoff_recv_end", "extend_ns": 2 * MS}),
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
        (w, {"t_ns": t + int(e.pop("t_ns_ms", k) * MS), "worker": w, "role": w.rstrip("1"), "request_id": rid, **e})
        for k, (w, e) in enumerate(ev)
    ]
    return out + [
        (w, {"t_ns": t + int(at * MS), "worker": w, "role": w.rstrip("1"), "request_id": rid, **e})
        for at, w, e in extra
    ]


def make_run(root: Path, variants=("colocated", "pd-intra", "pd-cross", "pdd"), tcp: bool = False) -> Path:
    s = specmod.load_spec("pdd-smoke", [f"variants=[{', '.join(variants)}]"])
    reqs = wl.build(s)
    run = root / "run"
    run.mkdir()
    wl.write(reqs, run / "workload.jsonl")
    kv_bpt = 512
    timing = {"colocated": (40, 5), "pd-intra": (20, 5), "pd-cross": (90, 5), "pdd": (20, 5)}
    meta = {
        "experiment": "pdd-smoke",
        "spec": specmod.to_dict(s),
        "complete": True,
        "variants": {},
        "topology": {"backend": "userspace", "wan_profile": {"a_to_b": {"rate_mbit": 200.0}}},
    }
    for j, v in enumerate(variants):
        vdir = run / "variants" / v
        (vdir / "events").mkdir(parents=True)
        lines, evs = [], {}
        for i, r in enumerate(reqs):
            seq = {"pdd": ["p1"] + ["rld1"] * 2 + ["md1"] * r.max_tokens}.get(v, ["p1"] + ["x1"] * r.max_tokens)
            if v == "colocated":
                seq = ["rld1"] * r.max_tokens
            elif v == "pd-intra":
                seq = ["p1"] + ["rld1"] * r.max_tokens
            elif v == "pd-cross":
                seq = ["p1"] + ["md1"] * r.max_tokens
            rec = _client(v, r, i, *timing[v], seq)
            lines.append(json.dumps(rec))
            for w, e in _events(v, rec, r, kv_bpt, i, tcp):
                evs.setdefault(w, []).append(json.dumps(e))
        (vdir / "client.jsonl").write_text("\n".join(lines) + "\n")
        for w, ls in evs.items():
            (vdir / "events" / f"{w}.jsonl").write_text("\n".join(ls) + "\n")
        meta["variants"][v] = {"status": "ok", "wall_start": 1000.0 + 10 * j, "wall_end": 1009.0 + 10 * j}
        if tcp:
            meta["variants"][v].update(WINDOW_NS, **TCP_META.get(v, {}))
    rundir.write_json(run / "metadata.json", meta)
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
