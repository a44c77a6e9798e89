"""Where the workers' generated files live: `$PDDLAB_CACHE_DIR`, else `<repo>/.cache` (the image sets /cache).

Responsible for: that one convention (weights under `weights/`), importable without torch, so the
Docker runtime mounts the directory the model writes to.
Not responsible for: what is in it (`workers.model` writes the weights).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """$PDDLAB_CACHE_DIR, else <repo>/.cache."""
    root = os.environ.get("PDDLAB_CACHE_DIR")
    return Path(root) if root else REPO_ROOT / ".cache"


def weights_dir() -> Path:
    """Where the model's deterministic weights are written and read: <cache>/weights."""
    return cache_dir() / "weights"
