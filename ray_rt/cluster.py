"""An existing Ray cluster: reach it, or say plainly that it cannot be reached, before anything starts.

Responsible for: `connect(address)`: a TCP check of the address first (an unreachable head is one clear
error at once, where `ray.init` would retry for a long while), then `ray.init` with the driver's output kept
out of the run's logs.
Not responsible for: starting a cluster (`ray_rt.local` on this machine; `ray start` on real hosts) or placing
anything on it (`ray_rt.placement`, `ray_rt.roles`).
"""

from __future__ import annotations

import logging
import socket

from ray_rt import RayRuntimeError

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT or ray://HOST:PORT; RayRuntimeError on anything else."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayRuntimeError(f"Ray cluster address {address!r}: expected HOST:PORT or ray://HOST:PORT")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """RayRuntimeError naming the address and the reason when nothing accepts a TCP connection there."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        raise RayRuntimeError(
            f"cannot reach the Ray cluster at {address}: {err.strerror or err} (is its head running, "
            f"`ray start --head --port {port}`, and is {host}:{port} reachable from here?); nothing was started"
        ) from None


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connect this process to the Ray cluster at address as its driver."""
    import ray

    check_reachable(address, timeout_s)
    log.info("connecting to the Ray cluster at %s", address)
    ray.init(address=address, log_to_driver=False)
