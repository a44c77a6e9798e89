"""Unit tests of topology.userspace that need no root: command builders, CLI parsing, control protocol."""

from __future__ import annotations

import json
import select
import threading

import pytest

from topology.profiles import LinkParams
from topology.emulator import control_request
from topology.shaping import rps_cmd
from topology.userspace import (
    DEFAULT_RT_PRIORITY,
    ControlServer,
    emulator_cmd,
    forwarder_cpu,
    offload_off_cmds,
    parse_args,
    rps_mask,
)


def test_offload_off_cmds():
    assert offload_off_cmds(["wa"]) == [
        ["ethtool", "-K", "wa", "tso", "off", "gso", "off", "gro", "off", "tx", "off", "rx", "off"]
    ]
    (cmd,) = offload_off_cmds(["b0"], netns="pddt-b")
    assert cmd[:4] == ["ip", "netns", "exec", "pddt-b"] and cmd[4:7] == ["ethtool", "-K", "b0"]


def test_emulator_cmd_round_trips_through_the_cli():
    a_to_b = LinkParams(rate_mbit=200, delay_ms=30, jitter_ms=5, loss_pct=0.1)
    cmd = emulator_cmd(
        "wa",
        "wb",
        "/tmp/x.sock",
        7,
        a_to_b,
        LinkParams(delay_ms=30),
        prefix=["ip", "netns", "exec", "w"],
        python="python3",
    )
    assert cmd[:6] == ["ip", "netns", "exec", "w", "python3", "-m"]
    args = parse_args(cmd[7:])
    assert (args.if_a, args.if_b, args.control, args.seed) == ("wa", "wb", "/tmp/x.sock", 7)
    assert args.params_a_to_b == a_to_b and args.params_b_to_a == LinkParams(delay_ms=30)
    assert args.rt_priority == DEFAULT_RT_PRIORITY and args.cpu is None and args.spin_us is None
    pinned = parse_args(emulator_cmd("wa", "wb", "/c", 1, a_to_b, a_to_b, python="p", rt_priority=0, cpu=1)[3:])
    assert pinned.rt_priority == 0 and pinned.cpu == 1


def test_the_forwarder_takes_the_last_core_and_its_receivers_the_others():
    assert forwarder_cpu(2) == 1 and rps_mask(1, 2) == 0b01
    assert forwarder_cpu(8) == 7 and rps_mask(7, 8) == 0x7F
    assert forwarder_cpu(1) is None and rps_mask(None, 1) is None  # one core: nothing to pin or steer
    cmd = rps_cmd("gwb-eth1", 0x7F)
    assert cmd[:3] == ["unshare", "--mount", "sh"] and cmd[-1].endswith(
        "echo 7f > /sys/class/net/gwb-eth1/queues/rx-0/rps_cpus"
    )


def test_cli_rejects_bad_params():
    with pytest.raises(SystemExit):
        parse_args(["--if-a", "a", "--if-b", "b", "--control", "c", "--params-a-to-b", json.dumps({"delay_ms": -1})])


def test_control_server_answers_json_lines(tmp_path):
    path = tmp_path / "ctl.sock"
    server = ControlServer(path, lambda req: {"ok": True, "echo": req.get("cmd")})
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            readable, _, _ = select.select(server.sockets(), [], [], 0.05)
            for sock in readable:
                server.on_readable(sock)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert control_request(path, {"cmd": "ping"}) == {"ok": True, "echo": "ping"}
        assert control_request(path, {"cmd": "stats"})["echo"] == "stats"
    finally:
        stop.set()
        thread.join()
        server.close()
    assert not path.exists()


def test_receive_work_is_steered_off_the_forwarders_core_and_refusals_are_recorded(monkeypatch):
    from topology import userspace
    from topology.shaping import UserspaceBackend

    ran = []

    def run(host, argv):
        if host == "md1":
            raise RuntimeError("read-only file system")
        ran.append((host, argv[-1].split("> ")[-1]))

    monkeypatch.setattr(userspace.os, "cpu_count", lambda: 2)
    backend = UserspaceBackend(run, lambda host: [], "/tmp/c.sock", 1, None)
    record = backend.steer_receive([(None, "pdd-sa-eth1"), ("gwa", "gwa-eth1"), ("md1", "md1-eth0")])
    assert record == {"forwarder_cpu": 1, "rps_mask": "1", "interfaces": 2, "refused": ["md1:md1-eth0"]}
    assert ran == [
        (None, "/sys/class/net/pdd-sa-eth1/queues/rx-0/rps_cpus"),
        ("gwa", "/sys/class/net/gwa-eth1/queues/rx-0/rps_cpus"),
    ]
    monkeypatch.setattr(userspace.os, "cpu_count", lambda: 1)
    assert backend.steer_receive([("gwa", "gwa-eth1")]) is None  # one core: nothing to keep free


def test_a_refused_frame_is_tried_again_and_lost_only_past_the_retry_time(monkeypatch):
    import errno as errno_

    from topology import userspace

    class Sock:
        def __init__(self, refusals):
            self.refusals, self.sent = refusals, []

        def send(self, frame):
            if self.refusals:
                self.refusals -= 1
                raise OSError(errno_.ENOBUFS, "no buffer space")
            self.sent.append(frame)

    port = object.__new__(userspace.WirePort)
    port.tx_errors = port.tx_retries = 0
    port.sock = Sock(refusals=2)
    # A retry time no loaded machine outlasts: at 2 ms, a 20 us sleep that woke late under make test lost "a".
    monkeypatch.setattr(userspace, "SEND_RETRY_S", 60.0)
    port.send_all([b"a", b"b"])
    assert port.sock.sent == [b"a", b"b"] and (port.tx_retries, port.tx_errors) == (2, 0)
    monkeypatch.setattr(userspace, "SEND_RETRY_S", 0.0005)
    port.sock = Sock(refusals=10**9)
    port.send_all([b"c"])
    assert port.sock.sent == [] and port.tx_errors == 1
