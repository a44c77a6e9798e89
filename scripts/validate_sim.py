"""Simulator against emulator (issue 30): fit the real-compute constants from emulated runs' events; compare summaries.

    .venv/bin/python scripts/validate_sim.py fit RUN_DIR...        # experiments/sim/realcompute.py's constants
    .venv/bin/python scripts/validate_sim.py compare DIRS [--spec pdd-vs-baselines] [--out /tmp/simval]

fit: every event but the warm-up's (request ids with ".w") of the runs' variants/*/events/*.jsonl, pooled: P's
prefill_step against the lone roofline of its chunks (least absolute deviation: fixed + factor x roofline), the
decode workers' mixed steps the same way, decode steps ((decode_done - first_token) / steps against the roofline
of mean_batch sessions at 700 tokens: median ratio), KV import (kv_imported - kv_recv_end: fixed + per token).
compare: DIRS holds lines "PROFILE RUN_DIR [RC]" (a run directory or any directory with its summary.json); each
profile is simulated once (`pddlab simulate SPEC --set profile=P`) and every variant's TTFT p50 (with both 95%
intervals), p90 and WAN KV bytes are printed side by side as a markdown table, with the error and whether it is
within issue 30's acceptance (+-15% on p50 and bytes, +-25% on p90).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _events(run: Path):
    for vdir in sorted((run / "variants").iterdir()):
        ev = {}
        for f in (vdir / "events").glob("*.jsonl"):
            ev[f.stem] = [e for e in map(json.loads, f.open()) if ".w" not in (e.get("request_id") or "")]
        yield vdir.name, ev


def _lad(points: list[tuple[float, float]]) -> tuple[float, float]:
    import numpy as np
    from scipy.optimize import minimize

    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    fixed, factor = minimize(lambda t: np.abs(y - (t[0] + t[1] * x)).sum(), [0.1, 2.0], method="Nelder-Mead").x
    return float(fixed), float(factor)


def fit(runs: list[Path]) -> None:
    from workers.modelled.catalogue import load_catalogue
    from workers.modelled.roofline import Part, Roofline

    cat = load_catalogue()
    model = cat.model("default")
    lone = Roofline(cat.accelerator("this-machine"), model)
    p_steps, mixed, decode, imports = [], [], [], []
    for run in runs:
        for _variant, ev in _events(run):
            for e in ev.get("p1", []):
                if e["event"] == "prefill_step" and e["chunks"] and not any(".w" in c[0] for c in e["chunks"]):
                    parts = [Part(n, start, 1 if last else 0) for _rid, start, n, last in e["chunks"]]
                    p_steps.append((lone.step(parts).seconds, e["duration_ns"] / 1e9))
            for w in ("rld1", "md1"):
                events = ev.get(w, [])
                first = {e["request_id"]: e["t_ns"] for e in events if e["event"] == "first_token"}
                recv = {e["request_id"]: e["t_ns"] for e in events if e["event"] == "kv_recv_end"}
                for e in events:
                    rid = e.get("request_id")
                    warm = any(".w" in r for r in e.get("requests") or ())
                    if e["event"] == "decode_step_mixed" and e["chunk_tokens"] > 1 and not warm:
                        parts = [Part(1, 650, 1)] * e["decode_tokens"] + [Part(e["chunk_tokens"], 600, 1)]
                        mixed.append((lone.step(parts).seconds, e["duration_ns"] / 1e9))
                    elif e["event"] == "decode_done" and rid in first and e["steps"] > 1:
                        per_step = (e["t_ns"] - first[rid]) / 1e9 / e["steps"]
                        decode.append(per_step / lone.decode_s([700] * max(1, round(e["mean_batch"]))))
                    elif e["event"] == "kv_imported" and rid in recv:
                        imports.append((e["kv_bytes"] / model.kv_bytes_per_token, (e["t_ns"] - recv[rid]) / 1e9))
    q = statistics.quantiles(decode, n=4)
    print(f"P_STEP_FIXED_S, P_STEP_FACTOR = {_lad(p_steps)}  (n={len(p_steps)})")
    print(f"MIXED_STEP_FIXED_S, MIXED_STEP_FACTOR = {_lad(mixed)}  (n={len(mixed)})")
    print(f"DECODE_FACTOR = {q[1]:.3f}  (quartiles {q[0]:.2f}, {q[2]:.2f}; n={len(decode)})")
    print(f"IMPORT_FIXED_S, IMPORT_PER_TOKEN_S = {_lad(imports)}  (n={len(imports)})")


def _err(emulated, simulated) -> str:
    return f"{(simulated - emulated) / emulated:+.0%}" if emulated and simulated is not None else "–"


def _num(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "–"


def _p50(v: dict) -> str:
    t = v.get("ttft_ms") or {}
    ci = (t.get("ci95") or {}).get("p50")
    return _num(t.get("p50")) + (f" [{ci[0]:,.0f}, {ci[1]:,.0f}]" if ci else "")


def compare(dirs: Path, spec: str, out: Path) -> None:
    sims: dict[str, dict] = {}
    print(
        "| profile | run | variant | TTFT p50 emulated [95%] | simulated [95%] | error | p90 emulated | simulated |"
        " error | WAN KV bytes emulated | simulated | error | sent (emulated) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for line in dirs.read_text().splitlines():
        if not line.strip():
            continue
        profile, run = line.split()[:2]
        summary = Path(run) / "summary.json"
        if not summary.exists():
            print(f"| {profile} | {Path(run).name} | (no summary.json: skipped) |", file=sys.stderr)
            continue
        if profile not in sims:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "experiments.cli",
                    "simulate",
                    spec,
                    "--set",
                    f"profile={profile}",
                    "--out",
                    str(out / profile),
                ],
                check=True,
                capture_output=True,
                cwd=ROOT,
            )
            sims[profile] = json.loads((out / profile / "summary.json").read_text())["variants"]
        for name, e in json.loads(summary.read_text())["variants"].items():
            s = sims[profile].get(name, {})
            te, ts = e.get("ttft_ms") or {}, s.get("ttft_ms") or {}
            we, ws = e.get("wan_kv_bytes_total"), s.get("wan_kv_bytes_total")
            print(
                f"| {profile} | {Path(run).name[:15]} | {name} | {_p50(e)} | {_p50(s)} "
                f"| {_err(te.get('p50'), ts.get('p50'))} "
                f"| {_num(te.get('p90'))} | {_num(ts.get('p90'))} | {_err(te.get('p90'), ts.get('p90'))} "
                f"| {_num(we)} | {_num(ws)} | {_err(we, ws) if we else '–'} | {e.get('issued')}/{e.get('requests')} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("runs", nargs="+", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("dirs", type=Path)
    c.add_argument("--spec", default="pdd-vs-baselines")
    c.add_argument("--out", type=Path, default=Path("/tmp/simval"))
    a = ap.parse_args()
    fit(a.runs) if a.cmd == "fit" else compare(a.dirs, a.spec, a.out)


if __name__ == "__main__":
    main()
