"""The runner itself SIGKILLed mid-variant, under load: no teardown runs at all (the roles, the router, the load
generator, the emulator and tcpdump are orphaned, the bridges and rules stay); `pddlab clean` then removes all of
it by the run's own ids and PIDs, observed with ps, ip and iptables (tests/observe.py) and by the tier's
leftover check (tests/conftest.py: containers too)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import observe
from test_faults import WORKLOAD

pytestmark = [pytest.mark.emulation, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KILL_AFTER_S = 4.0  # into the variant's window: the load generator has requests in flight


def _serving(results: Path) -> bool:
    """The run's variant is under load: its load generator has recorded a request."""
    return any(log.stat().st_size for log in results.glob("*/variants/*/client.jsonl"))


def test_the_runner_sigkilled_mid_variant_then_pddlab_clean_leaves_nothing(tmp_path):
    argv = [sys.executable, "-m", "experiments.cli", "run", "pdd-smoke", "--results", str(tmp_path)]
    argv += [f"--set={s}" for s in (*WORKLOAD, "variants=[pdd]")]
    log = open(tmp_path / "runner.log", "w")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _serving(tmp_path):
            assert proc.poll() is None, f"the run ended before its variant ran: {(tmp_path / 'runner.log').read_text()}"
            assert time.monotonic() < deadline, "the variant never started"
            time.sleep(0.5)
        time.sleep(KILL_AFTER_S)
        tree = observe.process_tree(proc.pid)  # roles, router, load generator, emulator, tcpdump, host shells
        assert len(tree) >= 5, tree
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    time.sleep(1)
    before = observe.left_behind(tree)
    assert before["processes"] and before["links"], before  # the kill left the run behind: clean has work
    out = subprocess.run([sys.executable, "-m", "experiments.cli", "clean"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert observe.left_behind(tree) == observe.NOTHING_LEFT, out.stdout
