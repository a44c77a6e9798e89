"""Modelled compute: accelerators and model architectures from catalogues, a roofline, and an engine that waits.

Responsible for: `catalogue` (accelerators and models from YAML, with sources), `roofline` (a step's time on an
accelerator), `kvstore` (block bookkeeping and deterministic KV blobs of the architecture's size, no KV tensors)
and `engine` (`ModelledEngine`, the real Engine's interface, sleeping the roofline's time instead of computing).
Not responsible for: choosing modelled or real compute (the roles' config) or the network.
"""
