"""One registry of event names (workers.roles.events.NAMES): every name a role writes is in it, every name
the analysis reads is in it, and every name in it is written somewhere (read from the source, by AST)."""

import ast
from pathlib import Path

from workers.roles.events import NAMES

ROOT = Path(__file__).resolve().parents[2]
# Chosen at run time, so not a literal at the emit call: kvwire/sender.py's _complete.
COMPUTED = {"kv_send_end", "kv_send_cancelled_end", "kv_send_failed"}


def _trees(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "proto" not in path.parts:
            yield path, ast.parse(path.read_text())


def _strings(node) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _emitted() -> dict[str, str]:
    """name -> where, of every `.emit("name", ...)` in workers/ and experiments/."""
    found = {}
    for package in ("workers", "experiments"):
        for path, tree in _trees(package):
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "emit" and node.args:
                    first = node.args[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        found[first.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def _read_by_analysis() -> dict[str, str]:
    """name -> where, of every string experiments/ compares with an event's name (`e["event"] == "x"`,
    `... in (...)`) or lists in a module-level *_EVENTS / REASON_KEYED constant."""
    found = {}
    for path, tree in _trees("experiments"):
        for node in ast.walk(tree):
            names: set[str] = set()
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Subscript) and _strings(s.slice) == {"event"} for s in sides):
                    names = set().union(*(_strings(s) for s in sides if not isinstance(s, ast.Subscript)))
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and (t.id.endswith("_EVENTS") or t.id == "REASON_KEYED") for t in node.targets
            ):
                value = node.value  # a dict maps event names to something else: its keys
                names = set().union(*map(_strings, value.keys)) if isinstance(value, ast.Dict) else _strings(value)
            for name in names:
                found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_name_a_role_writes_is_registered():
    emitted = _emitted()
    assert len(emitted) > 50  # the walk found the roles' events at all
    missing = {n: where for n, where in emitted.items() if n not in NAMES}
    assert missing == {}, "add these to workers.roles.events.NAMES"
    assert COMPUTED <= set(NAMES)


def test_every_name_the_analysis_reads_is_registered():
    read = _read_by_analysis()
    assert {"kv_tcp_info", "decode_open", "completed_on_rld"} <= set(read)  # the walk sees the analysis
    unknown = {n: where for n, where in read.items() if n not in NAMES}
    assert unknown == {}, "the analysis reads event names no role writes"


def test_every_registered_name_is_written_somewhere():
    unused = set(NAMES) - set(_emitted()) - COMPUTED
    assert unused == set(), "registered but never written: remove them or emit them"
