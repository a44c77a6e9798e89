"""Client helpers: wait for a worker's health, run one Generate call, read a worker's stats.

Responsible for: readiness by the gRPC health service (never a sleep) and a
typed result of a Generate stream (tests, benchmarks, experiments).
Not responsible for: anything a role does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from workers.proto import pdd_pb2, pdd_pb2_grpc

HEALTH_POLL_S = 0.1  # between health checks while a worker starts (it answers UNAVAILABLE until it listens)
# gRPC's reconnect backoff starts at 1 s and grows 1.6x: a worker that begins listening just after a failed
# connect would be seen up to seconds late. The health channel retries every 0.1-0.5 s instead (the roles
# start in ~3 s; pdd-smoke's role start fell from 21.7 to 14.4 s a run, four variants: benchmarks/bench_sweep.py).
HEALTH_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)


def wait_healthy(address: str, timeout_s: float = 60.0) -> None:
    """Return once address's health service says SERVING; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with grpc.insecure_channel(address, options=HEALTH_CHANNEL_OPTIONS) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0, wait_for_ready=True)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.RpcError as err:
                last = f"{err.code().name}: {err.details()}"
            time.sleep(HEALTH_POLL_S)
    raise TimeoutError(f"{address} not SERVING after {timeout_s} s (last: {last})")


@dataclass(frozen=True)
class Generation:
    """tokens: in stream order; done: the router's summary; wall_ns: call duration"""

    tokens: tuple[pdd_pb2.Token, ...]
    done: pdd_pb2.GenerateDone | None
    wall_ns: int

    @property
    def ids(self) -> list[int]:
        return [t.token for t in self.tokens]

    @property
    def workers(self) -> list[str]:
        return [t.worker for t in self.tokens]


def generate(
    channel: grpc.Channel,
    prompt: list[int],
    max_tokens: int,
    mode: str = "",
    handoff: str = "",
    request_id: str = "",
    timeout_s: float = 120.0,
) -> Generation:
    """One Generate call to the end; raises grpc.RpcError on a failed status."""
    t0 = time.monotonic_ns()
    stub = pdd_pb2_grpc.RouterStub(channel)
    tokens, done = [], None
    for ev in stub.Generate(
        pdd_pb2.GenerateRequest(
            request_id=request_id, prompt_tokens=prompt, max_tokens=max_tokens, mode=mode, handoff=handoff
        ),
        timeout=timeout_s,
    ):
        if ev.WhichOneof("kind") == "token":
            tokens.append(ev.token)
        else:
            done = ev.done
    return Generation(tuple(tokens), done, time.monotonic_ns() - t0)


def stats(address: str) -> pdd_pb2.StatsReply:
    with grpc.insecure_channel(address) as ch:
        return pdd_pb2_grpc.WorkerStub(ch).Stats(pdd_pb2.StatsRequest(), timeout=5.0)
