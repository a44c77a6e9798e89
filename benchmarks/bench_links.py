"""Configured vs measured, for every shipped WAN profile on one shaping backend.

    python benchmarks/bench_links.py [--backend auto|tc|userspace] [--probes N] [--tcp-seconds S]

Prints one table row per profile and direction: delay mean, jitter (delay
standard deviation), loss, reordered probes and TCP goodput on a lossless copy
of the profile, each as expected (netem's model) / measured. `make bench` runs
it on this kernel's backend and, inside the stock-kernel VM, on `tc`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
from pathlib import Path

from experiments.run.calibration import CalibrationConfig, calibrate
from experiments.analysis.linkstats import ProbePlan
from topology.net import Testbed, TopologyConfig
from topology.profiles import available_profiles, load_profile


def _row(profile: str, backend: str, r) -> str:
    c = {chk.name: chk for chk in r.checks}
    e, m = r.expected, r.measured
    goodput = c.get("tcp_goodput_mbit")
    gp = f"{goodput.expected:g} / {goodput.measured:.1f}" if goodput else "-"
    verdict = "ok" if r.ok else "FAIL: " + ",".join(k for k, v in c.items() if not v.ok)
    return (
        f"| {profile} | {backend} | {r.direction} | {e.delay_mean_ms:.2f} / {m.delay_mean_ms:.2f} "
        f"| {e.delay_std_ms:.2f} / {m.delay_std_ms:.2f} | {e.loss_pct:.3g} / {m.loss_pct:.3g} "
        f"| {m.reordered} | {gp} | {verdict} |"
    )


def main() -> int:
    """Run the calibration on every WAN profile and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--probes", type=int, default=2000)
    ap.add_argument("--tcp-seconds", type=float, default=6.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cfg = CalibrationConfig(
        probes=ProbePlan(count=args.probes, interval_ms=10.0), tcp_seconds=args.tcp_seconds, udp=False
    )
    print(
        "| profile | backend | direction | delay ms exp/meas | jitter (std) ms exp/meas "
        "| loss % exp/meas | reordered | TCP goodput Mbit/s rate/meas | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failures = 0
    for name in [n for n in available_profiles() if n.startswith("wan-")]:
        profile = dataclasses.replace(load_profile(name), schedule=())
        with (
            tempfile.TemporaryDirectory() as tmp,
            Testbed(TopologyConfig(wan_profile=profile, backend=args.backend)) as tb,
        ):
            results = calibrate(tb, cfg, Path(tmp))
            for r in results:
                print(_row(name, tb.backend_choice.name, r), flush=True)
                failures += not r.ok
    print(f"\n{failures} direction(s) outside tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
