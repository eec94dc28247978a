"""The import map of the storage layers, read from the source (module-level imports, run-time ones only):
kbroker/durable (the durable files and the ``fs`` seam) imports nothing else of kbroker, kbroker/storage imports
only itself and kbroker/durable, nothing outside storage reaches into it for durable files, and the storage
modules import one another without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DURABLE_MODULES = ("kbroker.storage.files", "kbroker.storage.journal", "kbroker.storage.fs")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run_time_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported (not those under ``if TYPE_CHECKING`` or inside functions);
    ``from package import name`` counts as importing ``package.name`` when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None, f"{path}: a relative import"  # kbroker's are absolute
            base = node.module
            found.add(base)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists():
                    found.add(candidate)
    return {name for name in found if name.startswith("kbroker")}


def import_map() -> dict[str, set[str]]:
    return {module_name(path): run_time_imports(path) for path in sorted((ROOT / "kbroker").rglob("*.py"))}


def test_durable_files_import_nothing_else_of_kbroker() -> None:
    imports = import_map()
    durable = {m: deps for m, deps in imports.items() if m.startswith("kbroker.durable")}
    assert set(durable) == {"kbroker.durable", "kbroker.durable.files", "kbroker.durable.journal", "kbroker.durable.fs"}
    for module, deps in durable.items():
        assert all(dep.startswith("kbroker.durable") for dep in deps), (module, deps)


def test_storage_imports_only_itself_and_the_durable_files() -> None:
    for module, deps in import_map().items():
        if module.startswith("kbroker.storage"):
            outside = {d for d in deps if not d.startswith(("kbroker.storage", "kbroker.durable"))}
            assert outside == set(), module
        else:
            assert not deps & set(DURABLE_MODULES), module


def test_the_storage_modules_have_no_import_cycle() -> None:
    imports = import_map()
    graph = {m: {d for d in deps if d in imports and d != m} for m, deps in imports.items()}
    storage = {m for m in graph if m.startswith(("kbroker.storage.", "kbroker.durable"))}
    # Depth-first search for a back edge among the storage modules (a package's __init__ is left out: importing
    # a submodule runs it first, but it only gathers names).
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(module: str, path: list[str]) -> bool:
        state[module] = 1
        for dep in sorted(graph[module] & storage):
            if state.get(dep) == 1:
                cycle.extend([*path[path.index(dep) :], dep] if dep in path else [module, dep])
                return True
            if dep not in state and visit(dep, [*path, dep]):
                return True
        state[module] = 2
        return False

    for module in sorted(storage):
        if module not in state and visit(module, [module]):
            break
    assert cycle == []
