"""gRPC server plumbing shared by every role: lifecycle, health, stats, engine construction.

Responsible for: building a worker's engine (one torch thread) and event log
from the config; a gRPC server with the standard health service (SERVING only
once the role is ready, NOT_SERVING while stopping) and the `Worker.Stats`
service; serving until SIGTERM/SIGINT and then stopping gracefully; mapping
engine errors to gRPC status codes; a role process's last event, `role_cpu`:
the CPU time it used (written once it stopped, so a SIGKILLed role has none).
Not responsible for: what a role does (prefill, decode, router modules).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import os
import resource
import signal
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from workers.engine import Engine
from workers.fairlock import FairLock
from workers.errors import (
    BadRequest,
    BadRequestState,
    CapacityExceeded,
    DuplicateRequest,
    EngineError,
    KVImportError,
    QueueFull,
    UnknownRequest,
)
from workers.kvwire import count_socket_fds
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import DeploymentConfig, WorkerConfig, load_config
from workers.roles.events import EventLog

log = logging.getLogger(__name__)

STOP_GRACE_S = 2.0


def grpc_options(cfg: DeploymentConfig) -> list[tuple[str, int]]:
    """Channel/server options: message limits from the config (larger requests get RESOURCE_EXHAUSTED)."""
    return [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        # a peer that restarts is reachable again within a second (gRPC's default backoff grows to 120 s,
        # failing every call on the channel meanwhile). Not grpc.min_reconnect_backoff_ms: gRPC takes it
        # as the connect timeout too, and a connection across the WAN needs its round trips.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


class Channels:
    """A role's gRPC channels to its peers, one per address, connecting from the moment they are named.

    `get` creates a channel and starts its connection at once (grpc.channel_ready_future), so the first
    RPC on it does not pay TCP and HTTP/2 setup (several round trips: across the WAN, tens of ms);
    `warm` names peers ahead of their first use (a decode session names its relay or MD when it opens;
    not at start-up, when a peer may still be starting and would leave the channel in backoff)."""

    def __init__(self, cfg: DeploymentConfig):
        self.cfg = cfg
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = grpc.insecure_channel(address, options=grpc_options(self.cfg))
                grpc.channel_ready_future(ch)  # starts connecting; nobody waits on it
            return ch

    def warm(self, *addresses: str) -> None:
        for address in addresses:
            if address:
                self.get(address)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()


def status_of(err: EngineError) -> grpc.StatusCode:
    """The gRPC status that describes an engine error."""
    if isinstance(err, DuplicateRequest):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(err, BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(err, UnknownRequest):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(err, (CapacityExceeded, QueueFull)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(err, (BadRequestState, KVImportError)):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


class DeviceUnavailable(RuntimeError):
    """A worker's config asks for a device this process cannot use."""


def check_device(worker: WorkerConfig) -> None:
    """Raise DeviceUnavailable, naming the worker and this torch build, if its device is not usable here."""
    if worker.device == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceUnavailable(
            f"worker {worker.name}: device cuda, but torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, {build}); run it where a GPU and CUDA torch are, or give its pool device: cpu"
        )


def build_engine(cfg: DeploymentConfig, worker: WorkerConfig, prefix_cache: bool) -> Engine:
    """This worker's engine on its device (cpu unless the config says cuda) with its `threads` torch threads
    (one by default: workers share cores)."""
    if cfg.compute.mode == "modelled":
        return build_modelled_engine(cfg, worker, prefix_cache)
    check_device(worker)
    torch.set_num_threads(worker.threads)
    return Engine(
        cfg.model,
        seed=cfg.seed,
        capacity_tokens=worker.capacity_tokens,
        block_size=cfg.block_size,
        device=worker.device,
        prefix_cache=prefix_cache,
        weights_dir=Path(cfg.weights_dir) if cfg.weights_dir else None,
    )


def build_modelled_engine(cfg: DeploymentConfig, worker: WorkerConfig, prefix_cache: bool) -> Engine:
    """compute.mode modelled: an engine that waits the roofline's time of compute.arch on the worker's
    accelerator instead of computing (its tokens in the small model's vocabulary, so the workload's prompts
    and the tokenizer stay as they are)."""
    from workers.model import get_config
    from workers.modelled.engine import ModelledEngine
    from workers.roles.config import catalogue

    cat = catalogue(cfg)
    return ModelledEngine(
        cat.model(cfg.compute.arch),
        cat.accelerator(worker.accelerator),
        devices=worker.devices,
        capacity_tokens=worker.capacity_tokens,
        block_size=cfg.block_size,
        prefix_cache=prefix_cache,
        vocab_size=get_config(cfg.model).vocab_size,
        kv_scale=cfg.compute.kv_scale,
    )


