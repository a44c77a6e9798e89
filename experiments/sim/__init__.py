"""A discrete-event simulator of the PDD pipeline (experiments.sim.clock: SimPy's order of events, a cheaper loop):
the emulated run's specs, roles and summary, simulated. Its hot modules may run compiled (experiments.sim.compiled:
an optional Cython build of the same .py files; a missing, stale or switched-off build runs them as Python)."""

from experiments.sim import compiled as _compiled

_compiled.install_guard()
