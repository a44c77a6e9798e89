"""`make clean` stops a dockerd the testbed started, and puts back what that dockerd changed on the host
(FORWARD policy, ip_forward, br_netfilter, docker0), checked with ps, iptables, /proc and /sys directly.
The engine is started again afterwards for the tests that follow."""

import subprocess
from pathlib import Path

import pytest

from docker_rt import engine
from topology.cleanup import live_runs

PDDLAB = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "pddlab"


def _policy() -> str:
    return subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout.splitlines()[0]


def _clean() -> str:
    return subprocess.run([str(PDDLAB), "clean"], capture_output=True, text=True, check=True).stdout


def test_make_clean_stops_our_dockerd_and_restores_the_host():
    if engine.engine_info() is not None and engine._our_dockerd_pid() is None:
        pytest.skip("a Docker engine the testbed did not start answers: it is never stopped")
    if live_runs():
        pytest.skip("a testbed run is live on this machine: its containers need the engine")
    _clean()  # a dockerd started before it recorded the host (older testbed) is stopped here
    # A stock host: forwarding off (dockerd then turns it on and sets FORWARD to DROP), FORWARD ACCEPT.
    subprocess.run(["iptables", "-P", "FORWARD", "ACCEPT"], check=True)
    engine.IP_FORWARD.write_text("0\n")
    before = engine.host_state()
    try:
        engine.ensure_running()
        pid = engine._our_dockerd_pid()
        assert pid, "ensure_running did not start a dockerd of its own"
        assert _policy() == "-P FORWARD DROP"  # what dockerd does, and what clean must undo
        out = _clean()
        assert f"dockerd (pid {pid}) stopped" in out, out
        assert subprocess.run(["ps", "-p", str(pid)], capture_output=True).returncode != 0, "dockerd still runs"
        after = engine.host_state()
        assert after["forward_policy"] == before["forward_policy"] == "ACCEPT", out
        assert after["ip_forward"] == before["ip_forward"] == "0", out
        assert after["docker0"] == before["docker0"], out
        if not before["br_netfilter"]:
            assert not after["br_netfilter"] or "br_netfilter unloaded: failed" in out, out
        assert not engine.HOST_STATE_FILE.exists()
    finally:
        engine.ensure_running()  # the tests after this one need the engine
