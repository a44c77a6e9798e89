"""Running: a spec becomes a topology, the roles in its hosts, a load, a run directory (and then its analysis).

The runner, the deployment of the roles under a runtime, each variant's window (schedule, cross traffic,
faults), the load generator, the link calibration and sweeps.
"""
