"""Fidelity: every shipped WAN profile, measured on the live topology, against netem's semantics.

The expectation for each profile is netem's own per-packet model run over the
same probe stream (`experiments.analysis.linkstats.expected_stats`), so rate-induced
delay compression, bursty loss and correlation are accounted for exactly. The
tolerances are the named constants in `experiments.analysis.linkstats`:

- one-way delay mean within max(2%, 0.3 ms): with 2000 probes and 5 ms jitter
  the sample mean's standard error is 5/sqrt(2000) = 0.11 ms, so the 0.6 ms
  band of the 30 ms profile is over 5 standard errors wide;
- delay standard deviation within 15% (its standard error is ~1/sqrt(2n) = 1.6%);
- loss inside the 99% interval (binomial, or the model's own spread for bursty loss);
- zero reordered probes when a rate is set and reorder is off;
- a direction with a failed probe check above is probed again once and the fresh run judged
  (`linkstats.PROBE_TRIES`: host noise and a 99% interval's own tail, across ~20 checks);
- TCP goodput on a lossless copy of the profile within 90-101% of the rate,
  wherever the unshaped path can carry 1.15 x the rate (under the VM's emulated
  CPU it cannot at 100+ Mbit/s: such skips are printed with the capacity); a
  goodput under the band is measured again and the best of up to three tests
  judged, since a busy host only takes goodput away.

The expectation adds the path's own contribution, measured first with the WAN
unshaped (1000 probes): its mean delay (LAN hops, bridges, forwarding) and,
as independent noise, its spread (tiny here, milliseconds under qemu TCG).

Run with `--backend tc` inside the stock-kernel VM (`make vm-test`) and with
the default backend here, on the same profiles and tolerances.
"""

import dataclasses
import os

import pytest

from experiments.run.calibration import CalibrationConfig, calibrate, markdown_table
from experiments.analysis.linkstats import ProbePlan
from topology.net import Testbed, TopologyConfig
from topology.profiles import load_profile

# `make test-emulation` measures the three profiles whose options cover the rest (regional: normal jitter, a
# fast rate; lossy: paretonormal, gemodel, duplicate/corrupt/reorder; congested: slow asymmetric rates) and
# leaves the two whose steady state repeats regional's options at other values (cross-country, flaky: normal
# jitter, random loss, 200 Mbit/s) to `make test-extended`, ~110 s of CI's 45 minutes. The VM tier
# (`make vm-test`, the tc backend) runs all five.
EXTENDED = pytest.mark.extended
WAN_PROFILES = [
    pytest.param("wan-cross-country", marks=EXTENDED),
    "wan-regional",
    "wan-lossy",
    "wan-congested",
    pytest.param("wan-flaky", marks=EXTENDED),
]
PLAN = ProbePlan(count=2000, interval_ms=10.0)
TCP_SECONDS = 6.0


# Under qemu TCG (make vm-test) TCP through the kernel's netem varies more from test to test than the band allows:
# wan-lossy's lossless copy at 100 Mbit/s gave 82, 31, 55 and 57, 26, 85 Mbit/s (2026-12-06), with 283-310 Mbit/s
# through the unshaped path. The goodput is printed there, not judged (docs/real-kernel.md).
TCG_GOODPUT = "qemu TCG: TCP through netem varies test to test past the band (docs/real-kernel.md)"


@pytest.mark.parametrize("name", WAN_PROFILES)
def test_profile_fidelity(name, backend, tmp_path):
    # The schedule is exercised in test_topology; here each profile's steady state is measured.
    profile = dataclasses.replace(load_profile(name), schedule=())
    unjudged = TCG_GOODPUT if os.environ.get("PDDLAB_IN_VM") and backend == "tc" else ""
    cfg = CalibrationConfig(probes=PLAN, tcp_seconds=TCP_SECONDS, udp=False, unjudged_goodput=unjudged)
    with Testbed(TopologyConfig(wan_profile=profile, backend=backend)) as tb:
        results = calibrate(tb, cfg, tmp_path)
        used = tb.backend_choice.name
    table = markdown_table(profile, used, results)
    print(table)
    failed = [f"{r.direction}:{c.name}" for r in results for c in r.checks if not c.ok]
    assert not failed, f"{name} on {used}: {failed}\n{table}"
    for r in results:
        names = {c.name for c in r.checks}
        assert {"delay_mean_ms", "loss_pct"} <= names
        # Goodput is judged wherever the unshaped path can carry the rate (see calibration.CAPACITY_HEADROOM).
        assert "tcp_goodput_mbit" in names or r.goodput_skipped, r.direction
