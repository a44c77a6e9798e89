"""Run directories: where a run writes everything, and how it records how it was made.

Responsible for: creating `results/<time>-<experiment>/`, writing JSON files,
reading a file's JSON back into a typed record (pydantic) with an error that
names the file and the field, and collecting provenance (git commit and dirty
flag, kernel, tool versions).
Not responsible for: what the experiment measures, or the records' layouts
(experiments.rundir.metadata: metadata.json; experiments.rundir.clientlog: client.jsonl).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
TOOLS = {
    "tc": ["tc", "-V"],
    "iperf3": ["iperf3", "--version"],
    "tcpdump": ["tcpdump", "--version"],
    "mininet": ["/usr/bin/python3", "-c", "import mininet.net; print(mininet.net.VERSION)"],
}


def new_run_dir(experiment: str, root: Path = RESULTS) -> Path:
    """A fresh `root/<YYYYmmdd-HHMMSS>-<experiment>/` (suffixed if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        path = root / (f"{stamp}-{experiment}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a run directory under {root}")


def write_json(path: Path, data: Any) -> None:
    """Write indented JSON atomically (temp file, then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


class RecordError(ValueError):
    """A run directory's file does not hold the record it should; the message names the file and the field."""


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any, where: str, error: type[RecordError] = RecordError) -> M:
    """data (decoded JSON) as model, or `error` naming `where` (a file, a file:line) and each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '(top level)'}: {e['msg']}" for e in err.errors()[:5]
        )
        raise error(f"{where}: {problems}") from None


def read_record(model: type[M], path: Path, error: type[RecordError] = RecordError) -> M:
    """A JSON file as model, or `error` naming the file: absent, not JSON, or a bad field."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except json.JSONDecodeError as err:
        raise error(f"{path}: not JSON ({err})") from None
    return parse(model, data, str(path), error)


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the repository (None outside a git checkout)."""
    commit = _first_line(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True)
    return {"commit": commit, "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


# Python packages whose versions decide what a run computes and measures (re-analysis needs to know them).
PACKAGES = ("torch", "numpy", "grpcio", "scipy", "scapy")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """name -> installed version (None: not installed), from the installed distributions' metadata."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it (None where it does not)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict[str, Any]:
    """The machine a run measured on: its CPU, how many cores, and how busy it was at the start (the 1, 5 and 15
    minute load averages: a loaded machine runs the emulator and the roles late)."""
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "load_average": list(os.getloadavg())}


SPEED_TIMEOUT_S = 120  # workers.speed takes ~2 s; a machine too loaded to finish it in this is recorded as None


def machine_speed() -> dict[str, Any] | None:
    """The machine's reference speed now (workers.speed: a fixed forward pass of the small model, timed), with the
    load average beside it; measured in a process of its own (one torch thread, nothing of this process's state).
    None, logged, where it cannot be measured: a run does not fail for its record."""
    argv = [sys.executable, "-m", "workers.speed"]
    log.info("measuring the machine's reference speed: %s", " ".join(argv))
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=SPEED_TIMEOUT_S, check=True)
        return json.loads(done.stdout) | {"load_average": list(os.getloadavg())}
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        log.warning("the machine's reference speed was not measured: %s", exc)
        return None


def provenance(speed: bool = False) -> dict[str, Any]:
    """How and where this run was made; speed: with the machine's reference speed (machine_speed, ~2 s)."""
    return {
        "git": git_state(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "hostname": platform.node(),
        "argv": sys.argv,
        "tools": {name: _first_line(argv) for name, argv in TOOLS.items()},
        "packages": package_versions(),
        "machine": machine() | ({"speed": machine_speed()} if speed else {}),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
