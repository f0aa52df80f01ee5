"""The layers' imports, read from the sources (issue 16): no cycle inside api/, including the imports
made inside functions (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.sources import modules

API = Path(__file__).resolve().parents[2] / "cascade_repro" / "api"


def _api_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("cascade_repro.api."):
                found.add(node.module.split(".")[2])
            elif node.module == "cascade_repro.api":
                found.update(alias.name for alias in node.names if (API / f"{alias.name}.py").is_file())
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_api_modules_import_each_other_without_a_cycle() -> None:
    graph = {p.stem: _api_imports(p) - {p.stem} for p in API.glob("*.py") if p.stem != "__init__"}
    assert graph["records"], "the import reader found no api/ imports at all"
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


# The child half writes to the script's own stderr (it runs inside the user's process); run_output
# relays the script's output and draws the progress line. Everything else prints through render/.
PRINTERS = ("render/", "child/", "run_output.py")


def test_only_render_prints() -> None:
    offenders = []
    for rel, text in modules(skip=PRINTERS):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called == "print" or called.endswith(("sys.stdout.write", "sys.stderr.write")):
                    offenders.append(f"{rel}:{node.lineno}: {called}")
    assert offenders == []
