"""A discrete-event simulator of the PDD pipeline (SimPy): the emulated run's specs, roles and summary, simulated."""
