"""The two-cluster Mininet topology: bring-up, live use and guaranteed teardown.

Responsible for: building the hosts, switches and links of `topology.naming`
with Mininet's Python API (Linux-bridge switches, no controller, no OVS),
addressing and routing, shaping the links through a backend, captures, and
removing everything it made — on normal exit, exceptions, Ctrl-C and SIGTERM.
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

from topology import capture, naming, tc
from topology.cleanup import WORKDIR_PREFIX, StateFile, prefixed_links
from topology.proc import check_output, terminate
from topology.profiles import DIRECTIONS, Profile, ScheduleStep, load_profile
from topology.runtime import HostRuntime, ProcessRuntime
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

    wan_profile: the WAN link's profile
    lan_profile: every intra-cluster link's profile
    n_p, n_rld, n_md: host counts per role (1..19)
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
    """

    wan_profile: Profile
    lan_profile: Profile = field(default_factory=lambda: load_profile("lan"))
    n_p: int = 1
    n_rld: int = 1
    n_md: int = 1
    backend: str = "auto"
    capture_dir: Path | None = None
    snaplen_bytes: int = 128
    seed: int = 1
    log_dir: Path | None = None
    runtime: HostRuntime = field(default_factory=ProcessRuntime)
    play_schedule: bool = True  # the link's clock: calibration and the fidelity tests rely on it
    cross_hosts: bool = False  # only experiments with cross traffic pay for two more namespaces


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


# SIGHUP too: a dropped ssh session must tear the run down like Ctrl-C, not leave it half made.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _SigtermAsInterrupt:
    """Turns SIGTERM and SIGHUP into KeyboardInterrupt while active, so `finally` blocks tear down."""

    def __enter__(self):
        self._old = {sig: signal.signal(sig, self._raise) for sig in STOP_SIGNALS}
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        return False


