"""Docker workers for the emulated network, with no registry needed.

Modules, one concept each:

    engine   the Docker engine on this machine: install, start, answer; the docker SDK's client and the
             few docker CLI calls the SDK cannot make
    base     the base image, debootstrapped from the Debian mirror apt uses (or BASE_IMAGE)
    image    the one worker image for every role, rebuilt only when its inputs change
    host     Docker hosts in the Mininet topology: a holder container per host whose
             network namespace Mininet wires, and one container per process started there

Naming (written once here, derived everywhere):

    images      pddlab-base:<inputs hash 12>     pddlab-worker:<inputs hash 12>
    labels      pddlab.run=<run id>   pddlab.owner=<pid of the testbed process>
                pddlab.host=<Mininet host>   pddlab.kind=holder|proc
                pddlab.inputs=<full inputs hash> (images)
    containers  pddlab-<run id>-<host>            the holder of the host's namespaces
                pddlab-<run id>-<host>-<n>        the n-th process started on the host
    run id      <testbed pid>-<unix time>, so names never collide across runs

Containers are only ever removed by the testbed's labels; nothing else on the
host is touched.

This package is called `docker_rt`, not `docker`, so that it never shadows the
`docker` module of PyPI (the docker SDK), through which it reads and removes
what the engine holds; the CLI stays only where the SDK lacks something
(`docker_rt.engine` says which).
"""

from __future__ import annotations

LABEL_RUN = "pddlab.run"
LABEL_OWNER = "pddlab.owner"
LABEL_HOST = "pddlab.host"
LABEL_KIND = "pddlab.kind"
LABEL_INPUTS = "pddlab.inputs"
BASE_REPO = "pddlab-base"
WORKER_REPO = "pddlab-worker"
CONTAINER_PREFIX = "pddlab"


class DockerError(RuntimeError):
    """Docker cannot do what the testbed needs; the message says what to do."""

    __test__ = False


def holder_name(run_id: str, host: str) -> str:
    """The container that holds a Mininet host's namespaces."""
    return f"{CONTAINER_PREFIX}-{run_id}-{host}"


def proc_name(run_id: str, host: str, index: int) -> str:
    """The index-th process container started on a host (from 1)."""
    return f"{CONTAINER_PREFIX}-{run_id}-{host}-{index}"
