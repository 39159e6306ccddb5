"""The house (docs/architecture.md, "The house"): the import graph of ``autopar/`` has no
circle and no arrow from a lower layer into a higher one; no function-local import
hides an arrow; the module, the runners and ``api.py`` import no family; no file is
over 500 lines and no function over 80.

Read from the source with ``ast`` (nothing is imported), so a failure names the file,
the line and the import."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autopar"

# Bottom to top; a module belongs to the layer of its longest prefix listed here. A
# module may import its own layer and the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("vocabulary", ("autopar._torch_compat", "autopar.ir", "autopar.grid", "autopar.timing", "autopar.heap")),
    ("runtime primitives", ("autopar.runtime",)),
    ("parameter layout", ("autopar.layout",)),
    ("capture", ("autopar.trace",)),
    ("analysis", ("autopar.passes.analysis", "autopar.passes.manager", "autopar.passes.recompute",
                  "autopar.passes.fusion", "autopar.passes")),
    ("cost", ("autopar.cost",)),
    ("planning", ("autopar.planning",)),
    ("running a rank", ("autopar.runtime.executable", "autopar.runtime.runner", "autopar.runtime.module",
                        "autopar.runtime.checkpoint", "autopar.runtime.checkpoint_chunks", "autopar.runtime.checkpoint_dir",
                        "autopar.runtime.materialise", "autopar.runtime.init_weights",
                        "autopar.runtime.pretrained", "autopar.runtime.pretrained_keys")),
    ("families", ("autopar.strategies",)),
    ("drivers", ("autopar.passes.rank_program", "autopar.planning.search", "autopar.planning.conflicts",
                 "autopar.planning.breakdown")),
    ("interface", ("autopar", "autopar.api", "autopar.agreement", "autopar.cli", "autopar.data", "autopar.hf_config", "autopar.testing", "autopar.cost.calibrate",
                   "autopar.cost.calibrate_measure", "autopar.cost.calibration", "autopar.cost.first_use")),
]

# function-local imports of autopar allowed, and why
LOCAL_IMPORTS_ALLOWED = {
    "autopar.cli": "the command parses its arguments before importing torch (start-up time)",
}

# modules that run every plan and so may name no family
FAMILY_FREE = ("autopar.runtime", "autopar.api", "autopar.passes")
FAMILY_PROTOCOL = ("autopar.strategies.registry", "autopar.strategies.placement", "autopar.strategies.family")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, function-local)`` for every import of autopar in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    local_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local_lines |= {n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autopar":
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "autopar"]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None:
                out.append((target, node.lineno, node.lineno in local_lines))
    return out


EDGES = {m: [(t, line, local) for t, line, local in _imports(p) if t != m] for m, p in MODULES.items()}


def _layer(module: str) -> tuple[int, str]:
    best = (-1, -1, "")
    for index, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), index, name))
    assert best[0] >= 0, f"{module} is in no layer of tests/test_architecture.py: add it to LAYERS"
    return best[1], best[2]


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _, _ in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    return found


def test_no_import_circle():
    assert _circles() == []


def test_imports_run_downwards():
    upward = []
    for module, edges in EDGES.items():
        mine = _layer(module)
        for target, line, _ in edges:
            theirs = _layer(target)
            if theirs[0] > mine[0]:
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({mine[1]}) imports "
                              f"{target} ({theirs[1]})")
    assert upward == []


def test_no_function_local_import_hides_an_arrow():
    hidden = [f"{MODULES[m].relative_to(ROOT)}:{line}: imports {t} inside a function"
              for m, edges in EDGES.items() if m not in LOCAL_IMPORTS_ALLOWED
              for t, line, local in edges if local]
    assert hidden == []


@pytest.mark.parametrize("prefix", FAMILY_FREE)
def test_what_runs_every_plan_names_no_family(prefix):
    named = [f"{MODULES[m].relative_to(ROOT)}:{line}: imports {t}"
             for m, edges in EDGES.items() if m == prefix or m.startswith(prefix + ".")
             if _layer(m)[1] in ("running a rank", "drivers", "interface", "analysis", "runtime primitives")
             for t, line, _ in edges
             if t.startswith("autopar.strategies.") and t not in FAMILY_PROTOCOL]
    assert named == []


def test_no_file_over_500_lines_and_no_function_over_80():
    long_files = [f"{p.relative_to(ROOT)}: {n} lines" for p in MODULES.values()
                  if (n := len(p.read_text().splitlines())) > 500]
    long_functions = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} is {length} lines")
    assert long_files + long_functions == []


def test_the_checks_see_what_they_check():
    """The graph is read: the module imports the runner, the planner the registry, and
    every layer holds a module."""
    assert ("autopar.runtime.runner" in {t for t, _, _ in EDGES["autopar.runtime.module"]})
    assert ("autopar.strategies.registry" in {t for t, _, _ in EDGES["autopar.planning.search"]})
    assert {_layer(m)[1] for m in MODULES} == {name for name, _ in LAYERS}
