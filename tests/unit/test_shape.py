"""The codebase's shape, from its imports: layers only look down, no import cycle, no file over 600 lines.

Layers (a package may import only those below it): schema (the one validation approach) is under everything;
topology and workers are the bottom above it; docker_rt and ray_rt (the container and Ray runtimes) may use
both; experiments (and the VM harness's users) may use everything. Generated gRPC stubs are left out.

Inside experiments/, floors show the flow (a floor may import only those below it): the run directory's formats
(rundir) at the bottom, the spec's descriptions (spec) on it, the analysis of a run directory (analysis), running
(run), the interactive front ends (serve), and the command line (experiments/cli.py) on top. The analysis never
imports the run floor, so any run directory can be analysed again on its own.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schema", "topology", "workers", "experiments", "docker_rt", "ray_rt", "vm")
MAY_IMPORT = {
    "schema": set(),
    "topology": {"schema"},
    "workers": {"schema"},
    "vm": {"schema"},
    "docker_rt": {"schema", "topology", "workers"},
    "ray_rt": {"schema", "topology", "workers"},
    "experiments": {"schema", "topology", "workers", "docker_rt", "ray_rt", "vm"},
}
MAX_LINES = 600
FLOORS = ("rundir", "spec", "analysis", "run", "sim", "serve", "cli")  # bottom to top
LEAVES = {"experiments.progress"}  # utilities any floor may use; they import nothing of experiments/


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "proto" in path.relative_to(ROOT).parts:
                continue
            out[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return out


def imports_of(path: Path) -> set[str]:
    """Absolute imports of a module, whole module names (`from a.b import c` counts a.b and a.b.c)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def graph() -> dict[str, set[str]]:
    mods = modules()
    out = {}
    for name, path in mods.items():
        deps = set()
        for imp in imports_of(path):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                deps.add(imp)
        out[name] = deps
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(u, stack):
        state[u] = 1
        stack.append(u)
        for v in sorted(g.get(u, ())):
            if state.get(v) == 1:
                found.append(stack[stack.index(v) :] + [v])
            elif not state.get(v):
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for u in sorted(g):
        if not state.get(u):
            visit(u, [])
    return found


def test_layers_only_look_down():
    upward = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        for d in deps
        if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in MAY_IMPORT[m.split(".")[0]]
    ]
    assert not upward, upward


def floor_of(module: str) -> str | None:
    """experiments.<floor>.x -> floor; experiments/cli.py is a floor of its own; a leaf or the package: None."""
    parts = module.split(".")
    if parts[0] != "experiments" or len(parts) < 2 or module in LEAVES:
        return None
    assert parts[1] in FLOORS, f"{module} is in no floor of experiments/ (floors: {', '.join(FLOORS)})"
    return parts[1]


def floor_violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in g.items():
        if (floor := floor_of(m)) is None and m in LEAVES:
            bad += [f"leaf {m} imports {d}" for d in deps if d.startswith("experiments")]
        for d in deps:
            below = floor_of(d)
            if floor and below and FLOORS.index(below) > FLOORS.index(floor):
                bad.append(f"{m} ({floor}) imports {d} ({below})")
    return bad


def test_experiments_floors_only_look_down():
    assert not floor_violations(graph()), floor_violations(graph())


def test_every_experiments_module_is_in_a_floor():
    loose = {m for m, p in modules().items() if p.parent == ROOT / "experiments" and p.name != "__init__.py"}
    assert loose <= LEAVES | {"experiments.cli"}, loose - LEAVES - {"experiments.cli"}


def test_the_floor_check_finds_analysis_importing_run():
    g = {"experiments.analysis.metrics": {"experiments.run.runner"}, "experiments.run.runner": set()}
    assert floor_violations(g) == ["experiments.analysis.metrics (analysis) imports experiments.run.runner (run)"]


def test_no_import_cycle():
    assert not cycles(graph()), cycles(graph())


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("pkg", ["topology", "workers", "experiments", "ray_rt"])
def test_no_file_over_600_lines(pkg):
    big = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / pkg).rglob("*.py")
        if "proto" not in p.parts and (n := p.read_text().count("\n")) > MAX_LINES
    }
    assert not big, big


def data_plane_violations(g: dict[str, set[str]]) -> list[str]:
    """The KV data plane (workers.kvwire) sits below the roles that use it: it imports nothing of workers.roles."""
    return sorted(
        f"{m} imports {d}"
        for m, deps in g.items()
        if m == "workers.kvwire" or m.startswith("workers.kvwire.")
        for d in deps
        if d == "workers.roles" or d.startswith("workers.roles.")
    )


def test_the_kv_data_plane_imports_nothing_of_the_roles():
    assert any(m.startswith("workers.kvwire.") for m in graph())  # the walk sees the data plane at all
    assert not data_plane_violations(graph()), data_plane_violations(graph())


def test_the_data_plane_check_finds_kvwire_importing_a_role():
    g = {
        "workers.kvwire.sender": {"workers.roles.config", "workers.kvwire.frame"},
        "workers.kvwire.frame": set(),
        "workers.roles.prefill": {"workers.kvwire"},  # the roles may use the data plane
        "workers.roles.config": set(),
    }
    assert data_plane_violations(g) == ["workers.kvwire.sender imports workers.roles.config"]


# A runtime is chosen once, by name, where the spec is read (experiments/spec/runtimes.py: KINDS, and the run
# floor's LAUNCHERS keyed by the same names); everywhere else the code asks the kind or the launcher.
RUNTIME_NAME_TEST = re.compile(r"""runtime(\.name)?\s*(==|!=|\bin\b|\bnot in\b)\s*[("'\[]""")


def runtime_name_tests(paths: dict[str, Path]) -> list[str]:
    return [
        f"{m}:{n}: {line.strip()}"
        for m, p in paths.items()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if RUNTIME_NAME_TEST.search(line) and not line.lstrip().startswith("#")
    ]


def test_no_runtime_name_is_compared_outside_its_registry():
    assert not runtime_name_tests(modules()), runtime_name_tests(modules())


def test_the_runtime_check_finds_a_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('if spec.runtime == "docker":\n    pass\nif testbed.runtime.name not in ("ray", "x"):\n    pass\n')
    assert len(runtime_name_tests({"bad": bad})) == 2


def test_every_runtime_of_the_schema_has_a_kind_and_a_launcher():
    from experiments.run.deploy import LAUNCHERS
    from experiments.spec.experiment import RUNTIMES
    from experiments.spec.runtimes import KINDS

    assert set(KINDS) == set(RUNTIMES) == set(LAUNCHERS)
