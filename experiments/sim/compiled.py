"""The simulator's compiled build: its hot modules compiled ahead of time by Cython, the .py files staying the source.

Responsible for: which modules are compiled (`MODULES`), building them in place (`main(["build"])`, which `make
setup` runs when a source changed, as does `make sim-compiled`; `check` says whether the build is there and current),
and, at the package's import (experiments/sim/__init__.py), loading from its .py every module whose build is
missing, stale (its source changed since the build: its sha256 differs from the one the build recorded) or switched
off (PDDLAB_SIM_PURE=1). A build is optional: without one (no Cython, no compiler, another Python) the same modules run
as pure Python, slower.
Not responsible for: what is simulated (the modules themselves).

Why (issue 30: the published deployment at >= 10,000 requests simulated per second): after the event loop and the
arithmetic were cut down (docs/simulator.md, "Scale"), what was left was the interpreter's cost spread over every
function (no function above 8% of a profile). Cython compiles the modules as they are (pure-Python mode; annotations
are not taken as C types, `annotation_typing=False`, so an int stays an int and every number a Python object): the
same operations on the same Python floats in the same order, without the bytecode loop (bench_sim's pd-cross and
pdd: ~1.5x). The records are byte-identical compiled and pure (tests/unit/test_sim_compiled.py runs bench_sim both
ways and compares the records' sha256).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "experiments.sim"
HERE = Path(__file__).resolve().parent
MODULES = ("clock", "wan", "workers", "kvroom", "pipeline", "record")  # what a published-scale run spends its time in
MANIFEST = HERE / "compiled.json"  # the build's record: Cython's version, the Python it is for, each source's sha256
PURE_ENV = "PDDLAB_SIM_PURE"  # set (not "" or "0"): every module from its .py, whatever is built
DIRECTIVES = {"language_level": 3, "annotation_typing": False}  # Python's semantics: no C types from annotations


def source_sha256(module: str) -> str:
    return hashlib.sha256((HERE / f"{module}.py").read_bytes()).hexdigest()


def extension_of(module: str) -> Path | None:
    """The module's compiled file for this Python, if there is one."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (path := HERE / f"{module}{suffix}").exists():
            return path
    return None


def read_manifest() -> dict[str, str]:
    """module -> the sha256 of the source it was built from ({} without a build, or one for another Python)."""
    try:
        data = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("modules", {}) if data.get("cache_tag") == sys.implementation.cache_tag else {}


def sources_to_load(built: dict[str, str], sources: dict[str, str], pure: bool) -> dict[str, str]:
    """Modules to load from their .py, each with why: every one when pure; else each without a build, or whose
    source is not the one built (built, sources: module -> sha256; a module built is one with its compiled file)."""
    if pure:
        return {m: f"{PURE_ENV} is set" for m in sources}
    return {
        m: "not built" if m not in built else "stale: its source changed since the build"
        for m, sha in sources.items()
        if built.get(m) != sha
    }


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the named modules of this package at their .py (the path finder would take a compiled file first)."""

    def __init__(self, modules: set[str]):
        self.names = {f"{PACKAGE}.{m}" for m in modules}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{fullname.rpartition('.')[2]}.py")


def install_guard() -> None:
    """Where a module has a compiled file that must not be used (switched off or stale), load its .py instead."""
    present = [m for m in MODULES if extension_of(m) is not None]
    if not present:
        return  # nothing compiled: the .py files load as usual
    built = {m: sha for m, sha in read_manifest().items() if m in present}
    pure = os.environ.get(PURE_ENV, "") not in ("", "0")
    skip = sources_to_load(built, {m: source_sha256(m) for m in present}, pure)
    for module, why in skip.items():
        if not pure:
            log.warning("%s.%s: its compiled build is not used (%s); make setup builds it again", PACKAGE, module, why)
    if skip:
        sys.meta_path.insert(0, _SourceFinder(set(skip)))


def loaded() -> list[str]:
    """The modules of MODULES imported now from their compiled file."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    mods = (sys.modules.get(f"{PACKAGE}.{m}") for m in MODULES)
    return [m.__name__.rpartition(".")[2] for m in mods if m is not None and (m.__file__ or "").endswith(suffixes)]


def current() -> bool:
    """Every module of MODULES has a compiled file built from its source as it is now."""
    built = read_manifest()
    return all(extension_of(m) is not None and built.get(m) == source_sha256(m) for m in MODULES)


def build() -> None:
    """Compile MODULES in place (their compiled files beside the .py, the C sources in a temporary folder), then
    record the sources built. Raises what Cython or the compiler raised, leaving no compiled file (the old ones
    are removed first: unlinked, not overwritten, so a simulation running on them keeps its mapping)."""
    from Cython import __version__ as cython_version  # only the build needs Cython
    from Cython.Build import cythonize
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    shas = {m: source_sha256(m) for m in MODULES}
    clean()
    root = HERE.parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(root)  # build_ext --inplace writes each module under its package's folder from here
        try:
            sources = [str(Path(*PACKAGE.split("."), f"{m}.py")) for m in MODULES]
            exts = cythonize(sources, compiler_directives=DIRECTIVES, build_dir=tmp, quiet=True, nthreads=0)
            cmd = build_ext(Distribution({"ext_modules": exts}))
            cmd.inplace, cmd.build_temp = True, str(Path(tmp) / "obj")
            cmd.ensure_finalized()
            cmd.run()
        except BaseException:
            clean()  # what was compiled before the failure: no partial build
            raise
        finally:
            os.chdir(cwd)
    manifest = {"cython": cython_version, "cache_tag": sys.implementation.cache_tag, "modules": shas}
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


def clean() -> None:
    """Remove the compiled files and the record: every module runs from its .py."""
    for m in MODULES:
        while (path := extension_of(m)) is not None:
            path.unlink()
    MANIFEST.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """build | check | clean; check exits 1 when the build is missing or stale."""
    cmd = (argv if argv is not None else sys.argv[1:] or ["check"])[0]
    if cmd == "build":
        build()
        print(f"{PACKAGE}: compiled {', '.join(MODULES)} (Cython)")
    elif cmd == "clean":
        clean()
    elif cmd == "check":
        ok = current()
        print(f"{PACKAGE}: compiled build {'current' if ok else 'missing or stale'}")
        return 0 if ok else 1
    else:
        print(f"usage: main([build|check|clean]) of {__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
