"""End-to-end: a role process that stops records its CPU time as its log's last event (role_cpu); one killed by
SIGKILL records nothing (the analysis shows it missing, experiments.analysis.rolecpu)."""

import pytest

from pdd_harness import Deployment
from workers.roles.client import generate


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A deployment that served one pd-intra request (P and RLD computed), then had its MD SIGKILLed and the rest
    stopped by SIGTERM: (deployment, exit codes)."""
    d = Deployment(tmp_path_factory.mktemp("rolecpu"))
    try:
        d.start()
        gen = generate(d.channel, [(5 * i + 1) % 250 for i in range(100)], 8, mode="pd-intra", request_id="cpu-1")
        assert len(gen.tokens) == 8
        d.kill("md")
    finally:
        codes = d.stop()
    return d, codes


@pytest.mark.parametrize("worker", ["router", "p1", "rld1"])
def test_a_stopped_role_ends_its_log_with_its_cpu_time(stopped, worker):
    d, codes = stopped
    assert codes[worker] == 0, codes
    last = d.events(worker)[-1]
    assert last.event == "role_cpu", f"{worker}'s last event is {last.event}"
    f = last.fields
    assert f["cpu_s"] > 0 and f["startup_cpu_s"] > 0 and f["serving_cpu_s"] >= 0, f
    assert f["cpu_s"] == pytest.approx(f["user_s"] + f["system_s"], abs=0.002), f
    assert f["cpu_s"] == pytest.approx(f["startup_cpu_s"] + f["serving_cpu_s"], abs=0.002), f
    assert f["wall_s"] > f["serving_wall_s"] > 0, f  # the process's age includes its start-up


def test_the_roles_that_computed_spent_cpu_while_serving(stopped):
    d, _ = stopped
    for worker in ("p1", "rld1"):  # P prefilled 100 tokens, the RLD decoded 7
        assert d.events(worker)[-1].fields["serving_cpu_s"] > 0, worker


def test_a_killed_role_records_nothing(stopped):
    d, codes = stopped
    assert codes["md1"] == -9, codes
    assert all(e.event != "role_cpu" for e in d.events("md1"))
