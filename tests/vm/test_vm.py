"""VM tier: boot the stock Debian cloud kernel under qemu TCG and check the harness.

Boots once (module fixture) running tests/vm/guest_checks.py inside, which
writes what it saw to the share directory as JSON; the tests assert on that
JSON and on what `run_in_vm` returns. Needs root (virtiofsd), qemu and the
kernel package (fetched by apt on first use); skips where root or qemu is
missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vm.kernel import REPO_ROOT
from vm.run import QEMU, VIRTIOFSD, run_in_vm

pytestmark = [pytest.mark.vm, pytest.mark.slow]

GUEST_SCRIPT = Path(__file__).with_name("guest_checks.py")
_spec = importlib.util.spec_from_file_location("guest_checks", GUEST_SCRIPT)
guest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guest)

BOOT_TIMEOUT_S = 600  # the whole run takes ~15 s on 2 busy cores; leave room for slow CI
# netem delays each direction of lo (and each veth end) by NETEM_DELAY_MS, so a
# ping RTT is 2 * 10 = 20 ms plus TCG overhead: ~0.3-1 ms typically, single
# outliers up to ~10 ms on a loaded host, hence the median of 5 pings.
RTT_TOLERANCE_MS = 5.0
EXPECTED_RTT_MS = 2 * guest.NETEM_DELAY_MS

if os.geteuid() != 0:
    pytest.skip("needs root: virtiofsd serves the host root to the VM", allow_module_level=True)
if not shutil.which(QEMU) or not os.path.exists(VIRTIOFSD):
    pytest.skip(f"needs {QEMU} and {VIRTIOFSD} (apt-get install qemu-system-x86)", allow_module_level=True)


@pytest.fixture(scope="module")
def booted(tmp_path_factory):
    share = tmp_path_factory.mktemp("vmshare")
    result = run_in_vm(
        ["/usr/bin/python3", str(GUEST_SCRIPT), str(share)], REPO_ROOT, share, timeout_s=BOOT_TIMEOUT_S, memory_mb=3072
    )
    sys.stderr.write(result.output)
    checks_file = share / "guest_checks.json"
    assert checks_file.exists(), f"no results from the guest:\n{result.output}\n{result.console}"
    return result, share, json.loads(checks_file.read_text())


def test_guest_runs_the_stock_cloud_kernel(booted):
    _, _, checks = booted
    assert checks["uname_r"] != platform.release()
    assert checks["uname_r"].endswith("cloud-amd64")


def test_exit_status_comes_back(booted):
    result, _, _ = booted
    assert result.rc == guest.EXIT_STATUS


def test_netem_on_loopback(booted):
    _, _, checks = booted
    assert checks["netem_add_rc"] == 0, checks["netem_add_err"]
    rtt_ms = statistics.median(checks["lo_netem_rtt_ms"])
    assert rtt_ms == pytest.approx(EXPECTED_RTT_MS, abs=RTT_TOLERANCE_MS)


def test_netem_on_veth_between_named_netns(booted):
    _, _, checks = booted
    assert checks["netns_errors"] == []
    assert all(ns in checks["netns_listed"] for ns in guest.NETNS)
    rtt_ms = statistics.median(checks["veth_netem_rtt_ms"])
    assert rtt_ms == pytest.approx(EXPECTED_RTT_MS, abs=RTT_TOLERANCE_MS)


def test_netns_exist_only_inside_the_vm(booted):
    host_netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in host_netns for ns in guest.NETNS)


def test_share_dir_written_inside_is_visible_on_host(booted):
    _, share, _ = booted
    assert (share / "hello.txt").read_text() == "written inside the VM\n"


def test_host_root_is_read_only_for_the_guest(booted):
    _, share, checks = booted
    # writes outside the share land in the guest's tmpfs overlay and are lost...
    assert checks["outside_write_ok_in_guest"]
    assert not (share.parent / guest.OUTSIDE_MARKER).exists()
    # ...and a fresh mount of the host root is read-only on the host side
    assert checks["direct_write_rc"] != 0


def test_debian_mininet_imports_inside(booted):
    _, _, checks = booted
    assert checks["mininet_import_rc"] == 0, checks["mininet_import_err"]


def test_output_is_streamed_completely(booted):
    # the guest's last act is printing the JSON it saved; a truncated stream would lose its tail
    result, _, checks = booted
    printed = result.output[result.output.index("{\n") :]
    assert json.loads(printed) == checks


def test_boot_time_is_measured(booted):
    result, _, _ = booted
    assert 0 < result.boot_s < result.wall_s


def test_a_sigkilled_vm_run_leaves_nothing_after_make_clean(tmp_path):
    from topology.cleanup import STATE_DIR

    vm_run = subprocess.Popen(
        [sys.executable, "-m", "vm.run", "--timeout", "300", "--share", str(tmp_path), "--", "sleep", "300"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state_file = STATE_DIR / f"vm-{vm_run.pid}.json"
    try:
        for _ in range(600):  # qemu is recorded right after it starts (virtiofsd first)
            if state_file.exists() and len(json.loads(state_file.read_text())["procs"]) == 3:
                break
            time.sleep(0.1)
        state = json.loads(state_file.read_text())
    finally:
        vm_run.kill()  # no finally block of vm.run runs: qemu and both virtiofsd are orphaned
        vm_run.wait()
    pids = [e["pid"] for e in state["procs"]]
    assert [e["what"].split()[0] for e in state["procs"]] == ["virtiofsd", "virtiofsd", "qemu"]
    assert _running(pids) == pids and Path(state["workdir"]).is_dir()  # what a SIGKILL leaves
    clean = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "clean"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert clean.returncode == 0, clean.stderr
    # Checked with ps itself, not with the testbed's bookkeeping: no process of that run, by PID or by its
    # work directory on a command line, and the directory is gone.
    assert _running(pids) == [], clean.stdout
    args = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    assert state["workdir"] not in args and not Path(state["workdir"]).exists() and not state_file.exists()


def _running(pids: list[int]) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    return [int(p) for p, stat in (line.split() for line in out.stdout.splitlines()) if not stat.startswith("Z")]
