"""The live topology: addressing, reachability, captures, live profile changes, teardown in every case."""

import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
import time

import observe
import pytest

from experiments.run.calibration import run_probes
from experiments.analysis.linkstats import ProbePlan, probe_stats
from topology import naming
from topology.cleanup import NOTHING, STATE_DIR, leftovers
from topology.net import Testbed, TestbedError, TopologyConfig
from topology.profiles import ScheduleStep, load_profile


# Median one-way delay allowed off target in these coarse live checks (ms):
# probe process scheduling plus LAN hops stay well under a millisecond. The
# median, not the mean: these checks are about which profile is live, and a
# busy machine may delay a few probes (the fidelity tests judge the mean).
COARSE_DELAY_TOL_MS = 1.5


def _cfg(backend, profile="wan-cross-country", **kw):
    return TopologyConfig(wan_profile=load_profile(profile), backend=backend, **kw)


def _mean_delay(tb, tmp_path, count=100, interval_ms=5.0):
    res = run_probes(tb, ProbePlan(count=count, interval_ms=interval_ms), tmp_path)
    return probe_stats(res["a_to_b"]), probe_stats(res["b_to_a"])


def test_addresses_routes_and_reachability(backend):
    with Testbed(_cfg(backend, n_p=2, n_rld=1, n_md=2)) as tb:
        specs = naming.hosts(2, 1, 2)
        assert [s.name for s in specs] == ["client", "router", "p1", "p2", "rld1", "md1", "md2"]
        for spec in specs:
            addr = tb.run(spec.name, ["ip", "-o", "-4", "addr", "show", "dev", f"{spec.name}-eth0"])
            assert f"{spec.ip}/24" in addr
        for src, dst in (("client", "md2"), ("p2", "md1"), ("md1", "rld1"), ("p1", "router")):
            ip = next(s.ip for s in specs if s.name == dst)
            tb.run(src, ["ping", "-c", "1", "-W", "3", ip])
        wan_if = tb.run("gwa", ["ip", "-o", "-4", "addr", "show", "dev", "gwa-eth1"])
        assert f"{naming.WAN_A_IP}/{naming.WAN_PREFIXLEN}" in wan_if
        assert tb.metadata()["backend"] in ("tc", "userspace")