def event_log(cfg: DeploymentConfig, worker: WorkerConfig, role: str) -> EventLog:
    return EventLog(Path(cfg.events_dir) / f"{worker.name}.jsonl", worker.name, role)


@dataclass
class StatsSource:
    """Callables a role provides for Worker.Stats."""

    open_requests: Callable[[], int] = lambda: 0
    blocks: Callable[[], tuple[int, int]] = lambda: (0, 0)
    active_transfers: Callable[[], int] = lambda: 0
    sessions: Callable[[], int] = lambda: 0


def role_threads() -> int:
    """Live threads other than the gRPC server pool's (which grows on demand and is bounded by grpc_threads)."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith("grpc-"))


class WorkerServicer(pdd_pb2_grpc.WorkerServicer):
    def __init__(self, worker: str, role: str, source: StatsSource):
        self.worker, self.role, self.source = worker, role, source

    def Stats(self, request, context):
        free, total = self.source.blocks()
        return pdd_pb2.StatsReply(
            worker=self.worker,
            role=self.role,
            open_requests=self.source.open_requests(),
            free_blocks=free,
            total_blocks=total,
            active_transfers=self.source.active_transfers(),
            threads=role_threads(),
            sockets=count_socket_fds(),
            sessions=self.source.sessions(),
        )


def engine_stats(
    engine: Engine, lock: FairLock | threading.Lock
) -> tuple[Callable[[], int], Callable[[], tuple[int, int]]]:
    """Stats callables over an engine guarded by lock."""

    def open_requests() -> int:
        with lock:
            return len(engine.open_requests)

    def blocks() -> tuple[int, int]:
        with lock:
            return engine.available_blocks(), engine.kv.num_blocks

    return open_requests, blocks


def max_concurrent_rpcs(cfg: DeploymentConfig) -> int:
    """The calls a worker takes at once: one per server thread (grpc_threads, the knob). Past it a call is refused
    with RESOURCE_EXHAUSTED at once, instead of waiting, unbounded, for a thread behind streams that hold theirs
    for a whole request; the caller (the router, the front door: HTTP 429) sees the overload."""
    return cfg.grpc_threads


class RoleServer:
    """A started gRPC server for one worker; a context manager that stops it.

    cfg: the deployment; worker: this worker; role: router | p | rld | md
    register: adds the role's servicers to the server
    stats: what Worker.Stats reports
    on_stop: releases the role's own resources (KV listener, event log) after the server stopped
    engine: the worker's engine (P, RLD, MD; None: the router): a modelled one's pace goes into role_cpu
    """

    def __init__(
        self,
        cfg: DeploymentConfig,
        worker: WorkerConfig,
        role: str,
        register: Callable[[grpc.Server], None],
        stats: StatsSource,
        on_stop: Callable[[], None] = lambda: None,
        engine: Engine | None = None,
    ):
        self.worker, self.role, self.on_stop, self.engine = worker, role, on_stop, engine
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.grpc_threads, thread_name_prefix=f"grpc-{worker.name}"),
            options=grpc_options(cfg),
            maximum_concurrent_rpcs=max_concurrent_rpcs(cfg),
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        pdd_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(worker.name, role, stats), self.server)
        register(self.server)
        self.port = self.server.add_insecure_port(worker.grpc_address)
        if self.port == 0:
            raise OSError(f"{worker.name}: cannot listen on {worker.grpc_address}")

    def start(self) -> RoleServer:
        self.server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info("%s (%s) serving on %s", self.worker.name, self.role, self.worker.grpc_address)
        return self

    def stop(self) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(STOP_GRACE_S).wait()
        self.on_stop()
        log.info("%s stopped", self.worker.name)

    def __enter__(self) -> RoleServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
BIG_BLOCK_BYTES = 1 << 20


def give_big_blocks_back() -> bool:
    """Keep every heap block of BIG_BLOCK_BYTES or more in its own mapping, unmapped when freed.

    glibc raises its mmap threshold to the size of each big block freed (up to 32 MiB); from then on
    blocks of a KV layer's size (MBs: layer copies, activations) come from its arenas, which fragment as
    a session's prompts grow turn after turn. P's memory grew by ~40 MB per request in the default
    experiment until its container's 2 GiB limit killed it. A fixed threshold also turns the dynamic
    one off. False where the C library has no mallopt (not glibc)."""
    try:
        return ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, BIG_BLOCK_BYTES) == 1
    except (OSError, AttributeError):
        return False


def role_main(
    role: str,
    build: Callable[[DeploymentConfig, WorkerConfig], RoleServer],
    default_worker: str,
    argv: list[str] | None = None,
) -> int:
    """Command line of a role: --config FILE [--worker NAME]; serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=f"PDD {role} worker")
    parser.add_argument("--config", required=True, help="deployment YAML (workers/roles/config.py)")
    parser.add_argument("--worker", help=f"worker name in the config (default: the {default_worker} entry)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s %(levelname)s {role} %(name)s: %(message)s")
    cfg = load_config(args.config)
    worker = cfg.worker(args.worker) if args.worker else cfg.pool(default_worker)[0]
    if not give_big_blocks_back():
        logging.getLogger(__name__).warning("mallopt unavailable: freed KV-sized blocks may stay in the heap")
    faulthandler.enable()  # a native crash (SIGSEGV, SIGABRT) prints every thread's Python stack to the log
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with build(cfg, worker) as server:
        serving = cpu_now()
        stop.wait()
    pace = getattr(server.engine, "pace", None)  # a modelled engine's (workers.modelled.engine)
    record_cpu(cfg, worker, serving, pace() if pace else {})
    exit_after_stop(0)
    return 0


