"""A role process gives freed KV-sized blocks back to the OS (workers/roles/server.give_big_blocks_back).

Each case runs in a fresh interpreter (the allocator's state is per process): 64 blocks of ~4 MiB with
small live allocations between them are freed; without the setting glibc keeps them in its heap.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
import numpy as np
from workers.roles.server import give_big_blocks_back
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
if sys.argv[1] == "on":
    assert give_big_blocks_back()
first = np.ones(4 << 20, np.uint8)
del first                      # glibc's dynamic threshold rises to 4 MiB
base = rss_mb()
big, small = [], []
for i in range(64):
    big.append(np.ones((4 << 20) - 4096 * (i % 3), np.uint8))
    small.append(np.ones(200_000, np.uint8))   # kept: pins the heap between the big blocks
del big
print(rss_mb() - base)
"""


def _retained_mb(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return float(out.stdout.strip())


def test_freed_big_blocks_leave_the_process():
    assert _retained_mb("off") > 128  # the fragmentation this guards against, still there
    assert _retained_mb("on") < 40  # 64 x 4 MiB freed: only the small blocks remain
