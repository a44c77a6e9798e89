"""The emulated network of a topology file (default: two clusters, one WAN line): bring-up, live use and
guaranteed teardown.

Responsible for: building the sites, hosts, switches and lines of a topology
(topology.topofile; the default `two-clusters` is `topology.naming`'s network to
the address) with Mininet's Python API (Linux-bridge switches, no controller, no
OVS), addressing and routing (topology.routes), shaping every line through a
backend of its own, captures (both ends of every line), and removing everything
it made — on normal exit, exceptions, Ctrl-C and SIGTERM.
Not responsible for: what runs on the hosts (experiments and workers do that,
through `Testbed.popen` / `Testbed.run`).

Mininet's global setup (`Mininet.init`, which raises root-namespace sysctls)
and its cleanup (`mn -c`, which kills by name) are never used.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topology import capture, naming, routes, tc
from topology.cleanup import WORKDIR_PREFIX, StateFile, prefixed_links
from topology.proc import HeldDuringTeardown, SigtermAsInterrupt, check_output, terminate
from topology.profiles import DIRECTIONS, Profile, ScheduleStep, load_profile
from topology.runtime import HostRuntime, ProcessRuntime
from topology.topofile import DEFAULT_TOPOLOGY, LineSpec, Topology, gateway_ip, host_specs, line_specs, load_topology
from topology.shaping import (
    AppliedChange,
    Backend,
    BackendChoice,
    LinkState,
    ScheduleRunner,
    choose_backend,
    make_backend,
)

log = logging.getLogger(__name__)
REQUIRED_TOOLS = ("mnexec", "ip", "tc", "brctl", "ifconfig", "ethtool", "iptables")


class TestbedError(RuntimeError):
    """The topology cannot start (not root, Mininet missing, prefix busy, ...)."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class TopologyConfig:
    """What to build.

    wan_profile: the profile of the topology's first line (the WAN of the default topology); None = the
        line's own profile in the topology file
    lan_profile: every intra-cluster link's profile
    n_p, n_rld, n_md: host counts per role (1..19); None = 1, or the topology file's counts for a pool
        it splits across sites
    backend: auto | tc | userspace
    capture_dir: where WAN pcaps go; None = no capture
    snaplen_bytes: bytes kept per captured frame (headers only by default)
    seed: random seed of the userspace emulator
    log_dir: where the emulator's log goes; None = a temporary directory
    runtime: where the end hosts' processes run (topology.runtime.HostRuntime; the caller passes e.g.
        docker_rt.host.DockerRuntime in); default: plain processes in the namespaces
    play_schedule: play the WAN profile's schedule from the moment the link is up; False = the caller
        plays it (`Testbed.play_schedule`) on its own clock, e.g. each variant's window
    cross_hosts: add the cross-traffic hosts xa and xb (topology.naming)
    topology: the topology (topology.topofile); None = the default, two-clusters
    """

    wan_profile: Profile | None
    lan_profile: Profile = field(default_factory=lambda: load_profile("lan"))
    n_p: int | None = None
    n_rld: int | None = None
    n_md: int | None = None
    backend: str = "auto"
    capture_dir: Path | None = None
    snaplen_bytes: int = 128
    seed: int = 1
    log_dir: Path | None = None
    runtime: HostRuntime = field(default_factory=ProcessRuntime)
    play_schedule: bool = True  # the link's clock: calibration and the fidelity tests rely on it
    cross_hosts: bool = False  # only experiments with cross traffic pay for two more namespaces
    topology: Topology | None = None

    def topo(self) -> Topology:
        """The topology to build."""
        return self.topology or load_topology(DEFAULT_TOPOLOGY)

    def pools(self) -> dict[str, int]:
        """The workers asked per pool (those given)."""
        asked = {"p": self.n_p, "rld": self.n_rld, "md": self.n_md}
        return {pool: n for pool, n in asked.items() if n is not None}

    def lines(self, topo: Topology) -> list[LineSpec]:
        """The lines of topo (this config's, topo()) as built; the first runs wan_profile where one is given."""
        lines = line_specs(topo)
        if self.wan_profile is not None:
            lines[0] = dataclasses.replace(lines[0], profile=self.wan_profile)
        return lines


