"""Ray in the topology, its pure parts: each host's `ray start` command line, the driver's command protocol."""

import io
import json

import pytest

from ray_rt import RayRuntimeError
from ray_rt.driver import PREFIX, needs_from_json, needs_to_json, read_reply, serve
from ray_rt.netns import GCS_PORT, NODE_PORTS, HostNode, RayHostRuntime, node_argv
from ray_rt.placement import PoolNeeds, pool_needs


def flags(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) if "=" in a else (a, "") for a in argv[2:])


def test_the_head_runs_in_the_router_host_with_fixed_ports_and_its_site_and_host_labels(tmp_path):
    head = flags(node_argv(HostNode("router", "10.1.0.11", "a", 0.5), None, tmp_path / "router"))
    assert "--head" in head and "--block" in head and head["--port"] == str(GCS_PORT)
    assert head["--node-ip-address"] == "10.1.0.11" and head["--include-dashboard"] == "false"
    assert head["--labels"] == "pddlab/cluster=a,pddlab/host=router"
    assert head["--num-cpus"] == "1"  # Ray takes whole CPUs: 0.5 asked -> 1 offered
    assert json.loads(head["--system-config"])["health_check_failure_threshold"] >= 20
    assert all(head[f] == str(port) for f, port in NODE_PORTS.items())
    assert all(port < 50050 for port in NODE_PORTS.values())  # below the roles' ports (experiments.spec.deployment)
    assert head["--temp-dir"] == str(tmp_path / "router") and "--memory" not in head


def test_a_node_joins_the_head_and_offers_what_its_worker_asks(tmp_path):
    md = flags(node_argv(HostNode("md2", "10.2.0.62", "b", 2.0, 0.0, 3000), "10.1.0.11", tmp_path))
    assert "--head" not in md and md["--address"] == f"10.1.0.11:{GCS_PORT}"
    assert md["--labels"] == "pddlab/cluster=b,pddlab/host=md2"
    assert md["--num-cpus"] == "2" and md["--memory"] == str(3000 << 20) and md["--num-gpus"] == "0"


def test_the_runtime_needs_exactly_one_head_host(tmp_path):
    with pytest.raises(RayRuntimeError, match="exactly one node in host 'router'"):
        RayHostRuntime([HostNode("p1", "10.1.0.21", "a")], tmp_path)
    rt = RayHostRuntime([HostNode("md1", "10.2.0.61", "b"), HostNode("router", "10.1.0.11", "a")], tmp_path)
    assert [n.host for n in rt.nodes] == ["router", "md1"] and rt.address == f"10.1.0.11:{GCS_PORT}"
    with pytest.raises(RayRuntimeError, match="not up"):
        rt.env()


def test_pool_needs_travel_to_the_driver_unchanged():
    needs = [pool_needs("router"), PoolNeeds("md", 2, "b", 1.5, labels={"zone": "in(z1, z2)"}, memory_mb=512)]
    assert needs_from_json(needs_to_json(needs)) == needs


class FakeRoles:
    """The driver's view of RayRoles (pure protocol test): exit codes, crashes, kill, stop."""

    def __init__(self):
        self.placed = {"p1": object(), "md1": object()}
        self.killed, self.stopped = [], False

    def exit_codes(self):
        return {"p1": None, "md1": 137 if self.killed else None}

    def crashes(self):
        return ["role md worker md1 on node x: exited with code 137"] if self.killed else []

    def kill(self, worker):
        self.killed.append(worker)
        return 4242

    def stop(self):
        self.stopped = True
        return {"p1": 0, "md1": 137}


def test_the_driver_answers_each_command_with_one_line_and_stops_at_the_end(capsys):
    roles = FakeRoles()
    assert serve(roles, iter(["poll\n", "kill md1\n", "kill nobody\n", "poll\n", "bogus\n", "stop\n", "poll\n"])) == 0
    answers = [json.loads(line[len(PREFIX) :]) for line in capsys.readouterr().out.splitlines()]
    assert answers[0] == {"ok": True, "exit": {"p1": None, "md1": None}, "crashes": []}
    assert answers[1] == {"ok": True, "pid": 4242} and answers[2] == {"ok": True, "pid": None}
    assert answers[3]["exit"]["md1"] == 137 and "exited with code 137" in answers[3]["crashes"][0]
    assert answers[4]["ok"] is False and "unknown command 'bogus'" in answers[4]["error"]
    assert answers[5] == {"ok": True, "exit": {"p1": 0, "md1": 137}} and len(answers) == 6  # nothing after stop
    assert roles.stopped and roles.killed == ["md1"]


def test_the_end_of_stdin_stops_the_roles_too(capsys):
    roles = FakeRoles()
    serve(roles, iter([]))
    assert roles.stopped


def test_the_reader_skips_lines_that_are_not_the_drivers_and_fails_at_the_end():
    lines = io.StringIO("2026 INFO ray: connected\n" + PREFIX + '{"ok": true}\n')
    assert read_reply(lines) == {"ok": True}
    with pytest.raises(RayRuntimeError, match="exited without answering"):
        read_reply(lines)
