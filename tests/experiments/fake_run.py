"""A synthetic run directory (what the runner writes), to test the analysis without a topology."""
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
    return {"request_id": req.request_id, "router_id": f"{variant}.{req.request_id}", "variant": variant,
            "session": req.session, "turn": req.turn, "kind": req.kind, "max_tokens": req.max_tokens,
            "prompt_tokens": req.prompt_len, "prompt_sha1": "x", "t0_ns": T0, "t_send_ns": t_send,
            "t_done_ns": t, "tokens": toks, "error": None,
            "done": {"route": ROUTE[variant], "finish_reason": "length", "duplicates": 0,
                     "md_cached_tokens": req.cached_tokens if variant == "pdd" else 0, "notes": []}}


ROUTE = {"colocated": "colocated", "pd-intra": "p-rld", "pd-cross": "p-md", "pdd": "p-rld-md"}


def _events(variant: str, rec: dict, req, kv_bpt: int) -> list[tuple[str, dict]]:
    rid, t = rec["router_id"], rec["t_send_ns"]
    ev = [("router", {"event": "route", "route": ROUTE[variant], "md_cached_tokens": rec["done"]["md_cached_tokens"]}),
          ("p1", {"event": "prefill_arrival"}), ("p1", {"event": "prefill_done"})]
    if variant in ("pd-intra", "pdd"):
        ev += [("p1", {"event": "kv_send_start", "path": "fast"}),
               ("p1", {"event": "kv_send_end", "path": "fast", "wire_bytes": req.prompt_len * kv_bpt})]
    if variant in ("pd-cross", "pdd"):
        n = req.prompt_len - (req.cached_tokens if variant == "pdd" else 0)
        ev += [("p1", {"event": "kv_send_start", "path": "wan"}),
               ("p1", {"event": "kv_send_end", "path": "wan", "wire_bytes": n * kv_bpt})]
    decoder = "md1" if variant in ("pd-cross", "pdd") else "rld1"
    ev += [(decoder, {"event": "decode_done", "steps": 4, "mean_batch": 2.0}),      # a step-weighted mean of 1.5
           (decoder, {"event": "decode_done", "steps": 12, "mean_batch": 1.333333})]
    if variant == "pdd":
        ev += [("rld1", {"event": "handoff_start", "final": True}),
               ("md1", {"event": "handoff_recv_end", "extend_ns": 2 * MS}),
               ("rld1", {"event": "handoff_end", "final": True, "mode": "oneshot", "tokens": 3,
                         "payload_bytes": 40, "duration_ns": 70 * MS})]
    return [(w, {"t_ns": t + k * MS, "worker": w, "role": w.rstrip("1"), "request_id": rid, **e})
            for k, (w, e) in enumerate(ev)]


def make_run(root: Path, variants=("colocated", "pd-intra", "pd-cross", "pdd")) -> Path:
    s = specmod.load_spec("pdd-smoke", [f"variants=[{', '.join(variants)}]"])
    reqs = wl.build(s)
    run = root / "run"
    run.mkdir()
    wl.write(reqs, run / "workload.jsonl")
    kv_bpt = 512
    timing = {"colocated": (40, 5), "pd-intra": (20, 5), "pd-cross": (90, 5), "pdd": (20, 5)}
    meta = {"experiment": "pdd-smoke", "spec": specmod.to_dict(s), "complete": True, "variants": {},
            "topology": {"backend": "userspace", "wan_profile": {"a_to_b": {"rate_mbit": 200.0}}}}
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
            for w, e in _events(v, rec, r, kv_bpt):
                evs.setdefault(w, []).append(json.dumps(e))
        (vdir / "client.jsonl").write_text("\n".join(lines) + "\n")
        for w, ls in evs.items():
            (vdir / "events" / f"{w}.jsonl").write_text("\n".join(ls) + "\n")
        meta["variants"][v] = {"status": "ok", "wall_start": 1000.0 + 10 * j, "wall_end": 1009.0 + 10 * j}
    rundir.write_json(run / "metadata.json", meta)
    _pcap(run / "pcap" / "wan-a.pcap")
    _pcap(run / "pcap" / "wan-b.pcap")
    return run


def _pcap(path: Path) -> None:
    """Two frames a->b (cluster A source) and one b->a, 1500 and 66 bytes on the wire."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = bytearray(struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 128, 1))
    for t, src, size in ((1000.1, bytes([10, 1, 0, 21]), 1500), (1000.2, bytes([10, 1, 0, 21]), 1500),
                         (1000.3, bytes([10, 2, 0, 61]), 66)):
        frame = b"\x00" * 12 + b"\x08\x00" + b"\x45" + b"\x00" * 11 + src + bytes([10, 2, 0, 61])
        out += struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(frame), size) + frame
    path.write_bytes(bytes(out))
