"""The package's layers point one way: api → services (store, analytics) → db, with no import
cycles, no lower layer importing a higher one, and the backend known in few places. Checked on the
source (ast), so a lazy import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

SERVICE = REPO / "service"
#: rank of each layer: a module may import modules of the same or a lower rank only
LAYERS = {
    "service.api": 4, "service.cli": 4,
    "service.analytics": 3, "service.store": 3, "service.auth": 3, "service.bulk": 2,
    "service.db": 1, "service.derive": 1, "service.ranking": 1, "service.tables": 0, "service.schemas": 0,
    "service.errors": 0, "service.settings": 0, "service.hardware": 0,
}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """{module: service modules it imports (anywhere in its source)}."""
    modules = {module_name(p): p for p in SERVICE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def layer(module: str) -> int | None:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return None


def test_no_import_cycles():
    graph = imports()
    assert {"service.analytics.heatmap", "service.store"} <= graph["service.api.analytics"] | graph["service.api.runs"]
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package importing its own submodules (service.api → service.api.app) is not a cycle of layers
    real = [c for c in cycles if not all(m.startswith(c[0] + ".") or m == c[0] for m in c[1:])]
    assert real == []


def test_layers_point_one_way():
    wrong = []
    for module, targets in imports().items():
        mine = layer(module)
        for target in targets:
            theirs = layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
    assert wrong == []
    assert not any(t.startswith("service.analytics") for t in imports()["service.db"])


def test_the_backend_is_named_in_few_places():
    """Outside the database layer, only the bulk insert, the user-SQL sandbox, and the heatmap's
    one query per backend branch on the dialect name."""
    branches = {}
    for path in SERVICE.rglob("*.py"):
        n = len(re.findall(r"dialect\.name|\.is_duckdb|db\.dialect ==|dialect == \"", path.read_text()))
        if n:
            branches[module_name(path)] = n
    outside = set(branches) - {"service.db", "service.bulk", "service.analytics.sql", "service.analytics.heatmap"}
    assert outside == set(), branches


def _top_imports(path: Path) -> set[str]:
    """Every module a file imports (anywhere in its source), absolute names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_core_imports_the_standard_library_only():
    """core/ holds the domain rules once; ingest, service and dashboard import it, never the reverse."""
    import sys

    wrong = {f"{p.relative_to(REPO)}: {m}" for p in (REPO / "core").rglob("*.py") for m in _top_imports(p)
             if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in ("core", "__future__")}
    assert wrong == set()
