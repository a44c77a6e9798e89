"""The simulator's compiled build (experiments/sim/compiled.py): the same records compiled and as pure Python, and
which modules load from their .py (a build switched off, missing or stale)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.sim import compiled

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 2000  # bench_sim's deployment at 2,000 requests: every path of the three variants, ~1 s a run


def bench(pure: bool) -> tuple[str, dict[str, str]]:
    """bench_sim in a fresh interpreter: what it says it ran (compiled or pure) and each variant's records' sha256."""
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/bench_sim.py"), "--requests", str(REQUESTS), "--hash"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=ROOT,
    ).stdout
    ran = re.search(r"^simulator: (.*)$", out, re.M).group(1)
    return ran, dict(re.findall(r"^(\S+)\s+records sha256 (\w+)$", out, re.M))


@pytest.mark.skipif(not compiled.current(), reason="no current compiled build (make setup builds it: needs Cython)")
def test_compiled_and_pure_write_the_same_records():
    compiled_ran, compiled_hashes = bench(pure=False)
    pure_ran, pure_hashes = bench(pure=True)
    assert compiled_ran == f"compiled (Cython): {', '.join(compiled.MODULES)}"
    assert pure_ran == "pure Python"
    assert set(pure_hashes) == {"pd-intra", "pd-cross", "pdd"}
    assert compiled_hashes == pure_hashes


def test_pure_loads_every_module_from_its_source():
    env = {**os.environ, compiled.PURE_ENV: "1"}
    code = "import experiments.sim.pipeline as p, experiments.sim.compiled as c; print(c.loaded(), p.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    assert out.stdout.split()[0] == "[]"
    assert out.stdout.strip().endswith("pipeline.py")


def test_sources_to_load_keeps_only_a_current_build():
    sources = {"clock": "a", "wan": "b", "pipeline": "c"}
    built = {"clock": "a", "wan": "old"}
    assert compiled.sources_to_load(built, sources, pure=False) == {
        "wan": "stale: its source changed since the build",
        "pipeline": "not built",
    }
    assert compiled.sources_to_load(sources, sources, pure=False) == {}
    assert set(compiled.sources_to_load(sources, sources, pure=True)) == set(sources)


def test_the_source_finder_serves_only_the_modules_it_names(tmp_path, monkeypatch):
    """A module sources_to_load named (stale, not built, switched off) is found at its .py; the others are left to
    the path finder (which takes a compiled file first)."""
    monkeypatch.setattr(compiled, "HERE", tmp_path)
    for m in ("clock", "wan"):
        (tmp_path / f"{m}.py").write_text(f"NAME = {m!r}\n")
    finder = compiled._SourceFinder({"wan"})
    spec = finder.find_spec(f"{compiled.PACKAGE}.wan")
    assert spec.origin == str(tmp_path / "wan.py")
    assert finder.find_spec(f"{compiled.PACKAGE}.clock") is None
