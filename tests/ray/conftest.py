"""Fixtures of the Ray tier: a two-node Ray cluster on loopback (site a: the head, site b), once per module.

Needs the ray package (`pip install -e '.[ray]'`, `make test-ray`) and nothing else: no root, no topology, no
namespace; Ray listens on 127.0.0.1 only (ray_rt.local). Every process it starts is stopped by the fixture
and checked gone by PID.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the loopback deployment's harness

pytest.importorskip("ray", reason="needs the ray package: pip install -e '.[ray]' (make test-ray installs it)")

from ray_rt.local import LocalNode, LocalRayCluster  # noqa: E402

# Site a holds the router (0.5 CPU), P and RLD (1 each); site b the MD (1).
NODES = (LocalNode("a", num_cpus=3.0), LocalNode("b", num_cpus=2.0))


@pytest.fixture(scope="module")
def cluster():
    c = LocalRayCluster(NODES).start()
    try:
        yield c
    finally:
        c.stop()