@dataclass(frozen=True)
class CpuTimes:
    """This process's CPU time so far: user_s, system_s (s, every thread: getrusage RUSAGE_SELF); t_ns: when
    taken (time.monotonic_ns)."""

    user_s: float
    system_s: float
    t_ns: int

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s


def cpu_now() -> CpuTimes:
    """This process's CPU time now. RUSAGE_SELF is the role's own process under every runtime: a plain process,
    a container's, or under Ray the process its RoleHost actor starts (ray_rt/roles.py), not the actor."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return CpuTimes(ru.ru_utime, ru.ru_stime, time.monotonic_ns())


def process_age_s() -> float | None:
    """Seconds since this process started (its /proc/self/stat starttime against CLOCK_BOOTTIME, the clock that
    starttime counts on), so interpreter start and imports count; None where /proc cannot say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5); fields[0] is field 3
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_s
    except (OSError, IndexError, ValueError, AttributeError):
        return None


def cpu_fields(serving: CpuTimes, end: CpuTimes, age_s: float | None) -> dict[str, float | None]:
    """The role_cpu event's fields (s): user_s, system_s and cpu_s (their sum) over the whole process;
    startup_cpu_s: before it served (interpreter, imports, engine and weights); serving_cpu_s: from serving to
    the end of its stop; wall_s: the process's age; serving_wall_s: from serving to the end."""
    return {
        "user_s": round(end.user_s, 3),
        "system_s": round(end.system_s, 3),
        "cpu_s": round(end.cpu_s, 3),
        "startup_cpu_s": round(serving.cpu_s, 3),
        "serving_cpu_s": round(end.cpu_s - serving.cpu_s, 3),
        "wall_s": None if age_s is None else round(age_s, 3),
        "serving_wall_s": round((end.t_ns - serving.t_ns) / 1e9, 3),
    }


def record_cpu(cfg: DeploymentConfig, worker: WorkerConfig, serving: CpuTimes, pace: dict | None = None) -> None:
    """Append role_cpu, the process's CPU time (and a modelled engine's pace: ModelledEngine.pace), to the
    worker's event log, once its server stopped and its role closed the log: the last line. A role killed by
    SIGKILL never gets here: the analysis counts it missing."""
    try:
        events = event_log(cfg, worker, cfg.role_of(worker.name))
        events.emit("role_cpu", **cpu_fields(serving, cpu_now(), process_age_s()), **(pace or {}))
        events.close()
    except OSError as err:
        log.warning("%s: role_cpu not recorded: %s", worker.name, err)


def exit_after_stop(code: int) -> None:
    """End the process now that the server stopped and its files are closed, without the interpreter's
    finalization: daemon threads may still be inside native code then (a KV sender or a DRC call blocked on a
    WAN that died; a torch kernel), and the C++ runtimes' static destructors under them abort the process
    ("terminate called without an active exception", exit -6: P once in the faults tier after its emulator
    was killed) — a clean stop reported as a crash. Logs and stdio are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