def test_pcap_on_both_ends_of_the_wan(backend, tmp_path):
    pcap_dir = tmp_path / "pcap"
    with Testbed(_cfg(backend, capture_dir=pcap_dir, snaplen_bytes=96)) as tb:
        _mean_delay(tb, tmp_path, count=50)
    for side in "ab":
        path = pcap_dir / f"wan-{side}.pcap"
        out = subprocess.run(
            [
                "tshark",
                "-r",
                str(path),
                "-Y",
                "udp.port == 9000",
                "-T",
                "fields",
                "-e",
                "frame.cap_len",
                "-e",
                "frame.len",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = [tuple(map(int, line.split())) for line in out.stdout.splitlines()]
        assert len(rows) >= 90, (side, len(rows))  # 50 probes each way, minus the profile's rare loss
        # Headers only: a 106-byte probe frame (64 B payload + 42 B of headers) is cut at the snaplen.
        assert all((cap, full) == (96, 106) for cap, full in rows), rows[:5]


def test_live_profile_swap_and_schedule(backend, tmp_path):
    with Testbed(_cfg(backend, profile="wan-cross-country")) as tb:
        before, _ = _mean_delay(tb, tmp_path / "1")
        assert abs(before.delay_p50_ms - 30) < 5 * 0.5 + COARSE_DELAY_TOL_MS  # jitter 5 ms over 100 probes
        tb.swap_profile(load_profile("wan-regional"))
        after, back = _mean_delay(tb, tmp_path / "2")
        assert abs(after.delay_p50_ms - 5) < COARSE_DELAY_TOL_MS
        assert abs(back.delay_p50_ms - 5) < COARSE_DELAY_TOL_MS
    profile = dataclasses.replace(
        load_profile("wan-regional"),
        schedule=(ScheduleStep(at_s=0, changes={"delay_ms": 40, "jitter_ms": 0}, direction="a_to_b", duration_s=3),),
    )
    with Testbed(TopologyConfig(wan_profile=profile, backend=backend)) as tb:
        during, other = _mean_delay(tb, tmp_path / "3", count=50)
        time.sleep(max(0.0, 3.5 - 50 * 0.005))
        after, _ = _mean_delay(tb, tmp_path / "4", count=50)
        changes = [c.cause for c in tb.link.changes]
    assert abs(during.delay_p50_ms - 40) < COARSE_DELAY_TOL_MS
    assert abs(other.delay_p50_ms - 5) < COARSE_DELAY_TOL_MS
    assert abs(after.delay_p50_ms - 5) < COARSE_DELAY_TOL_MS
    assert changes == ["schedule step 0", "schedule step 0 ends"]


def test_teardown_after_exception(backend):
    with pytest.raises(RuntimeError, match="boom"):
        with Testbed(_cfg(backend)):
            assert leftovers()["links"]  # bridges exist while up
            raise RuntimeError("boom")
    assert leftovers() == NOTHING


SIGTERM_SCRIPT = textwrap.dedent("""
    import sys, time
    from topology.net import Testbed, TopologyConfig
    from topology.profiles import load_profile
    cfg = TopologyConfig(wan_profile=load_profile("wan-cross-country"), backend=sys.argv[1])
    try:
        with Testbed(cfg):
            print("up", flush=True)
            time.sleep(120)
    except KeyboardInterrupt:
        sys.exit(42)
""")


def test_teardown_on_sigterm(backend):
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, backend], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert leftovers()["links"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 42
    finally:
        if proc.poll() is None:
            proc.kill()
    assert leftovers() == NOTHING


def test_sighup_tears_down_and_a_second_signal_does_not_cut_the_teardown_short(backend):
    """A dropped ssh session (SIGHUP) tears the run down; signals arriving during that teardown (a second
    Ctrl-C, another SIGTERM) used to abort it midway, leaving links the next run refused as 'prefix busy'."""
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, backend], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGHUP)
        t0, sent_during = time.monotonic(), 0
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # while it tears down (it takes seconds)
            time.sleep(0.1)
            if proc.poll() is None:
                proc.send_signal(sig)
                sent_during += 1
        assert proc.wait(timeout=60) == 42
        print(f"teardown took {time.monotonic() - t0:.2f} s; {sent_during} signals arrived during it")
        assert sent_during == 3
    finally:
        if proc.poll() is None:
            proc.kill()
    assert leftovers() == NOTHING


def test_busy_prefix_is_a_clear_error(backend):
    subprocess.run(["ip", "link", "add", naming.SWITCH_A, "type", "bridge"], check=True)
    try:
        with pytest.raises(TestbedError, match="prefix 'pdd' is busy.*make clean"):
            Testbed(_cfg(backend)).__enter__()
    finally:
        subprocess.run(["ip", "link", "del", naming.SWITCH_A], check=True)


def test_make_clean_removes_a_crashed_run(backend):
    """A run killed with SIGKILL (no teardown at all) is cleaned by `pddlab clean`, by its own PIDs; what is
    left is observed with ps, ip and iptables themselves, before and after (tests/observe.py)."""
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, backend], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    tree = observe.process_tree(proc.pid)  # host shells, the emulator (userspace), tcpdump ...
    workdir = json.loads((STATE_DIR / f"testbed-{proc.pid}.json").read_text())["workdir"]
    proc.kill()
    proc.wait()
    # Host shells exit by themselves once their stdin closes; bridges, rules and the emulator stay.
    before = observe.left_behind(tree, workdir)
    assert before["links"] and before["iptables"] and before["workdir"], before
    assert leftovers()["state_files"]
    out = subprocess.run([sys.executable, "-m", "experiments.cli", "clean"], capture_output=True, text=True)
    assert out.returncode == 0 and "link pdd-sa" in out.stdout and f"work directory {workdir}" in out.stdout
    assert observe.left_behind(tree, workdir) == observe.NOTHING_LEFT, out.stdout
    assert leftovers() == NOTHING


def test_not_root_is_a_clear_error(tmp_path):
    # A user namespace that maps us to nobody: the CLI sees euid 65534, while the kernel still checks file
    # access as the caller, so the checkout may live anywhere (setpriv --reuid made this test fail in a
    # private clone: nobody could not import the project).
    out = subprocess.run(
        ["unshare", "--map-user=65534", "--map-group=65534", sys.executable, "-m", "experiments.cli", "run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 3  # environment (docs/spec.md: exit codes)
    assert "needs root" in out.stderr and "Traceback" not in out.stderr
