"""The package's import graph: no cycles, and every import runs downwards through the layers below.

They are docs/architecture.md §4's, with one change: the Ray single-controller runtime (worker base, dispatch, groups, pools)
sits *below* the worker roles, which subclass its ``Worker`` and declare their dispatch next to each method; the
runtime itself knows no role. Read from the source (AST, nothing imported), function-level and ``TYPE_CHECKING``
imports included. A new upward import or cycle fails here with the file and line that made it. The one declared way
up is by name, not by import: ``hybridrl.config.components`` names the registries that validate choice-valued keys.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hybridrl

PACKAGE = Path(hybridrl.__file__).parent
LAYERS: tuple[tuple[str, ...], ...] = (
    ("utils",),
    ("protocol",),
    ("config",),
    ("runtime",),  # the Ray single-controller runtime: worker base, dispatch, groups, pools (knows no role)
    ("algorithms",),
    ("data", "rewards"),
    ("modeling",),  # model building, sharding, precision, attention, LoRA, forwards over sequences
    ("hybrid_engine", "rollout"),
    ("agents",),  # environments, tools and the token-exact multi-turn loop over a request engine
    ("gateway",),  # the OpenAI-compatible HTTP gateway over a replica server, with per-session token capture
    ("engines",),  # per-rank training engines and their losses and hooks
    ("autotune",),  # memory sizing and probe, gradient-noise scale, adaptive accumulation
    ("workers",),  # Ray roles: actor/rollout/reference, critic, reward model
    ("replicas",),  # the controller's replicas (every placement behind one type), their weight transfer, placement
    ("trainers", "planner"),
    ("demo", "cli"),
)
LAYER_OF = {package: index for index, packages in enumerate(LAYERS) for package in packages}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """``(module, line)`` for every hybridrl module ``path`` imports (``from a import b`` counts ``a.b`` when it is
    a module, else ``a``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.append((name, node.lineno))
    return found


def package_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def import_graph() -> dict[str, list[tuple[str, int]]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {module: imported_modules(path, set(files)) for module, path in files.items()}


def test_every_package_has_a_layer():
    packages = {package_of(module) for module in import_graph()} - {""}
    assert packages <= set(LAYER_OF), f"packages without a layer in LAYERS: {sorted(packages - set(LAYER_OF))}"


def test_imports_run_downwards_only():
    upward = []
    for module, imports in import_graph().items():
        source = LAYER_OF.get(package_of(module))
        for target, line in imports:
            if source is not None and LAYER_OF.get(package_of(target), -1) > source:
                upward.append(f"{module}:{line} imports {target} ({package_of(target)} is above {package_of(module)})")
    assert not upward, "imports that run upwards:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = {module: sorted({target for target, _ in imports if target != module})
             for module, imports in import_graph().items()}
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(cycle) for cycle in cycles)


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components
