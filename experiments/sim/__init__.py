"""A discrete-event simulator of the PDD pipeline (experiments.sim.clock: SimPy's order of events, a cheaper loop):
the emulated run's specs, roles and summary, simulated."""
