"""Registries of named YAML files (netem_profiles/, experiments/topologies/): one found by name or path, read.

Responsible for: a name's file in its folder (the valid names listed on a miss, as Mininet's `mn` lists its
TOPOS), a path's existence, and the YAML read with its problem in one line.
Not responsible for: what a file holds (topology.profiles and topology.topofile validate it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

T = TypeVar("T")


def names(directory: Path) -> list[str]:
    """The names of a registry's files (file names without .yaml), sorted."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def read(name_or_path: str | Path, directory: Path, what: str, error: type[Exception]) -> tuple[Path, Any]:
    """(the file, its YAML data) of a registry name (directory/<name>.yaml) or a .yaml/.yml path; a miss, a
    missing file or bad YAML raises error(one line) naming the file or the valid names."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = directory / f"{name_or_path}.yaml"
        if not path.exists():
            raise error(f"unknown {what} {str(name_or_path)!r}; available: {', '.join(names(directory))}")
    if not path.exists():
        raise error(f"{path}: no such {what} file")
    try:
        return path, yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # PyYAML's own message spans several lines
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise error(f"{path}: not valid YAML: {getattr(exc, 'problem', None) or exc}{at}") from None


def load(
    name_or_path: str | Path, directory: Path, what: str, error: type[Exception], parse: Callable[[Any, str, Path], T]
) -> T:
    """A registry file read and parsed: parse(data, the file's name for errors, the file); the object's `name`
    must equal the file name without .yaml."""
    path, data = read(name_or_path, directory, what, error)
    loaded = parse(data, str(path), path)
    if loaded.name != path.stem:
        raise error(f"{path}: name {loaded.name!r} must equal the file name {path.stem!r}")
    return loaded
