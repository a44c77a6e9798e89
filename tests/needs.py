"""What the root tiers need from the machine, checked once for all of them (tests/conftest.py for the
topology tiers, tests/docker/conftest.py for Docker): a reason to skip, or None."""

import os
import shutil


def missing(what: str, tools: tuple[str, ...]) -> str | None:
    """Why `what` cannot run here (root, Mininet's library, a tool of tools), or None."""
    if os.geteuid() != 0:
        return f"{what} need root"
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return "Mininet's Python library is missing (make setup installs it)"
    for tool in tools:
        if not shutil.which(tool):
            return f"{tool} is missing (make setup installs it)"
    return None
