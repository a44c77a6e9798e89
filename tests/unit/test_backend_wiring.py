"""Each shaping backend owns its wiring of the WAN (pure logic: the commands it would run, recorded)."""

from pathlib import Path

import pytest

from topology import naming
from topology.profiles import LinkParams
from topology.shaping import BackendChoice, ShapingError, TcBackend, UserspaceBackend, make_backend


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, host, argv):
        self.calls.append((host, argv))
        return ""


def _backend(name: str, run: Recorder):
    prefix_of = lambda host: ["mnexec", "-a", f"<pid of {host}>"]  # noqa: E731
    return make_backend(BackendChoice(name, "auto", "test"), run, prefix_of, Path("/w"), 7, Path("/logs"))


def test_tc_joins_the_gateways_directly_and_shapes_the_lan_with_netem():
    run = Recorder()
    backend = _backend("tc", run)
    assert isinstance(backend, TcBackend) and backend.wire_host is None
    assert backend.pid is None and backend.exit_code is None  # the kernel shapes: no process to watch
    backend.wire_up()
    assert run.calls == []
    backend.shape_lan([(None, "pdd-sa-eth1"), ("p1", "p1-eth0")], LinkParams(delay_ms=0.1))
    assert [(h, argv[:6]) for h, argv in run.calls] == [
        (None, ["tc", "qdisc", "replace", "dev", "pdd-sa-eth1", "root"]),
        ("p1", ["tc", "qdisc", "replace", "dev", "p1-eth0", "root"]),
    ]
    assert all("netem" in argv for _, argv in run.calls)


def test_userspace_puts_its_own_host_on_the_wire():
    run = Recorder()
    backend = _backend("userspace", run)
    assert isinstance(backend, UserspaceBackend) and backend.wire_host == naming.WIRE
    assert backend.pid is None and backend.exit_code is None  # not started yet
    backend.wire_up()
    assert run.calls == [
        (naming.WIRE, ["ip", "link", "set", f"{naming.WIRE}-{dev}", "promisc", "on", "up"]) for dev in ("eth0", "eth1")
    ]


def test_userspace_shapes_both_ends_of_every_lan_link_with_a_token_bucket():
    run = Recorder()
    backend = _backend("userspace", run)
    backend.shape_lan([(None, "pdd-sa-eth1"), ("p1", "p1-eth0")], LinkParams(rate_mbit=50, delay_ms=0.02))
    assert [(h, argv[:6], argv[8]) for h, argv in run.calls] == [
        (None, ["tc", "qdisc", "replace", "dev", "pdd-sa-eth1", "root"], "tbf"),
        (None, ["tc", "qdisc", "replace", "dev", "pdd-sa-eth1", "parent"], "10:"),
        ("p1", ["tc", "qdisc", "replace", "dev", "p1-eth0", "root"], "tbf"),
        ("p1", ["tc", "qdisc", "replace", "dev", "p1-eth0", "parent"], "10:"),
    ]
    assert backend.lan_shaping.startswith("tbf 50 Mbit/s")
    assert "delay 0.02 ms not added" in backend.lan_shaping


def test_userspace_refuses_a_lan_profile_that_needs_netem_before_shaping_anything():
    run = Recorder()
    backend = _backend("userspace", run)
    with pytest.raises(ShapingError, match=r"loss_pct = 0.1.*only netem applies.*tc backend"):
        backend.shape_lan([(None, "pdd-sa-eth1")], LinkParams(rate_mbit=50, loss_pct=0.1))
    assert run.calls == []
    assert backend.lan_shaping.startswith("none")