class _HeldDuringTeardown:
    """While tearing down, SIGINT, SIGTERM and SIGHUP are noted, not raised: a second Ctrl-C or a dropped
    session used to cut the teardown short, and the next run refused with "prefix busy". Raised once the
    teardown is done. Only the main thread can set handlers; elsewhere nothing changes."""

    SIGNALS = (signal.SIGINT, *STOP_SIGNALS)

    def __enter__(self):
        self.caught: list[int] = []
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._note) for sig in self.SIGNALS}
        return self

    def _note(self, signum, frame):
        self.caught.append(signum)
        log.warning("%s during teardown: the teardown finishes first", signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        if self.caught and exc[0] is None:
            raise KeyboardInterrupt(f"signal {signal.Signals(self.caught[0]).name} during teardown")
        return False


class Testbed:
    """A running two-cluster topology; use as a context manager."""

    __test__ = False  # not a pytest test class

    def __init__(self, config: TopologyConfig):
        self.config = config
        self.net: Any = None
        self.backend_choice: BackendChoice | None = None
        self.backend: Backend | None = None  # the shaping backend: it says how the WAN is wired
        self._steering: dict | None = None  # the backend's receive steering (steer_receive), for metadata
        self.link: LinkState | None = None
        self._schedule: ScheduleRunner | None = None
        self._played: list[ScheduleRunner] = []  # schedules played on a caller's clock (play_schedule)
        self._captures: list[capture.Capture] = []
        self._procs: list[subprocess.Popen] = []
        self._procs_lock = threading.Lock()  # popen may be called from several threads (cross-traffic timers)
        self._iptables_rules: list[list[str]] = []
        self._workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self._sigterm = _SigtermAsInterrupt()
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
        self.backend = make_backend(
            self.backend_choice, self.run, self.ns_prefix, self._workdir, self.config.seed, log_dir
        )
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
            self._schedule = ScheduleRunner(self.link, self.config.wan_profile.schedule).start()
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
        with _HeldDuringTeardown():
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
        c = self.config
        return naming.hosts(c.n_p, c.n_rld, c.n_md, cross=c.cross_hosts)

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
        sa = self.net.addSwitch(naming.SWITCH_A, dpid="1")
        sb = self.net.addSwitch(naming.SWITCH_B, dpid="2")
        switch = {"a": sa, "b": sb}
        for cluster, gw in (("a", naming.GATEWAY_A), ("b", naming.GATEWAY_B)):
            self.net.addLink(self.net.addHost(gw, ip=None), switch[cluster])  # gw-eth0: LAN
        for spec in self._host_specs():
            host = self.net.addHost(
                spec.name,
                ip=f"{spec.ip}/24",
                defaultRoute=f"via {naming.gateway_lan_ip(spec.cluster)}",
                **self.runtime.host_params(spec.name, spec.role),
            )
            self.net.addLink(host, switch[spec.cluster])
        gwa, gwb = self.net.get(naming.GATEWAY_A), self.net.get(naming.GATEWAY_B)
        if self.backend.wire_host:  # a host of the backend's own on the wire (the userspace forwarder's)
            wire = self.net.addHost(self.backend.wire_host, ip=None)
            self.net.addLink(gwa, wire)  # gwa-eth1 <-> <wire>-eth0
            self.net.addLink(wire, gwb)  # <wire>-eth1 <-> gwb-eth1
        else:
            self.net.addLink(gwa, gwb)  # gwa-eth1 <-> gwb-eth1
        log.info("building topology: %d hosts", len(self.net.hosts))
        self.net.build()
        self.net.start()

    def _address_and_route(self) -> None:
        gwa, gwb = self.host(naming.GATEWAY_A), self.host(naming.GATEWAY_B)
        prefix = naming.WAN_PREFIXLEN
        for gw, lan_ip, wan_ip, remote_subnet, remote_wan in (
            (gwa, naming.gateway_lan_ip("a"), naming.WAN_A_IP, naming.SUBNET_B, naming.WAN_B_IP),
            (gwb, naming.gateway_lan_ip("b"), naming.WAN_B_IP, naming.SUBNET_A, naming.WAN_A_IP),
        ):
            name = gw.name
            self.run(name, ["ip", "addr", "add", f"{lan_ip}/24", "dev", f"{name}-eth0"])
            self.run(name, ["ip", "addr", "add", f"{wan_ip}/{prefix}", "dev", f"{name}-eth1"])
            self.run(name, ["ip", "route", "add", remote_subnet, "via", remote_wan])
            self.run(name, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])  # namespace-local
        for host in self.net.hosts:  # keep captures to the experiment's own IPv4 traffic
            self.run(host.name, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
        self.backend.wire_up()

    def _check_connectivity(self) -> None:
        """Readiness by a real check: every host reaches its gateway and the gateways each other.

        This also resolves every ARP entry, so the first measured packet is not delayed by it.
        """
        pairs = [(s.name, naming.gateway_lan_ip(s.cluster)) for s in self._host_specs()]
        pairs += [(naming.GATEWAY_A, naming.WAN_B_IP), (naming.GATEWAY_B, naming.WAN_A_IP)]
        for host, ip in pairs:
            # Several tries: a lossy profile may drop a ping; one answer is enough.
            self.run(host, ["ping", "-n", "-q", "-c", "5", "-i", "0.2", "-W", "2", "-w", "10", "-A", ip])

    def _allow_bridged_forwarding(self) -> None:
        """With br_netfilter loaded, bridged frames meet iptables FORWARD (Docker sets it to DROP).

        Scoped fix: accept only frames bridged within our own bridges; removed at teardown.
        """
        if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
            return
        for bridge in (naming.SWITCH_A, naming.SWITCH_B):
            rule = ["FORWARD", "-i", bridge, "-o", bridge, "-m", "comment", "--comment", "pddlab", "-j", "ACCEPT"]
            _check_call(["iptables", "-I", *rule])
            self._iptables_rules.append(rule)

    def _shape(self) -> None:
        wan, backend = self.config.wan_profile, self.backend
        backend.shape_lan(self._lan_ends(), self.config.lan_profile.a_to_b)
        self._offloads_off()
        self._steering = backend.steer_receive(self._all_ends())
        backend.start(wan.a_to_b, wan.b_to_a)
        if backend.pid:
            self._state.add(backend.pid, f"{backend.name} shaper")
        self.link = LinkState(backend=backend, current={d: wan.direction(d) for d in DIRECTIONS})

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
            if any(_is_switch(e.node) for e in (link.intf1, link.intf2))  # else the WAN link
            for end in (link.intf1, link.intf2)
        ]

    def _start_captures(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for side, (host, dev) in zip("ab", naming.wan_interfaces().values()):
            cap = capture.Capture(self.ns_prefix(host), dev, directory / f"wan-{side}.pcap", self.config.snaplen_bytes)
            cap.start()
            self._captures.append(cap)
            self._state.add(cap.proc.pid, f"tcpdump {dev}")

    # ---- use -------------------------------------------------------------
    def host(self, name: str):
        """The Mininet host object by name."""
        return self.net.get(name)

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

    def swap_profile(self, profile: Profile) -> None:
        """Replace the WAN profile on the live link; it is then the profile restore_profile and metadata mean."""
        self.link.swap_profile(profile)
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
        """Both directions back to the WAN profile's base parameters (those that differ); the changes made."""
        wan = self.config.wan_profile
        return self.link.restore({d: wan.direction(d) for d in DIRECTIONS}, cause)

    def check(self) -> None:
        """Raise TestbedError if a schedule failed to change the link (each played schedule's failure is
        raised once; the link clock's, every time: that schedule stopped for good) or the userspace
        emulator died."""
        failed = [r for r in ([self._schedule] if self._schedule else []) + self._played if r.error]
        self._played = [r for r in self._played if not r.error and r.running]
        problems = [f"schedule failed: {r.error}" for r in failed]
        code = self.link.backend.exit_code if self.link else None
        if code is not None:
            problems.append(f"the {self.link.backend.name} shaper exited (status {code}): the WAN no longer forwards")
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
            "wan_profile": c.wan_profile.to_dict(),
            "lan_profile": c.lan_profile.to_dict(),
            "hosts": [h.__dict__ for h in self._host_specs()],
            "seed": c.seed,
            "snaplen_bytes": c.snaplen_bytes,
            "runtime": self.runtime.name,
            "runtime_metadata": self.runtime.metadata(),
            "link_changes": [ch.__dict__ for ch in self.link.changes] if self.link else [],
            "receive_steering": self._steering,
        }

    # ---- teardown steps --------------------------------------------------
    def _stop_schedule(self) -> None:
        for runner in ([self._schedule] if self._schedule else []) + self._played:
            runner.stop()
        self._played.clear()

    def _stop_procs(self) -> None:
        for proc in reversed(self._procs):
            terminate(proc)
        self._procs.clear()

    def _stop_captures(self) -> None:
        for cap in self._captures:
            cap.stop()
        self._captures.clear()

    def _stop_backend(self) -> None:
        if self.link:
            self.link.backend.stop()

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
    return node.name in (naming.SWITCH_A, naming.SWITCH_B)


def _check_call(argv: list[str], timeout_s: float = 60) -> str:
    return check_output(argv, timeout_s, TestbedError)
