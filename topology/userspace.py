"""The userspace link emulator: a netem-like packet forwarder on the WAN wire.

Responsible for: a process that bridges two dedicated interfaces (`if_a`,
`if_b`, e.g. the two veth ends in the wire's namespace) with AF_PACKET raw
sockets and passes every frame through one `NetemQueue` per direction
(a_to_b: received on if_a, sent on if_b; b_to_a the reverse); a JSON-lines
control socket to change the parameters live and read counters (the client
that starts, drives and stops this process is `topology.emulator`).
Not responsible for: creating interfaces or namespaces, choosing between this
and the kernel's netem (see `topology.shaping`), or netem's per-packet
decisions themselves (see `topology.netem_model`).

Requirements on the caller:
- The wire interfaces carry nothing but the emulated link; the forwarder puts
  them in promiscuous mode (while its sockets are open) and gives them no IPs.
- Offloads must be off on both wire interfaces AND on their peers (`ethtool -K
  IF tso off gso off gro off tx off rx off`, see `offload_off_cmds`).
  Otherwise AF_PACKET sees up-to-64-KB GSO/GRO frames that rate and loss would
  treat as one packet, and frames with partial (not yet computed) checksums
  that are invalid once re-sent. rx checksumming must be off on the receiving
  peers too, or veth marks our frames CHECKSUM_UNNECESSARY and corruption
  would go unnoticed by the receiver.
- Disabling IPv6 on the wire interfaces (`sysctl net.ipv6.conf.IF.disable_ipv6=1`
  in the wire namespace) keeps the wire namespace's own stack quiet.

Command line (JSON = `LinkParams.to_dict()`):

    python -m topology.userspace --if-a IF --if-b IF --control /path/ctl.sock \\
        --seed N --params-a-to-b JSON --params-b-to-a JSON

Control protocol (UNIX stream socket, one JSON object per line each way):
    {"cmd": "ping"}                                   -> {"ok": true}
    {"cmd": "set", "direction": "a_to_b", "params": {...}} -> {"ok": true} | {"ok": false, "error": "..."}
    {"cmd": "stats"}  -> {"ok": true, "a_to_b": {counters}, "b_to_a": {counters},
                          "health": {"t_ns", "cpu_s", "lateness": {a_to_b: Lateness.to_dict(), ...}}}
    (health: the forwarder's own CPU seconds and how late its frames left; see netem_model.Lateness)
    {"cmd": "stop"}   -> {"ok": true}, then the process exits 0 (as on SIGTERM/SIGINT)
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import errno
import gc
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from topology.netem_model import Lateness, NetemConfigError, NetemCounters, NetemQueue
from topology.tc import offload_off_cmd
from topology.profiles import DIRECTIONS, LinkParams, ProfileError, link_params_from_dict

log = logging.getLogger(__name__)

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_STATISTICS = 6
PACKET_QDISC_BYPASS = 20
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
PR_SET_TIMERSLACK = 29
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESPEC = struct.Struct("qq")
ANCDATA_BYTES = 64
# Socket buffers: a burst of 64 MB covers > 0.5 s at 1 Gbit/s.
SOCKET_BUFFER_BYTES = 64 << 20
# Frames taken from one socket before the due frames are sent again: bounds the extra delay a receive burst
# adds to departures. A frame costs 15-30 us here in Python: 16 keeps a burst's delay of the due frames near
# 0.5 ms. In the default experiment's pd-cross (2 cores, the roles busy) the p99 lateness was 1.5 ms with
# 256, 0.8-1.1 ms with 16, and 1.1-3.9 ms with 4 (one select per 4 frames costs more than it saves).
RECV_BATCH = 16
SEND_RETRY_S = 0.002  # how long a refused frame is tried again before it is counted lost
SEND_RETRY_PAUSE_S = 20e-6  # the pause between tries: lets the receiving core drain its backlog
# Real-time priority (SCHED_FIFO) of the forwarder: it preempts the roles and the load generator that share the
# machine's cores with it, so its frames leave on time (the roles wait for it instead; the kernel keeps 5% of
# each second for normal tasks). 0: normal scheduling. Any priority does: nothing else of the testbed is RT.
DEFAULT_RT_PRIORITY = 50
# Ethernet header + VLAN tag + slack above the interface MTU.
FRAME_OVERHEAD_BYTES = 32
READY_POLL_S = 0.02
# Poll instead of sleeping this long before each departure (us): a wake-up
# from select() on a VM is late by 0.1-0.3 ms, which the delay would inherit.
DEFAULT_SPIN_US = 100  # under normal scheduling; at real-time priority it never spins (see --spin-us)
REPO_ROOT = Path(__file__).resolve().parent.parent


class EmulatorError(RuntimeError):
    """The emulator process failed to start, answered an error, or died."""


def offload_off_cmds(ifnames: Sequence[str], netns: str | None = None) -> list[list[str]]:
    """ethtool commands that turn off the offloads AF_PACKET forwarding cannot handle."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return [[*prefix, *offload_off_cmd(name)] for name in ifnames]


