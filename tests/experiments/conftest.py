"""Pure tests of the serving experiment (no root, no topology): specs, workload, analysis."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # fake_run next to this file
