"""The runtimes a spec can name (`runtime:`), as objects: what the rest of the code asks of each.

Responsible for: `RuntimeKind` (per runtime: whether its workers run in containers on this machine's NVIDIA
GPUs, whether it puts a Ray node in every host, whether it can run on an existing Ray cluster) and `KINDS`,
the one place a `runtime:` value becomes its kind (`kind_of`): validation, placement and the run floor's
launchers (experiments.run.deploy.LAUNCHERS, keyed by the kind's name) ask the kind, never the name.
Not responsible for: starting anything (experiments.run.deploy), or the checks themselves
(experiments.spec.placement, experiments.spec.experiment).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeKind:
    """One runtime.

    name: its `runtime:` value
    containers: its workers run in Docker containers (a cuda pool needs NVIDIA GPUs `nvidia-smi` lists and the
      cuda image), else as processes of this machine (a cuda pool needs this torch's CUDA)
    ray_nodes: a Ray node runs in every host of the emulated topology (its memory counts beside the workers; its
      placement is checked against those nodes before anything starts)
    on_cluster: it can run on an existing Ray cluster (cluster.address)
    """

    name: str
    containers: bool = False
    ray_nodes: bool = False
    on_cluster: bool = False


KINDS = {
    k.name: k
    for k in (
        RuntimeKind("process"),
        RuntimeKind("docker", containers=True),
        RuntimeKind("ray", ray_nodes=True, on_cluster=True),
    )
}


def kind_of(spec) -> RuntimeKind:
    """The spec's runtime as its kind (spec.runtime is validated against KINDS at load)."""
    return KINDS[spec.runtime]
