"""The PDD roles placed and supervised through Ray: across real machines, or Ray nodes on this one.

Modules:
- `placement` — pure: a spec's pools -> what each worker asks Ray for (resources, label selector), and the
  check of that against a cluster's nodes, refusing with the pool's name before anything starts.
- `cluster` — an existing Ray cluster: reached, or one clear error when it cannot be.
- `local` — a Ray cluster of several labelled nodes on this machine's loopback (the tests' cluster).
- `nodes` — tc netem and tcpdump on named interfaces of named nodes, and a run's work directory there.
- `ledger` — what a `--cluster` run changed on the nodes, kept on this machine for `pddlab clean --cluster`.
- `roles` — the roles as Ray actors: each runs its `python -m workers.roles.<module>` process on the node Ray
  picked, supervised (crash reports with the last log lines), its log and events brought back, torn down.

`ray` itself is an optional dependency (`pip install -e '.[ray]'`, pinned in pyproject.toml): `placement`
and `cluster` never import it, the others import it when they run.
"""


class RayRuntimeError(RuntimeError):
    """The Ray runtime cannot do what was asked; the message says what and, where it can, what to do."""
