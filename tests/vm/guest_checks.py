"""Runs INSIDE the VM (with /usr/bin/python3) for tests/vm/test_vm.py.

Responsible for: performing the in-guest checks (kernel release, netem on lo,
netem on a veth pair between two named netns, Mininet import, a file in the
share) and writing what it saw to `<share>/guest_checks.json`; then exiting
with EXIT_STATUS so the host can check that a status comes back.
Not responsible for: judging the results; the host-side test asserts on the JSON.

Uses only the standard library and host tools, so it does not depend on the
project's venv working inside the VM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EXIT_STATUS = 7  # deliberately non-zero and not 1, so a real crash is told apart
NETNS = ("pddlabvm-a", "pddlabvm-b")  # created only inside the VM
VETH = ("pvm-a", "pvm-b")
ADDRS = ("10.231.0.1", "10.231.0.2")
OUTSIDE_MARKER = "pddlab-vm-outside-marker"  # written next to the share, must not reach the host
NETEM_DELAY_MS = 10  # per direction, so the RTT should be 2 * 10 ms


def sh(*argv: str) -> subprocess.CompletedProcess:
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv, capture_output=True, text=True)


def ping_rtts_ms(*prefix: str, dest: str) -> list[float]:
    """Per-packet RTTs of `ping -c 5 -i 0.2`, after one unmeasured ping that resolves ARP
    (through netem, ARP alone would add a full RTT to the first packet)."""
    sh(*prefix, "ping", "-c", "1", "-W", "2", dest)
    out = sh(*prefix, "ping", "-c", "5", "-i", "0.2", dest).stdout
    return [float(t) for t in re.findall(r"time=([\d.]+) ms", out)]


def lo_checks() -> dict:
    baseline = ping_rtts_ms(dest="127.0.0.1")
    add = sh("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{NETEM_DELAY_MS}ms")
    rtt = ping_rtts_ms(dest="127.0.0.1")
    sh("tc", "qdisc", "del", "dev", "lo", "root")
    return {"lo_rtt_ms": baseline, "netem_add_rc": add.returncode, "netem_add_err": add.stderr, "lo_netem_rtt_ms": rtt}


def netns_checks() -> dict:
    a, b = NETNS
    steps = [
        ("ip", "netns", "add", a),
        ("ip", "netns", "add", b),
        ("ip", "link", "add", VETH[0], "netns", a, "type", "veth", "peer", "name", VETH[1], "netns", b),
    ]
    for ns, dev, addr in zip(NETNS, VETH, ADDRS):
        steps += [
            ("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
            ("ip", "-n", ns, "link", "set", dev, "up"),
            (
                "ip",
                "netns",
                "exec",
                ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "netem",
                "delay",
                f"{NETEM_DELAY_MS}ms",
            ),
        ]
    failed = [" ".join(s) + ": " + r.stderr for s in steps if (r := sh(*s)).returncode]
    listed = sh("ip", "netns", "list").stdout
    return {
        "netns_errors": failed,
        "netns_listed": listed,
        "veth_netem_rtt_ms": ping_rtts_ms("ip", "netns", "exec", a, dest=ADDRS[1]),
    }


def readonly_checks(share: Path) -> dict:
    try:
        (share.parent / OUTSIDE_MARKER).write_text("x")
        outside_ok = True
    except OSError:
        outside_ok = False
    mnt = Path("/run/pddlab-hostroot-rw")
    mnt.mkdir(parents=True, exist_ok=True)
    mounted = sh("mount", "-t", "virtiofs", "hostroot", str(mnt)).returncode == 0
    direct = sh("touch", str(mnt / str(share.parent).lstrip("/") / OUTSIDE_MARKER))
    if mounted:
        sh("umount", str(mnt))
    return {
        "outside_write_ok_in_guest": outside_ok,
        "direct_mount_ok": mounted,
        "direct_write_rc": direct.returncode,
        "direct_write_err": direct.stderr,
    }


def main() -> int:
    share = Path(sys.argv[1])
    results = {"uname_r": sh("uname", "-r").stdout.strip()}
    results.update(lo_checks())
    results.update(netns_checks())
    results.update(readonly_checks(share))
    mininet = sh("/usr/bin/python3", "-c", "import mininet.net")
    results["mininet_import_rc"], results["mininet_import_err"] = mininet.returncode, mininet.stderr
    (share / "hello.txt").write_text("written inside the VM\n")
    (share / "guest_checks.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2), flush=True)
    return EXIT_STATUS


if __name__ == "__main__":
    sys.exit(main())