def preflight() -> None:
    """Fail with a clear message when the topology cannot be built here."""
    if os.geteuid() != 0:
        raise TestbedError("the emulated network needs root (network namespaces, veth, tc): run as root or with sudo")
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        raise TestbedError(
            "Mininet's Python library is missing: run `make setup` "
            "(installs Debian's mininet; the project venv sees Debian's site-packages)"
        ) from None
    missing = [t for t in REQUIRED_TOOLS if not shutil.which(t)]
    if missing:
        raise TestbedError(f"missing tools {missing}: run `make setup`")
    busy = prefixed_links()
    if busy:
        raise TestbedError(
            f"name prefix {naming.PREFIX!r} is busy: {busy} exist (another run is active, "
            "or a crashed one left them: run `make clean`)"
        )


class Testbed:
    """A running topology; use as a context manager. `link` is the first line's live state (the WAN of the
    default topology), `links` every line's by name."""

    __test__ = False  # not a pytest test class

    def __init__(self, config: TopologyConfig):
        self.config = config
        self.net: Any = None
        self.backend_choice: BackendChoice | None = None
        self.topology: Topology = config.topo()
        self.lines: list[LineSpec] = config.lines(self.topology)
        # every end host, once: a pool count the topology file disagrees with is refused before anything is built
        self._hosts: list[naming.HostSpec] = host_specs(self.topology, config.pools(), cross=config.cross_hosts)
        self.backend: Backend | None = None  # the first line's shaping backend: it says how the WAN is wired
        self.backends: dict[str, Backend] = {}  # line -> its backend (one shaper per line)
        self._steering: dict | None = None  # the backend's receive steering (steer_receive), for metadata
        self.link: LinkState | None = None
        self.links: dict[str, LinkState] = {}
        self._schedules: list[ScheduleRunner] = []  # the other lines' own profiles' schedules
        self._schedule: ScheduleRunner | None = None
        self._played: list[ScheduleRunner] = []  # schedules played on a caller's clock (play_schedule)
        self._captures: list[capture.Capture] = []
        self._procs: list[subprocess.Popen] = []
        self._procs_lock = threading.Lock()  # popen may be called from several threads (cross-traffic timers)
        self._iptables_rules: list[list[str]] = []
        self._workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self._sigterm = SigtermAsInterrupt()
        self._state: StateFile | None = None
        self._owns_prefix = False  # set once preflight found the prefix free: only then is it ours to clean
        self.runtime: HostRuntime = config.runtime

    # ---- lifecycle -------------------------------------------------------
    def __enter__(self) -> "Testbed":
        self._sigterm.__enter__()
        try:
            self.start()
        except BaseException:
            self.stop()
            self._sigterm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self.stop()
        finally:
            self._sigterm.__exit__(*exc)
        return False

    def start(self) -> None:
        """Build, address, shape and (optionally) capture."""
        preflight()
        self._owns_prefix = True
        self.backend_choice = choose_backend(self.config.backend)
        log_dir = self.config.log_dir or self._workdir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.backends = {
            ln.name: make_backend(
                self.backend_choice,
                self.run,
                self.ns_prefix,
                self._workdir,
                self.config.seed + k,  # each line its own random state
                log_dir,
                line=ln.name,
                interfaces=dict(zip(DIRECTIONS, ln.directions().values())),  # forward, reverse
            )
            for k, ln in enumerate(self.lines)
        }
        self.backend = self.backends[self.lines[0].name]
        self._state = StateFile(workdir=self._workdir)
        self._start_runtime()
        self._build()
        for host in self.net.hosts:
            self._state.add(host.pid, f"host shell {host.name}")
        self._address_and_route()
        self._allow_bridged_forwarding()
        self._shape()
        self._check_connectivity()
        if self.config.capture_dir:
            self._start_captures(self.config.capture_dir)
        if self.config.play_schedule:
            self._schedule = ScheduleRunner(self.link, self.lines[0].profile.schedule).start()
        self._schedules = [  # the other lines play their own profiles' schedules on the link clock always
            ScheduleRunner(self.links[ln.name], ln.profile.schedule).start()
            for ln in self.lines[1:]
            if ln.profile.schedule
        ]
        self.runtime.up(self)

    def stop(self) -> None:
        """Tear down everything this testbed made, in reverse order; never raises midway."""
        steps = [
            self.runtime.down,
            self._stop_schedule,
            self._stop_procs,
            self._stop_captures,
            self._stop_backend,
            self._stop_net,
            self._stop_runtime,
            self._remove_iptables_rules,
            self._remove_leftover_links,
            lambda: shutil.rmtree(self._workdir, ignore_errors=True),
        ]
        failed = False
        with HeldDuringTeardown():
            for step in steps:
                try:
                    step()
                except Exception as exc:
                    failed = True
                    log.error("teardown step %s failed: %s", getattr(step, "__name__", step), exc)
            if not failed:
                self._forget_state()  # else `make clean` finds the PIDs there

    # ---- build -----------------------------------------------------------
    def _host_specs(self) -> list[naming.HostSpec]:
        return self._hosts

    def _build(self) -> None:
        from mininet.link import Link
        from mininet.net import Mininet

        Mininet.inited = True  # skip Mininet.init(): it raises root-namespace sysctls we would not restore
        self.net = Mininet(
            topo=None,
            switch=_bridge_class(),
            controller=None,
            link=Link,
            build=False,
            autoSetMacs=False,
            autoStaticArp=False,
            waitConnected=False,
        )
        switch, gateway = {}, {}
        for k, site in enumerate(self.topology.sites):
            switch[site.name] = self.net.addSwitch(site.switch, dpid=str(k + 1))
            gateway[site.name] = self.net.addHost(site.gateway, ip=None)
            self.net.addLink(gateway[site.name], switch[site.name])  # gw<site>-eth0: LAN
        for spec in self._host_specs():
            site = self.topology.site(spec.cluster)
            host = self.net.addHost(
                spec.name,
                ip=f"{spec.ip}/{site.subnet.prefixlen}",
                defaultRoute=f"via {gateway_ip(site)}",
                **self.runtime.host_params(spec.name, spec.role),
            )
            self.net.addLink(host, switch[spec.cluster])
        for ln in self.lines:  # in file order: each gateway's eth1, eth2, ... (topofile.line_specs)
            a, b = (gateway[end.site] for end in ln.ends)
            wire_host = self.backends[ln.name].wire_host
            if wire_host:  # a host of the backend's own on the line (the userspace forwarder's)
                wire = self.net.addHost(wire_host, ip=None)
                self.net.addLink(a, wire)  # gwa-eth1 <-> <wire>-eth0
                self.net.addLink(wire, b)  # <wire>-eth1 <-> gwb-eth1
            else:
                self.net.addLink(a, b)  # gwa-eth1 <-> gwb-eth1
        log.info("building topology %s: %d hosts", self.topology.name, len(self.net.hosts))
        self.net.build()
        self.net.start()

    def _address_and_route(self) -> None:
        for gw, cmds in routes.gateway_commands(self.topology, self._host_specs(), self.lines).items():
            for argv in cmds:
                self.run(gw, argv)
        for host in self.net.hosts:  # keep captures to the experiment's own IPv4 traffic
            self.run(host.name, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
        for backend in self.backends.values():
            backend.wire_up()

    def _check_connectivity(self) -> None:
        """Readiness by a real check: every host reaches its gateway, every gateway its lines' far ends and
        every other site's gateway (each route once).

        This also resolves every ARP entry, so the first measured packet is not delayed by it.
        """
        pairs = [(s.name, [gateway_ip(self.topology.site(s.cluster))]) for s in self._host_specs()]
        pairs += routes.readiness_pairs(self.topology, self.lines)
        for host, target in pairs:
            # Several tries: a lossy profile may drop a ping; one answer is enough.
            self.run(host, ["ping", "-n", "-q", "-c", "5", "-i", "0.2", "-W", "2", "-w", "10", "-A", *target])

    def _allow_bridged_forwarding(self) -> None:
        """With br_netfilter loaded, bridged frames meet iptables FORWARD (Docker sets it to DROP).

        Scoped fix: accept only frames bridged within our own bridges; removed at teardown.
        """
        if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
            return
        for bridge in (s.switch for s in self.topology.sites):
            rule = ["FORWARD", "-i", bridge, "-o", bridge, "-m", "comment", "--comment", "pddlab", "-j", "ACCEPT"]
            _check_call(["iptables", "-I", *rule])
            self._iptables_rules.append(rule)

    def _shape(self) -> None:
        self.backend.shape_lan(self._lan_ends(), self.config.lan_profile.a_to_b)
        self._offloads_off()
        self._steering = self.backend.steer_receive(self._all_ends())
        for ln in self.lines:
            backend, profile = self.backends[ln.name], ln.profile
            backend.start(profile.a_to_b, profile.b_to_a)
            if backend.pid:
                self._state.add(backend.pid, f"{backend.name} shaper of line {ln.name}")
            self.links[ln.name] = LinkState(backend=backend, current={d: profile.direction(d) for d in DIRECTIONS})
        self.link = self.links[self.lines[0].name]

    def _all_ends(self) -> list[tuple[str | None, str]]:
        """(host, interface) of both ends of every link (a switch's end: host None)."""
        return [
            (None if _is_switch(end.node) else end.node.name, end.name)
            for link in self.net.links
            for end in (link.intf1, link.intf2)
        ]

    def _offloads_off(self) -> None:
        """Every interface behaves like a wire: no GSO super-frames, checksums really checked."""
        for host, dev in self._all_ends():
            self.run(host, tc.offload_off_cmd(dev))

    def _lan_ends(self) -> list[tuple[str | None, str]]:
        """(host, interface) of both ends of every intra-cluster link (a switch's end: host None)."""
        return [
            (None if _is_switch(end.node) else end.node.name, end.name)
            for link in self.net.links
            if any(_is_switch(e.node) for e in (link.intf1, link.intf2))  # else a line
            for end in (link.intf1, link.intf2)
        ]

    def _start_captures(self, directory: Path) -> None:
        """Both ends of every line: <line>-<site>.pcap (wan-a.pcap, wan-b.pcap for the default topology)."""
        directory.mkdir(parents=True, exist_ok=True)
        for ln in self.lines:
            for end in ln.ends:
                path = directory / f"{ln.name}-{end.site}.pcap"
                cap = capture.Capture(self.ns_prefix(end.gateway), end.interface, path, self.config.snaplen_bytes)
                cap.start()
                self._captures.append(cap)
                self._state.add(cap.proc.pid, f"tcpdump {end.interface}")

    # ---- use -------------------------------------------------------------
    def host(self, name: str):
        """The Mininet host object by name."""
        return self.net.get(name)

    def address(self, host: str) -> str:
        """A host's address in this topology (its site's subnet)."""
        return next(h.ip for h in self._host_specs() if h.name == host)

    def ns_prefix(self, host: str | None) -> list[str]:
        """argv prefix that runs a command inside a host's namespaces (root namespace for None)."""
        return [] if host is None else ["mnexec", "-a", str(self.host(host).pid)]

    def run(self, host: str | None, argv: list[str], timeout_s: float = 60) -> str:
        """Run argv inside a host (None = root namespace); raise TestbedError on failure."""
        return _check_call(self.ns_prefix(host) + argv, timeout_s)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a tracked background process inside a host; stopped at teardown."""
        full = self.runtime.exec_argv(host, argv) or self.ns_prefix(host) + argv
        log.info("[%s] start: %s", host, " ".join(argv))
        with self._procs_lock:
            proc = subprocess.Popen(full, **kwargs)
            self._procs.append(proc)
            self._state.add(proc.pid, f"{host}: {argv[0]}")
        return proc

    def kill(self, host: str, proc: subprocess.Popen, grace_s: float = 5.0) -> int:
        """SIGKILL a process started with popen() and whatever the runtime still runs of it (a container
        whose docker client was the process); returns its exit status."""
        proc.kill()
        code = proc.wait(grace_s)
        self.runtime.reap(host)
        return code

    def kill_emulator(self) -> int | None:
        """SIGKILL the userspace WAN emulator (a fault an experiment plays: the WAN stops forwarding for
        the rest of the run); its PID, or None where none runs (the tc backend)."""
        pid = self.link.backend.pid if self.link else None
        if pid:
            os.kill(pid, signal.SIGKILL)
        return pid

    # ---- the host runtime (topology.runtime) -------------------------------
    def _start_runtime(self) -> None:
        self.runtime.start()

    def _stop_runtime(self) -> None:
        self.runtime.stop()

    def check_workers(self) -> None:
        """Raise if a worker the runtime runs died (a container: names the role, shows its last log lines)."""
        self.runtime.check()

    def swap_profile(self, profile: Profile, line: str | None = None) -> None:
        """Replace a line's profile on the live link (the first line's, the WAN's, by default); it is then the
        profile restore_profile (first line) and metadata mean."""
        k = next(i for i, ln in enumerate(self.lines) if ln.name == (line or self.lines[0].name))
        self.links[self.lines[k].name].swap_profile(profile)
        self.lines[k] = dataclasses.replace(self.lines[k], profile=profile)
        if k == 0:
            self.config = dataclasses.replace(self.config, wan_profile=profile)

    def capture_to(self, directory: Path | None) -> None:
        """End the WAN captures (their pcaps complete) and, unless directory is None, start new ones there:
        a topology shared by several runs gives each run its own pcaps."""
        self._stop_captures()
        if directory is not None:
            self._start_captures(directory)

    def play_schedule(
        self, steps: tuple[ScheduleStep, ...], start_ns: int | None = None, labels: tuple[str, ...] | None = None
    ) -> ScheduleRunner:
        """Play schedule steps on the live link with their clock at start_ns (time.monotonic_ns(); None =
        now); returns the running handle (`stop()`, `check()`, `end_ns`). Stopped at teardown."""
        runner = ScheduleRunner(self.link, steps, time.monotonic_ns() if start_ns is None else start_ns, labels)
        self._played.append(runner)
        return runner.start()

    def restore_profile(self, cause: str = "restore profile base") -> list[AppliedChange]:
        """Both directions of the first line back to its profile's base parameters (those that differ); the
        changes made."""
        wan = self.lines[0].profile
        return self.link.restore({d: wan.direction(d) for d in DIRECTIONS}, cause)

    def check(self) -> None:
        """Raise TestbedError if a schedule failed to change the link (each played schedule's failure is
        raised once; the link clock's, every time: that schedule stopped for good) or the userspace
        emulator died."""
        # each runner read once, whether it runs before its error: its thread sets the error and then ends, so a
        # change failing between two reads is raised now or next time, never dropped unseen
        clocks = [(r, r.running, r.error) for r in ([self._schedule] if self._schedule else []) + self._schedules]
        played = [(r, r.running, r.error) for r in self._played]
        self._played = [r for r, running, err in played if running and not err]
        problems = [f"schedule failed: {err}" for _r, _running, err in clocks + played if err]
        for name, link in self.links.items():
            code = link.backend.exit_code
            if code is not None:
                problems.append(
                    f"the {link.backend.name} shaper of line {name} exited (status {code}): it no longer forwards"
                )
        if problems:
            raise TestbedError("; ".join(problems))

    def metadata(self) -> dict:
        """How this topology was made, for the run's metadata.json."""
        c = self.config
        return {
            "backend": self.backend_choice.name if self.backend_choice else None,
            "backend_requested": c.backend,
            "backend_reason": self.backend_choice.reason if self.backend_choice else None,
            "lan_shaping": self.backend.lan_shaping if self.backend else None,
            "wan_profile": self.lines[0].profile.to_dict(),
            "lan_profile": c.lan_profile.to_dict(),
            "hosts": [h.__dict__ for h in self._host_specs()],
            "seed": c.seed,
            "snaplen_bytes": c.snaplen_bytes,
            "runtime": self.runtime.name,
            "runtime_metadata": self.runtime.metadata(),
            "link_changes": [ch.__dict__ for ch in self.link.changes] if self.link else [],
            "receive_steering": self._steering,
            "topology": self._topology_metadata(),
        }

    def _topology_metadata(self) -> dict:
        """The topology's record (topology.routes.record) with every line's link changes."""
        out = routes.record(self.topology, self._host_specs(), self.lines)
        for line in out["lines"]:
            link = self.links.get(line["name"])
            line["link_changes"] = [ch.__dict__ for ch in link.changes] if link else []
        return out

    # ---- teardown steps --------------------------------------------------
    def _stop_schedule(self) -> None:
        for runner in ([self._schedule] if self._schedule else []) + self._schedules + self._played:
            runner.stop()
        self._played.clear()
        self._schedules.clear()

    def _stop_procs(self) -> None:
        for proc in reversed(self._procs):
            terminate(proc)
        self._procs.clear()

    def _stop_captures(self) -> None:
        for cap in self._captures:
            cap.stop()
        self._captures.clear()

    def _stop_backend(self) -> None:
        for backend in self.backends.values():  # stopping one never started does nothing
            backend.stop()

    def _stop_net(self) -> None:
        if self.net is not None:
            self.net.stop()
            self.net = None

    def _remove_iptables_rules(self) -> None:
        for rule in self._iptables_rules:
            _check_call(["iptables", "-D", *rule])
        self._iptables_rules.clear()

    def _forget_state(self) -> None:
        if self._state:
            self._state.remove()

    def _remove_leftover_links(self) -> None:
        if not self._owns_prefix:
            return
        for name in prefixed_links():
            log.warning("removing leftover link %s", name)
            subprocess.run(["ip", "link", "del", name], capture_output=True)


def _bridge_class():
    """Mininet's LinuxBridge without its bridge-netfilter warning (we add scoped iptables rules instead)."""
    from mininet.nodelib import LinuxBridge

    class Bridge(LinuxBridge):
        @classmethod
        def setup(cls):
            pass

    return Bridge


def _is_switch(node) -> bool:
    from mininet.node import Switch

    return isinstance(node, Switch)


def _check_call(argv: list[str], timeout_s: float = 60) -> str:
    return check_output(argv, timeout_s, TestbedError)