def emulator_cmd(
    if_a: str,
    if_b: str,
    control_path: str | Path,
    seed: int,
    a_to_b: LinkParams,
    b_to_a: LinkParams,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
    rt_priority: int = DEFAULT_RT_PRIORITY,
    cpu: int | None = None,
) -> list[str]:
    """The command line that runs the forwarder (inside `prefix`, e.g. ip netns exec NS); rt_priority: its
    SCHED_FIFO priority (0: normal scheduling); cpu: the one core it runs on (None: any)."""
    return [
        *prefix,
        python,
        "-m",
        "topology.userspace",
        "--if-a",
        if_a,
        "--if-b",
        if_b,
        "--control",
        str(control_path),
        "--seed",
        str(seed),
        "--params-a-to-b",
        json.dumps(a_to_b.to_dict()),
        "--params-b-to-a",
        json.dumps(b_to_a.to_dict()),
        "--rt-priority",
        str(rt_priority),
        *(["--cpu", str(cpu)] if cpu is not None else []),
    ]


@dataclass
class DirectionStats(NetemCounters):
    """Counters of one direction, plus what the forwarder itself saw (frames)."""

    queued: int = 0  # frames waiting in the queue now
    rx_drops: int = 0  # frames the kernel dropped before we read them (socket buffer full)
    tx_errors: int = 0  # frames the wire refused on send (lost)
    tx_retries: int = 0  # sends tried again after a refusal (late, not lost)


# --------------------------------------------------------------------------
# The forwarder process
# --------------------------------------------------------------------------


def _set_timer_slack_ns(slack_ns: int) -> None:
    """Ask for precise timers: the default 50 us slack would add to every delay."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0)
    except (OSError, AttributeError) as exc:
        log.warning("cannot set timer slack: %s", exc)


def forwarder_cpu(cores: int | None = None) -> int | None:
    """The core the forwarder runs on where the machine has two or more: the last one (the kernel's receive
    work of what it sends is steered to the others, `rps_mask`); None on a single core (no pinning)."""
    cores = os.cpu_count() if cores is None else cores
    return cores - 1 if cores and cores > 1 else None


def rps_mask(cpu: int | None, cores: int | None = None) -> int | None:
    """The RPS mask (a hex bitmask of cores) for the interfaces that receive what the forwarder sends: every
    core but the forwarder's, so the gateways' routing, the bridges and the receivers' TCP run there instead
    of inside the forwarder's send(); None without a forwarder core."""
    cores = os.cpu_count() if cores is None else cores
    if cpu is None or not cores:
        return None
    return ((1 << cores) - 1) & ~(1 << cpu)


def _set_affinity(cpu: int | None) -> None:
    if cpu is None:
        return
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as exc:
        log.warning("cannot run on core %d: %s", cpu, exc)


def _set_realtime(priority: int) -> str:
    """SCHED_FIFO at priority for this process (0: leave it as it is); the scheduling it runs under, as a word
    for its health record: "fifo:<priority>", or "other" (asked for none, or refused: logged)."""
    if priority <= 0:
        return "other"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as exc:  # no CAP_SYS_NICE, or a cgroup without real-time runtime
        log.warning("cannot run at real-time priority %d (its frames may leave late): %s", priority, exc)
        return "other"
    return f"fifo:{priority}"


def _set_buffer(sock: socket.socket, force_opt: int, opt: int, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)


