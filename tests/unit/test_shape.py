"""The codebase's shape, from its imports: layers only look down, no import cycle, no file over 600 lines.

Layers (a package may import only those below it): schema (the one validation approach) is under everything;
topology and workers are the bottom above it; docker_rt and ray_rt (the container and Ray runtimes) may use
both; experiments (and the VM harness's users) may use everything. Generated gRPC stubs are left out.
"""

import ast
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
