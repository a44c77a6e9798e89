"""`pddlab net`: the two clusters and the WAN alone, with Mininet's CLI on them, as Mininet's `mn` gives.

Responsible for: bringing the topology up for a profile (no roles, no workload; cross-traffic hosts on
request), printing its hosts and addresses, and Mininet's own CLI on it — `p1 ping -c 3 md1` (a host
name after the first word becomes its address), `p1 iperf3 ...`, `dump`, `net`, `nodes`, `pingall`,
`py`, `help` — plus the testbed's commands: `link` (the WAN's parameters now, per direction), `swap
PROFILE` (a live profile swap, as the experiments make), `capture start [DIR]` / `capture stop` (the
WAN's pcaps), `hosts`; and `--exec LINE` (repeatable) to run lines and leave, for scripts.
Teardown (the Testbed's) on `exit`/`quit`, EOF, SIGTERM, SIGHUP, and Ctrl-C at the prompt; a Ctrl-C
while a command runs interrupts that command only, as in Mininet.
Not responsible for: building, shaping or tearing down the network (topology.Testbed).
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

from experiments.rundir.files import RESULTS
from topology import naming
from topology.net import STOP_SIGNALS, Testbed, TopologyConfig
from topology.profiles import ProfileError, load_profile
from topology.shaping import DIRECTIONS

log = logging.getLogger(__name__)
MININET_OUTPUT = 25  # mininet.log's `output` level: what its CLI prints (a node's output among it)


def describe(tb: Testbed) -> str:
    """Hosts with their cluster and address, the gateways, the backend and the link."""
    lines = [f"backend {tb.backend_choice.name} ({tb.backend_choice.reason}); profile {tb.config.wan_profile.name}"]
    for h in tb.metadata()["hosts"]:
        lines.append(f"  {h['name']:<8} cluster {h['cluster'].upper()}  {h['ip']:<12} {h['role']}")
    lines.append(
        f"  gateways gwa {naming.gateway_lan_ip('a')} (WAN {naming.WAN_A_IP}), "
        f"gwb {naming.gateway_lan_ip('b')} (WAN {naming.WAN_B_IP}): the WAN between them"
    )
    return "\n".join(lines + [link_text(tb)])


def link_text(tb: Testbed) -> str:
    out = []
    for d in DIRECTIONS:
        p = tb.link.current[d].to_dict()
        shown = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in p.items() if v not in (0, None, "")
        )
        out.append(f"  {d}: {shown or 'unshaped'}")
    return "\n".join(out)


def _cli_class():
    from mininet.cli import CLI

    class NetCLI(CLI):
        """Mininet's CLI with the testbed's commands; Ctrl-C at the prompt leaves (Mininet's stays)."""

        prompt = "pddlab> "

        def __init__(self, tb: Testbed, script: str | None = None):
            self.tb = tb
            self.stop_signal: int | None = None
            old = {sig: signal.signal(sig, self._on_stop) for sig in STOP_SIGNALS}
            try:
                super().__init__(tb.net, script=script)
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

        def _on_stop(self, signum, frame):
            # Mininet's waitForNode takes any KeyboardInterrupt for "interrupt the command": remember that
            # this one means "leave", and leave once the command is interrupted.
            self.stop_signal = signum
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        def _leave_if_stopped(self) -> None:
            if self.stop_signal is not None:
                raise KeyboardInterrupt(f"signal {signal.Signals(self.stop_signal).name}")

        def waitForNode(self, node):  # noqa: N802 (Mininet's name)
            super().waitForNode(node)
            self._leave_if_stopped()

        def run(self):
            while True:
                try:
                    self.cmdloop()
                    return
                except KeyboardInterrupt:
                    self._leave_if_stopped()
                    busy = [n for n in self.mn.values() if n.waiting]
                    if not busy:  # Ctrl-C at the prompt
                        raise
                    for node in busy:
                        node.sendInt()
                        node.waitOutput()
                    print("\nInterrupt")

        def do_link(self, _line):
            "Show the WAN's parameters now, per direction."
            print(link_text(self.tb))

        def do_hosts(self, _line):
            "Show the hosts, their clusters and addresses, and the link."
            print(describe(self.tb))

        def do_swap(self, line):
            "swap PROFILE: change the WAN to a profile (name or YAML path), live."
            name = line.strip()
            if not name:
                print("usage: swap PROFILE")
                return
            try:
                profile = load_profile(name)
            except ProfileError as err:
                print(f"*** {err}")
                return
            self.tb.swap_profile(profile)
            print(f"profile {profile.name}:\n{link_text(self.tb)}")

        def do_capture(self, line):
            "capture start [DIR] | capture stop: the WAN's pcaps (gwa-eth1 and gwb-eth1) into DIR."
            words = line.split()
            if words[:1] == ["stop"] and len(words) == 1:
                self.tb.capture_to(None)
                print("capture stopped")
            elif words[:1] == ["start"] and len(words) <= 2:
                d = Path(words[1]) if len(words) == 2 else RESULTS / time.strftime("net-%Y%m%d-%H%M%S") / "pcap"
                d.mkdir(parents=True, exist_ok=True)
                self.tb.capture_to(d)
                print(f"capturing into {d}")
            else:
                print("usage: capture start [DIR] | capture stop")

        def do_EOF(self, line):
            "Leave (and tear the network down)."
            print()
            return True

    return NetCLI


def run(profile: str, backend: str = "auto", cross_hosts: bool = False, execute: tuple[str, ...] = ()) -> int:
    """Bring the network up, run the CLI (or the lines of `execute`), tear it down; the exit status."""
    mn_log = logging.getLogger("mininet")
    mn_log.setLevel(MININET_OUTPUT)
    mn_log.propagate = False  # Mininet's own handler prints it; the root's would print it twice
    cfg = TopologyConfig(wan_profile=load_profile(profile), backend=backend, cross_hosts=cross_hosts)
    with Testbed(cfg) as tb:
        print(describe(tb), flush=True)
        cli = _cli_class()
        if execute:
            with tempfile.NamedTemporaryFile("w", suffix=".cli") as script:
                script.write("".join(line + "\n" for line in execute))
                script.flush()
                cli(tb, script=script.name)
        else:
            cli(tb)
        sys.stdout.flush()
    return 0
