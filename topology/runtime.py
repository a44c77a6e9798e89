"""Where an end host's processes run: the seam between the topology and a container runtime.

Responsible for: the `HostRuntime` protocol the Testbed calls (start and stop
with the testbed, extra Mininet host parameters per role, the argv that runs a
process "in" a host, a crash check, metadata) and its default,
`ProcessRuntime`: plain processes in the hosts' network namespaces.
Not responsible for: any container engine or cluster manager —
`docker_rt.host.DockerRuntime` and `ray_rt.netns.RayHostRuntime` (Ray nodes
in the hosts, started in `up`) implement this protocol, and the caller (experiments/run/deploy.py, a test)
passes it in through `TopologyConfig.runtime`. The topology imports nothing
above itself, as Mininet's `net.py` never imports the Host flavours a caller
picks.
"""

from __future__ import annotations

from typing import Protocol


class HostRuntime(Protocol):
    """What a Testbed needs from a runtime; every method is called by the Testbed alone."""

    name: str  # process | docker | ...: recorded in metadata.json

    def start(self) -> None: ...  # before the hosts exist; raise with what to do when it cannot run

    def up(self, testbed) -> None: ...  # the hosts exist and reach each other: start what runs beside the roles

    def down(self) -> None: ...  # first at teardown, before the testbed ends its processes: undo up()

    def stop(self) -> None: ...  # at teardown: remove everything it made, by its own ids

    def check(self) -> None: ...  # raise naming the host and why, if a worker it runs died

    def host_params(self, host: str, role: str) -> dict: ...  # extra `Mininet.addHost` parameters ({}: a plain host)

    def exec_argv(self, host: str, argv: list[str]) -> list[str] | None: ...  # None: run in the host's namespaces

    def confine(self, argv: list[str], cpuset: str) -> list[str]: ...  # argv kept to cpuset's cores ("": any)

    def reap(self, host: str) -> None: ...  # a host's process was killed: end what of it the runtime still runs

    def metadata(self) -> dict | None: ...  # how it ran, for metadata.json


class ProcessRuntime:
    """Plain processes in the hosts' namespaces (mnexec): nothing to start, stop or check."""

    name = "process"

    def start(self) -> None:
        pass

    def up(self, testbed) -> None:
        pass

    def down(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def check(self) -> None:
        pass

    def host_params(self, host: str, role: str) -> dict:
        return {}

    def exec_argv(self, host: str, argv: list[str]) -> list[str] | None:
        return None

    def confine(self, argv: list[str], cpuset: str) -> list[str]:
        """A process's own cores: taskset, the only confinement a plain process has."""
        return ["taskset", "-c", cpuset, *argv] if cpuset else argv

    def reap(self, host: str) -> None:
        pass

    def metadata(self) -> dict | None:
        return None