class WirePort:
    """One wire interface: a non-blocking, promiscuous AF_PACKET socket."""

    def __init__(self, ifname: str):
        """ifname: interface to bind (must exist in this network namespace)."""
        self.ifname = ifname
        self.ifindex = socket.if_nametoindex(ifname)
        # Protocol 0 receives nothing until bind() names both interface and protocol.
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.sock.bind((ifname, ETH_P_ALL))
        mreq = struct.pack("iHH8s", self.ifindex, PACKET_MR_PROMISC, 0, b"")
        self.sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        _set_buffer(self.sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        _set_buffer(self.sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        self.sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
        # Arrival time from the kernel: our own wake-up latency must not add to the delay.
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.kernel_filters_outgoing = self._ignore_outgoing()
        self.sock.setblocking(False)
        self.bufsize = int(Path(f"/sys/class/net/{ifname}/mtu").read_text()) + FRAME_OVERHEAD_BYTES
        self.tx_errors = 0
        self.tx_retries = 0  # sends tried again after the kernel refused them for want of room
        self._rx_drops = 0

    @property
    def rx_drops(self) -> int:
        """Frames the kernel dropped on this socket's receive queue so far."""
        # Reading PACKET_STATISTICS resets the kernel's counters: accumulate.
        _, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self._rx_drops += drops
        return self._rx_drops

    def _ignore_outgoing(self) -> bool:
        try:
            self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            return True
        except OSError:  # kernel < 4.20: filter on sll_pkttype instead
            log.info("%s: PACKET_IGNORE_OUTGOING unsupported, filtering in userspace", self.ifname)
            return False

    def fileno(self) -> int:
        """For select()."""
        return self.sock.fileno()

    def drain(self, queue: NetemQueue, limit: int = RECV_BATCH) -> int:
        """Receive up to `limit` frames into `queue`, each stamped with its kernel arrival time."""
        recvmsg, offer, unpack = self.sock.recvmsg, queue.offer, TIMESPEC.unpack_from
        size, filtering = self.bufsize, not self.kernel_filters_outgoing
        # Kernel stamps are CLOCK_REALTIME; the offset to monotonic drifts by ppm at most.
        offset_ns = time.time_ns() - time.monotonic_ns()
        for taken in range(limit):
            try:
                frame, ancdata, _, addr = recvmsg(size, ANCDATA_BYTES)
            except BlockingIOError:
                return taken
            if filtering and addr[2] == PACKET_OUTGOING:
                continue
            if ancdata:
                sec, nsec = unpack(ancdata[0][2])
                offer(sec * 1_000_000_000 + nsec - offset_ns, frame)
            else:
                offer(time.monotonic_ns(), frame)
        return limit

    def send_all(self, frames: list[bytes]) -> None:
        """Put frames on the wire. A frame the kernel refuses for want of room (ENOBUFS, EAGAIN: the receiving
        core's backlog is full a moment) is tried again for up to SEND_RETRY_S, then counted and lost, like a
        full NIC ring: late rather than lost, where the machine only lagged (the default experiment's pd-cross
        lost 87 of 1.3 million frames so, once in three runs, before the retry)."""
        send = self.sock.send
        for frame in frames:
            deadline = None
            while True:
                try:
                    send(frame)
                    break
                except (BlockingIOError, OSError) as exc:
                    if exc.errno == errno.EMSGSIZE:
                        self.tx_errors += 1
                        break
                    if exc.errno not in (errno.ENOBUFS, errno.EAGAIN):
                        raise
                    now = time.monotonic()
                    deadline = deadline or now + SEND_RETRY_S
                    if now >= deadline:
                        self.tx_errors += 1
                        break
                    self.tx_retries += 1
                    time.sleep(SEND_RETRY_PAUSE_S)

    def close(self) -> None:
        """Close the socket (the kernel drops the promiscuous membership with it)."""
        self.sock.close()


class ControlServer:
    """The JSON-lines control socket; `handler(request) -> reply` does the work."""

    def __init__(self, path: str | Path, handler):
        """path: UNIX socket path (replaced if stale); handler: dict -> dict."""
        self.path = Path(path)
        self.handler = handler
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.clients: dict[socket.socket, bytes] = {}

    def sockets(self) -> list[socket.socket]:
        """Sockets to watch for readability."""
        return [self.listener, *self.clients]

    def on_readable(self, sock: socket.socket) -> None:
        """Accept a client, or read and answer its complete lines."""
        if sock is self.listener:
            client, _ = self.listener.accept()
            client.setblocking(True)
            client.settimeout(1.0)
            self.clients[client] = b""
            return
        data = sock.recv(65536)
        if not data:
            self._drop(sock)
            return
        buf = self.clients[sock] + data
        *lines, self.clients[sock] = buf.split(b"\n")
        for line in lines:
            if line.strip():
                self._answer(sock, line)

    def _answer(self, sock: socket.socket, line: bytes) -> None:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request must be a JSON object")
            reply = self.handler(request)
        except (ValueError, KeyError, TypeError) as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        try:
            sock.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        self.clients.pop(sock, None)
        sock.close()

    def close(self) -> None:
        """Close every socket and remove the path."""
        for sock in list(self.clients):
            self._drop(sock)
        self.listener.close()
        self.path.unlink(missing_ok=True)


class Forwarder:
    """Bridges two WirePorts through one NetemQueue per direction."""

    def __init__(
        self,
        if_a: str,
        if_b: str,
        a_to_b: LinkParams,
        b_to_a: LinkParams,
        seed: int,
        spin_us: float = DEFAULT_SPIN_US,
        recv_batch: int = RECV_BATCH,
    ):
        """if_a/if_b: wire interfaces; a_to_b/b_to_a: impairments; seed: seeds both directions;
        spin_us: poll instead of sleeping this long before a departure (us); recv_batch: frames taken from one
        socket before the due frames are sent again."""
        self.port_a, self.port_b = WirePort(if_a), WirePort(if_b)
        self.spin_ns = int(spin_us * 1000)
        self.recv_batch = recv_batch
        # Different but reproducible random streams per direction.
        self.queues = {"a_to_b": NetemQueue(a_to_b, seed * 2), "b_to_a": NetemQueue(b_to_a, seed * 2 + 1)}
        self.lateness = {d: Lateness() for d in DIRECTIONS}
        self.stopping = False
        self.scheduling = "other"  # how the process is scheduled (main sets it: "fifo:<priority>" or "other")

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one control request."""
        cmd = request.get("cmd")
        if cmd == "ping":
            return {"ok": True}
        if cmd == "stats":
            return {
                "ok": True,
                **{d: dataclasses.asdict(self.stats(d)) for d in DIRECTIONS},
                "health": {
                    "t_ns": time.monotonic_ns(),
                    "cpu_s": time.process_time(),
                    "scheduling": self.scheduling,
                    "lateness": {
                        d: self.lateness[d].to_dict(reset_recent=bool(request.get("reset_recent"))) for d in DIRECTIONS
                    },
                },
            }
        if cmd == "stop":
            self.stopping = True
            return {"ok": True}
        if cmd == "set":
            return self._set(request)
        return {"ok": False, "error": f"unknown cmd {cmd!r}; allowed: ping, set, stats, stop"}

    def _set(self, request: dict[str, Any]) -> dict[str, Any]:
        direction = request.get("direction")
        if direction not in DIRECTIONS:
            return {"ok": False, "error": f"direction {direction!r} is unknown; allowed: {', '.join(DIRECTIONS)}"}
        try:
            params = link_params_from_dict(request.get("params") or {}, where=f"set.{direction}")
            self.queues[direction].set_params(params)
        except (ProfileError, NetemConfigError) as exc:
            return {"ok": False, "error": str(exc)}
        log.info("%s set to %s", direction, params)
        return {"ok": True}

    def stats(self, direction: str) -> DirectionStats:
        """Counters of one direction."""
        queue = self.queues[direction]
        rx, tx = (self.port_a, self.port_b) if direction == "a_to_b" else (self.port_b, self.port_a)
        return DirectionStats(
            **dataclasses.asdict(queue.counters),
            queued=len(queue),
            rx_drops=rx.rx_drops,
            tx_errors=tx.tx_errors,
            tx_retries=tx.tx_retries,
        )

    def run(self, control: ControlServer, wakeup: socket.socket) -> None:
        """Forward until stopped by the control socket or a signal (via `wakeup`)."""
        qa, qb = self.queues["a_to_b"], self.queues["b_to_a"]
        la, lb = self.lateness["a_to_b"], self.lateness["b_to_a"]
        pa, pb = self.port_a, self.port_b
        clock = time.monotonic_ns
        while not self.stopping:
            readable, _, _ = select.select([pa, pb, wakeup, *control.sockets()], [], [], self._timeout_s(clock()))
            for sock in readable:
                if sock is pa:
                    pa.drain(qa, self.recv_batch)
                elif sock is pb:
                    pb.drain(qb, self.recv_batch)
                elif sock is wakeup:
                    self.stopping = True
                else:
                    control.on_readable(sock)
            now = clock()
            pb.send_all(qa.pop_due(now, la))
            pa.send_all(qb.pop_due(now, lb))

    def _timeout_s(self, now_ns: int) -> float | None:
        due = [
            t
            for t in (self.queues["a_to_b"].next_departure_ns(), self.queues["b_to_a"].next_departure_ns())
            if t is not None
        ]
        if not due:
            return None
        # Waking from a sleep costs 0.1-0.3 ms on a VM: sleep until spin_ns
        # before the departure, then poll (timeout 0) until it is due.
        wait_ns = min(due) - now_ns - self.spin_ns
        return wait_ns / 1e9 if wait_ns > 0 else 0

    def close(self) -> None:
        """Close both wire sockets."""
        self.port_a.close()
        self.port_b.close()


def _params_arg(text: str) -> LinkParams:
    try:
        return link_params_from_dict(json.loads(text), where="command line")
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    except ProfileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The forwarder's command line."""
    parser = argparse.ArgumentParser(prog="python -m topology.userspace", description=__doc__.split("\n")[0])
    parser.add_argument("--if-a", required=True, help="wire interface of cluster A's side")
    parser.add_argument("--if-b", required=True, help="wire interface of cluster B's side")
    parser.add_argument("--control", required=True, help="UNIX socket path for the control protocol")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draws")
    parser.add_argument("--params-a-to-b", type=_params_arg, default=LinkParams(), help="LinkParams JSON")
    parser.add_argument("--params-b-to-a", type=_params_arg, default=LinkParams(), help="LinkParams JSON")
    parser.add_argument(
        "--spin-us",
        type=float,
        default=None,
        help=f"poll instead of sleeping this long before a departure (us); 0 = never; default {DEFAULT_SPIN_US} "
        "under normal scheduling, 0 at real-time priority (a real-time task that spins through a busy second is "
        "throttled by the kernel for the rest of it: 50 ms without forwarding; and it wakes on time anyway)",
    )
    parser.add_argument("--recv-batch", type=int, default=RECV_BATCH, help="frames read per socket per pass")
    parser.add_argument("--cpu", type=int, default=None, help="run on this core only (default: any)")
    parser.add_argument(
        "--rt-priority", type=int, default=DEFAULT_RT_PRIORITY, help="SCHED_FIFO priority (1-99); 0 = normal"
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the forwarder until stop/SIGTERM/SIGINT; returns the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s userspace-emulator[%(process)d] %(levelname)s %(message)s",
    )
    _set_timer_slack_ns(1)
    scheduling = _set_realtime(args.rt_priority)
    _set_affinity(args.cpu)
    # Its objects are frames and tuples freed by reference counting: no cycles to collect, and a collection's
    # pause would hold every frame due meanwhile.
    gc.disable()
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wakeup fd does the work
    try:
        spin_us = args.spin_us if args.spin_us is not None else (0 if scheduling != "other" else DEFAULT_SPIN_US)
        forwarder = Forwarder(
            args.if_a, args.if_b, args.params_a_to_b, args.params_b_to_a, args.seed, spin_us, args.recv_batch
        )
    except (OSError, NetemConfigError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    forwarder.scheduling = scheduling
    control = ControlServer(args.control, forwarder.handle)
    log.info("forwarding %s <-> %s, control %s, seed %d", args.if_a, args.if_b, args.control, args.seed)
    try:
        forwarder.run(control, wake_r)
    finally:
        for d in DIRECTIONS:
            log.info("%s: %s", d, forwarder.stats(d))
        control.close()
        forwarder.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
