"""Ray runtime, its pure part: the workers' ports are distinct even when two actors are handed the same one."""

import pytest

from ray_rt import RayRuntimeError
from ray_rt.roles import distinct_ports


def ep(grpc: int, kv: int, ip: str = "127.0.0.1") -> dict:
    return {"ip": ip, "grpc_port": grpc, "kv_port": kv}


def test_a_worker_handed_a_port_already_taken_is_asked_again():
    fresh = iter([ep(5002, 5001), ep(6000, 6001)])  # the first retry still collides (kv 5001 is p1's)
    asked = []

    def again(worker):
        asked.append(worker)
        return next(fresh)

    got = distinct_ports({"p1": ep(5000, 5001), "md1": ep(5000, 5003), "rld1": ep(5004, 5005)}, again)
    assert asked == ["md1", "md1"]
    assert got["md1"] == ep(6000, 6001) and got["p1"] == ep(5000, 5001) and got["rld1"] == ep(5004, 5005)
    ports = [(e["ip"], e[k]) for e in got.values() for k in ("grpc_port", "kv_port")]
    assert len(ports) == len(set(ports))


def test_the_same_port_on_two_nodes_is_no_collision():
    got = distinct_ports({"p1": ep(5000, 5001, "10.0.0.1"), "md1": ep(5000, 5001, "10.0.0.2")}, lambda w: 1 / 0)
    assert got["md1"]["ip"] == "10.0.0.2"


def test_a_worker_that_never_gets_distinct_ports_is_a_clear_error():
    with pytest.raises(RayRuntimeError, match="md1: no ports distinct"):
        distinct_ports({"p1": ep(5000, 5001), "md1": ep(5000, 5003)}, lambda w: ep(5001, 5009), tries=3)
