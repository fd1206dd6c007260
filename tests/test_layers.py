"""The layers point one way. Between the packages: core/ (the domain rules, standard library only)
← ingest/ (training side: core only) ← service/ ← bench/ scripts; dashboard/ imports core/ and the
HTTP client service/client.py, never SQLAlchemy; nothing imports bench/. Inside service/: api →
services (store, analytics) → db, with no import cycles, no lower layer importing a higher one, and
the backend known in few places. Checked on the source (ast), so a lazy import inside a function
counts as much as one at the top."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SERVICE = REPO / "service"
#: rank of each layer: a module may import modules of the same or a lower rank only
LAYERS = {
    "service.api": 4, "service.cli": 4,
    "service.analytics": 3, "service.store": 3, "service.auth": 3, "service.bulk": 2,
    "service.lifecycle": 2, "service.steps": 2, "service.sweeps": 3, "service.sweep_leases": 3, "service.db": 1,
    "service.derive": 1, "service.ranking": 1, "service.tables": 0, "service.schemas": 0,
    "service.errors": 0, "service.settings": 0, "service.client": 0,
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
    """Outside the database layer, only the bulk insert, the two summaries' merges (run_configs and
    run_cells: one statement on PostgreSQL, UPDATE by key on DuckDB), the user-SQL sandbox, and the
    heatmap's one query per backend branch on the dialect name."""
    branches = {}
    for path in SERVICE.rglob("*.py"):
        n = len(re.findall(r"dialect\.name|\.is_duckdb|db\.dialect ==|dialect == \"", path.read_text()))
        if n:
            branches[module_name(path)] = n
    outside = set(branches) - {"service.db", "service.bulk", "service.run_configs", "service.run_cells",
                               "service.analytics.sql", "service.analytics.heatmap"}
    assert outside == set(), branches



# ------------------------------------------------------------------------------ the packages
#: our top-level packages
OURS = ("core", "ingest", "service", "dashboard", "migrations", "bench")


def _imports_of(path: Path) -> set[str]:
    """Every module a file imports (anywhere in its source, lazy imports too), absolute names."""
    found: set[str] = set()
    package = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
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
    return found


def _package_imports(package: str) -> dict[str, set[str]]:
    return {module_name(p): _imports_of(p) for p in (REPO / package).rglob("*.py")}


def _ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in OURS}


def test_core_imports_the_standard_library_only():
    """core/ holds the domain rules once; ingest, service and dashboard import it, never the reverse."""
    wrong = {f"{mod}: {m}" for mod, found in _package_imports("core").items() for m in found
             if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in ("core", "__future__")}
    assert wrong == set()


def test_ingest_imports_only_core_of_ours():
    """The training side: the standard library, core/, and the optional frameworks it integrates with."""
    wrong = {f"{mod}: {m}" for mod, found in _package_imports("ingest").items() for m in _ours(found)
             if m.split(".")[0] not in ("ingest", "core")}
    assert wrong == set()


def test_dashboard_imports_no_sqlalchemy_and_only_the_client_of_service():
    """The dashboard talks to the service over HTTP: of service/ it imports the HTTP client alone
    (service/client.py, shared with the CLI), which imports nothing else of service/; no SQLAlchemy."""
    found = _package_imports("dashboard")
    assert not {f"{mod}: {m}" for mod, ms in found.items() for m in ms if m.split(".")[0] == "sqlalchemy"}
    from_service = {m for ms in found.values() for m in _ours(ms) if m.startswith("service")}
    assert from_service and from_service <= {"service.client"} | _names_in("service.client"), from_service
    client_imports = _ours(_imports_of(REPO / "service" / "client.py"))
    assert {m for m in client_imports if m.startswith(("service", "dashboard"))} == set()
    code = ("import sys, service.client, dashboard.logic.heatmap, dashboard.logic.runs, dashboard.logic.recommend, "
            "dashboard.logic.scaling, dashboard.logic.explore, dashboard.logic.failures, dashboard.logic.sql; "
            "print([m for m in ('sqlalchemy', 'fastapi', 'duckdb', 'psycopg') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _names_in(module: str) -> set[str]:
    """`module.name` for every public name of a module (what `from module import name` records)."""
    mod = __import__(module, fromlist=["_"])
    return {f"{module}.{n}" for n in dir(mod) if not n.startswith("__")}


def test_nothing_imports_bench():
    """bench/ holds measurement scripts: they import the product, the product never imports them
    (`scalebook bench`'s driver is service/cli/benchmark.py)."""
    wrong = {f"{mod}: {m}" for pkg in ("core", "ingest", "service", "dashboard", "migrations")
             for mod, found in _package_imports(pkg).items() for m in found if m.split(".")[0] == "bench"}
    assert wrong == set()
