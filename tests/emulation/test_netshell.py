"""`pddlab net` as a user drives it: the topology alone with Mininet's CLI; scripted with --exec, and
interactive on a pipe (EOF and SIGTERM leave). Nothing is left after any of them (the tier's autouse
fixture checks it with the testbed's own and the system's view)."""

import re
import signal
import subprocess
import sys
import time

import pytest

from experiments.rundir.files import REPO

pytestmark = [pytest.mark.emulation]
RTT = re.compile(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/")


def pddlab(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", "net", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def test_exec_pings_across_the_wan_and_a_live_swap_shows_in_the_next_ping():
    lines = ["p1 ping -c 4 -i 0.2 md1", "swap wan-cross-country", "link", "p1 ping -c 4 -i 0.2 md1", "dump"]
    proc = pddlab("--profile", "wan-regional", *(a for line in lines for a in ("--exec", line)))
    out, _ = proc.communicate(timeout=180)
    print(out)
    assert proc.returncode == 0, out
    assert "md1      cluster B  10.2.0.61" in out and "p1       cluster A  10.1.0.21" in out
    regional, cross = (float(x) for x in RTT.findall(out))
    # 5 ms each way, then 30 ms each way: the RTT between them rises by ~50 ms
    assert 8 < regional < 25 and cross > regional + 35, (regional, cross)
    assert "profile wan-cross-country:" in out and "a_to_b: rate_mbit 200" in out
    assert "<Host md1: md1-eth0:10.2.0.61" in out  # Mininet's own dump


def test_topo_opens_a_topology_file_and_swap_names_a_line():
    lines = ["md1 ping -c 3 -i 0.2 md4", "swap wan-regional wanc", "md1 ping -c 3 -i 0.2 md4", "swap x nowhere"]
    proc = pddlab("--topo", "three-sites", *(a for line in lines for a in ("--exec", line)))
    out, _ = proc.communicate(timeout=180)
    print(out)
    assert proc.returncode == 0, out
    assert "topology three-sites" in out and "md3      cluster C  10.3.0.63" in out
    assert "line wanc (A-C): gwa-eth2 10.0.0.5 <-> gwc-eth1 10.0.0.6, profile wan-cross-country" in out
    # b -> a -> c: regional (5 ms) then cross-country (30 ms) each way; then both lines regional
    before, after = (float(x) for x in RTT.findall(out))
    assert 60 < before < 100 and 15 < after < 35, (before, after)
    assert "usage: swap PROFILE [LINE]; lines: wanb, wanc" in out


def test_custom_brings_up_a_mininet_topology_class_and_swap_changes_its_line():
    """mn's `--custom FILE --topo NAME,ARG`: the shipped two-switches class (h1, h2 on s1; h3, h4 on s2; a
    TCLink of delay=20ms between the switches) converted and built by the Testbed, on the auto backend."""
    example = REPO / "examples" / "two-switches.py"
    lines = [
        "h1 ping -c 4 -i 0.2 h3",
        "h1 ping -c 4 -i 0.2 h2",
        "link",
        "swap wan-regional s1s2",
        "h1 ping -c 4 -i 0.2 h3",
    ]
    proc = pddlab(
        "--custom", str(example), "--topo", "twoswitches,20", *(a for line in lines for a in ("--exec", line))
    )
    out, _ = proc.communicate(timeout=180)
    print(out)
    assert proc.returncode == 0, out
    assert "topology twoswitches" in out and "h3       cluster S2  10.2.0.100" in out
    assert "line s1s2 (S1-S2): gws1-eth1 10.0.0.1 <-> gws2-eth1 10.0.0.2, profile s1s2" in out
    assert "a_to_b: delay_ms 20" in out and "b_to_a: delay_ms 20" in out
    across, lan, regional = (float(x) for x in RTT.findall(out))
    # 20 ms each way across s1s2 (RTT 40 ms, plus the LANs' and the shaper's fraction of a ms); h2 is on h1's
    # own switch, no line crossed; then wan-regional's 5 ms each way
    assert 39 < across < 55 and lan < 5 and 8 < regional < 25, (across, lan, regional)


def test_a_bad_topology_file_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\nsites: []\nlines: []\n")
    proc = pddlab("--topo", str(bad), "--exec", "nodes")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and f"pddlab: error: {bad}: client: placed in no site" in out, out


def test_a_bad_profile_is_refused_before_anything_starts():
    proc = pddlab("--profile", "wan-nowhere", "--exec", "nodes")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "pddlab: error: unknown profile 'wan-nowhere'; available:" in out, out


def _interactive():
    proc = pddlab("--profile", "wan-regional", stdin=subprocess.PIPE)
    deadline = time.monotonic() + 120
    seen = ""
    proc.stdin.write("p1 ping -c 1 md1\n")
    proc.stdin.flush()
    while "1 received" not in seen and time.monotonic() < deadline:  # up, and the CLI reads its stdin
        seen += proc.stdout.readline()
        if proc.poll() is not None:
            break
    assert "1 received" in seen, seen
    return proc


def test_eof_at_the_prompt_tears_the_network_down():
    proc = _interactive()
    proc.stdin.close()
    assert proc.wait(60) == 0


def test_sigterm_at_the_prompt_tears_the_network_down():
    proc = _interactive()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130 and "everything the run made was torn down" in out, out
