"""Fixtures of the end-to-end tests: one real-process PDD deployment on loopback per module, a reference engine.

Needs nothing but loopback and the venv (no root); every process is started
and stopped by the fixture, by PID (tests/e2e/pdd_harness.py).
"""

import gc
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the harness modules next to this file

from pdd_harness import Deployment  # noqa: E402
from workers.engine import Engine, GenerationRequest  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("pdd"))
    try:
        yield d.start()
    finally:
        codes = d.stop()
        # a clean SIGTERM exit is 0; a role killed on purpose by a test is -9
        assert all(c in (0, -9) for c in codes.values()), f"role exit codes {codes}; logs in {d.run_dir}"


@pytest.fixture(scope="module")
def reference():
    """Colocated greedy reference: the same model and weights, one plain engine in this process."""
    engine = Engine("tiny", seed=0, capacity_tokens=4096, block_size=16, device="cpu", prefix_cache=False)

    def ref(prompt: list[int], max_tokens: int, rid: str = "ref") -> list[int]:
        return list(engine.generate(GenerationRequest(rid, tuple(prompt), max_tokens)).output_tokens)

    ref.engine = engine
    _freeze_heap()
    return ref


def _freeze_heap() -> None:
    """Keep what exists now out of every later garbage collection. The WAN proxy runs in this process: a
    full collection over the test process's objects (torch, the reference engine, every test module) held
    the GIL for 50-114 ms, stalling the proxy's threads, so a WAN copy arrived 100 ms late and the
    RLD (~1 token/ms) finished before the MD could take over."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap():
    _freeze_heap()
