"""`pddlab net`: a topology's network alone (the default: two clusters and the WAN; `--topo FILE` any
topology file; `--custom FILE --topo NAME` a Mininet topology class, topology.customtopo), with Mininet's
CLI on it, as Mininet's `mn` gives.

Responsible for: bringing the topology up for a profile (no roles, no workload; cross-traffic hosts on
request), printing its hosts, addresses and lines, and Mininet's own CLI on it — `p1 ping -c 3 md1` (a
host name after the first word becomes its address), `p1 iperf3 ...`, `dump`, `net`, `nodes`, `pingall`,
`py`, `help` — plus the testbed's commands: `link` (every line's parameters now, per direction), `swap
PROFILE [LINE]` (a live profile swap, as the experiments make; the first line by default), `capture
start [DIR]` / `capture stop` (pcaps at both ends of every line), `hosts`; and `--exec LINE`
(repeatable) to run lines and leave, for scripts.
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
from topology.net import Testbed, TestbedError, TopologyConfig
from topology.proc import STOP_SIGNALS
from topology.profiles import ProfileError, load_profile
from topology.shaping import DIRECTIONS
from topology.topofile import Topology, TopologyError, gateway_ip, load_topology

log = logging.getLogger(__name__)
MININET_OUTPUT = 25  # mininet.log's `output` level: what its CLI prints (a node's output among it)


def describe(tb: Testbed) -> str:
    """Hosts with their site and address, the gateways, the lines, the backend and each line's parameters."""
    out = [
        f"backend {tb.backend_choice.name} ({tb.backend_choice.reason}); topology {tb.topology.name}; "
        f"profile {tb.lines[0].profile.name}"
    ]
    for h in tb.metadata()["hosts"]:
        out.append(f"  {h['name']:<8} cluster {h['cluster'].upper()}  {h['ip']:<12} {h['role']}")
    out.append("  gateways " + ", ".join(f"{s.gateway} {gateway_ip(s)}" for s in tb.topology.sites))
    for ln in tb.lines:
        a, b = ln.ends
        out.append(
            f"  line {ln.name} ({a.site.upper()}-{b.site.upper()}): {a.interface} {a.ip} <-> {b.interface} {b.ip}, "
            f"profile {ln.profile.name}" + (f", route {ln.route}" if ln.route else "")
        )
    return "\n".join(out + [link_text(tb)])


def link_text(tb: Testbed) -> str:
    """Every line's parameters now, per direction (a_to_b: the line's first site to its second)."""
    out = []
    for ln in tb.lines:
        head = f"{ln.name} " if len(tb.lines) > 1 else ""
        for d in DIRECTIONS:
            p = tb.links[ln.name].current[d].to_dict()
            shown = ", ".join(
                f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in p.items() if v not in (0, None, "")
            )
            out.append(f"  {head}{d}: {shown or 'unshaped'}")
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
            "Show every line's parameters now, per direction."
            print(link_text(self.tb))

        def do_hosts(self, _line):
            "Show the hosts, their clusters and addresses, and the link."
            print(describe(self.tb))

        def do_swap(self, line):
            "swap PROFILE [LINE]: change a line (the first by default) to a profile (name or YAML path), live."
            words = line.split()
            lines = [ln.name for ln in self.tb.lines]
            if not 1 <= len(words) <= 2 or (len(words) == 2 and words[1] not in lines):
                print(f"usage: swap PROFILE [LINE]; lines: {', '.join(lines)}")
                return
            name = words[0]
            try:
                profile = load_profile(name)
            except ProfileError as err:
                print(f"*** {err}")
                return
            self.tb.swap_profile(profile, words[1] if len(words) == 2 else None)
            print(f"profile {profile.name}:\n{link_text(self.tb)}")

        def do_capture(self, line):
            "capture start [DIR] | capture stop: pcaps at both ends of every line (<line>-<site>.pcap) into DIR."
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


def topology_of(topo: str | None, custom: str | None) -> Topology | None:
    """The shell's topology: --topo FILE, or --custom FILE's Mininet topology class --topo NAME[,ARG,...]
    (topology.customtopo; as mn's --custom, and for the shell alone); None = two-clusters. TopologyError for
    bad input, TestbedError where Mininet's library is missing."""
    if not custom:
        return load_topology(topo) if topo else None
    if not topo:
        raise TopologyError("--custom FILE needs --topo NAME[,ARG,...]: a name of the file's `topos` (as mn)")
    try:
        import mininet.topo  # noqa: F401
    except ImportError:
        raise TestbedError("--custom needs Mininet's Python library: run `make setup`") from None
    from topology.customtopo import load_custom

    return load_custom(custom, topo)


def run(
    profile: str | None,
    backend: str = "auto",
    cross_hosts: bool = False,
    execute: tuple[str, ...] = (),
    topology: Topology | None = None,
) -> int:
    """Bring the network up, run the CLI (or the lines of `execute`), tear it down; the exit status.
    topology: the topology (a file's, or a Mininet topology class's; None = two-clusters); profile: the first
    line's (None = its own)."""
    mn_log = logging.getLogger("mininet")
    mn_log.setLevel(MININET_OUTPUT)
    mn_log.propagate = False  # Mininet's own handler prints it; the root's would print it twice
    cfg = TopologyConfig(
        wan_profile=load_profile(profile) if profile else None,
        backend=backend,
        cross_hosts=cross_hosts,
        topology=topology,
    )
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
