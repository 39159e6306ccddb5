"""The house (docs/architecture.md, "The house"): the import graph of ``autopar/`` has no
circle and no arrow from a lower layer into a higher one; no function-local import
hides an arrow; the module, the runners and ``api.py`` import no family; no file is
over 500 lines and no function over 80; no family package imports another's, and no
class of one is built on another's. Ratchets on what is still to be cleared (each fails
on anything new and on a listed item that is gone): functions over 8 positional
parameters, family names in the generic layers.
The import graph by folder drawn in docs/architecture.md is the code's.

Read from the source with ``ast`` (nothing is imported), so a failure names the file,
the line and the import."""
from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autopar"

# Bottom to top; a module belongs to the layer of its longest prefix listed here. A
# module may import its own layer and the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("vocabulary", ("autopar._torch_compat", "autopar.ir", "autopar.grid", "autopar.timing", "autopar.heap")),
    ("runtime primitives", ("autopar.runtime",)),
    ("parameter layout", ("autopar.runtime.layout",)),
    ("capture", ("autopar.trace",)),
    ("analysis", ("autopar.passes",)),
    ("cost", ("autopar.cost",)),
    ("planning", ("autopar.planning",)),
    ("running a rank", ("autopar.engine",)),
    ("families", ("autopar.strategies",)),
    ("drivers", ("autopar.driver",)),
    ("interface", ("autopar", "autopar.api", "autopar.agreement", "autopar.cli", "autopar.data", "autopar.hf_config",
                   "autopar.testing", "autopar.calibrate")),
]

# function-local imports of autopar allowed, and why
LOCAL_IMPORTS_ALLOWED = {
    "autopar.cli": "the command parses its arguments before importing torch (start-up time)",
}

# modules that run every plan and so may name no family
FAMILY_FREE = ("autopar.runtime", "autopar.engine", "autopar.driver", "autopar.api", "autopar.passes")


# Families are peers: a family package imports the shared homes (strategies.family,
# .registry, .placement, .shared) and no other family's package; one that composes another
# asks for it through the protocol (PlanContext.peer). The check fails on any import
# between family packages but those listed here (none), and on a listed one that is gone.
NOT_A_FAMILY = ("family", "registry", "placement", "shared")
CROSS_FAMILY_DEBT: dict[str, set[str]] = {}

# At most 8 positional parameters (self, cls and an autograd Function's ctx not counted):
# more belong in a frozen options object (values that travel together) or keyword-only
# parameters (settings). None takes more now; the check fails on any function that does
# (and on an entry listed here that no longer does).
MAX_POSITIONAL = 8
LONG_SIGNATURE_DEBT: set[str] = set()


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
             if _family_package(t)]   # the protocol (registry, family, placement) and the shared homes are no family
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


def _family_package(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["autopar", "strategies"] and parts[2] not in NOT_A_FAMILY:
        return parts[2]
    return None


def _shared_home(module: str) -> str | None:
    parts = module.split(".")
    return "shared" if len(parts) >= 3 and parts[:2] == ["autopar", "strategies"] and parts[2] in NOT_A_FAMILY \
        and module not in ("autopar.strategies.registry", "autopar.strategies.placement") else None


def test_families_import_no_other_familys_package():
    found: dict[str, set[str]] = {}
    for module, edges in EDGES.items():
        mine = _family_package(module) or _shared_home(module)   # (the registry and placement list families)
        for target, _, _ in edges:
            theirs = _family_package(target)
            if mine and theirs and theirs != mine:
                found.setdefault(module.removeprefix("autopar.strategies."), set()).add(
                    target.removeprefix("autopar.strategies."))
    new = {m: sorted(extra) for m, t in found.items() if (extra := t - CROSS_FAMILY_DEBT.get(m, set()))}
    gone = {m: sorted(t - found.get(m, set())) for m, t in CROSS_FAMILY_DEBT.items() if t - found.get(m, set())}
    assert new == {}, f"a family package imports another family's: {new}; move what they share to strategies.shared"
    assert gone == {}, f"no longer imported, remove from CROSS_FAMILY_DEBT: {gone}"


def _bound_names(tree: ast.Module) -> dict[str, str]:
    """The names a module binds by importing autopar, each to what it names (a module,
    or ``module.Name``)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autopar":
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "autopar":
                    bound[a.asname or "autopar"] = a.name if a.asname else "autopar"
    return bound


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)) is not None:
        return f"{head}.{node.attr}"
    return None


def test_no_class_inherits_across_family_packages():
    """A class of a family package has no base from another family's package (what two
    families build on lives in strategies.shared, whose bases any family may take)."""
    found = {}   # family.module.Class -> where and what
    for module, path in MODULES.items():
        mine = _family_package(module)
        if mine is None:
            continue
        tree = ast.parse(path.read_text())
        bound = _bound_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                name = _dotted(base)
                head, _, rest = (name or "").partition(".")
                if head not in bound:
                    continue
                target = _resolve(bound[head] + (f".{rest}" if rest else ""))
                theirs = _family_package(target) if target else None
                if theirs is not None and theirs != mine:
                    found[f"{module.removeprefix('autopar.strategies.')}.{node.name}"] = (
                        f"{path.relative_to(ROOT)}:{node.lineno}: class {node.name}({name}) of {mine} inherits from "
                        f"{target} ({theirs})")
    assert not found, "move the base both families build on to strategies.shared:\n" + "\n".join(found.values())


def test_no_function_takes_more_than_8_positional_parameters():
    long = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls", "ctx")]
                if len(names) > MAX_POSITIONAL:
                    long.add(f"{module}.{node.name}")
    assert sorted(long - LONG_SIGNATURE_DEBT) == [], "more than 8 positional parameters: take a frozen options object"
    assert sorted(LONG_SIGNATURE_DEBT - long) == [], "no longer over 8: remove from LONG_SIGNATURE_DEBT"


def test_the_checks_see_what_they_check():
    """The graph is read: the module imports the runner, the planner the registry, and
    every layer holds a module."""
    assert ("autopar.engine.runner" in {t for t, _, _ in EDGES["autopar.engine.module"]})
    assert ("autopar.strategies.registry" in {t for t, _, _ in EDGES["autopar.driver.search"]})
    assert {_layer(m)[1] for m in MODULES} == {name for name, _ in LAYERS}


# -- family names in the generic layers ----------------------------------------------------------

FAMILY_WORDS = re.compile(r"\b(megatron|dsp|csub|cube|cube3d|tensor3d|subgraph_parallel|zero_stats|tensor3d_stats|"
                          r"pipeline_executor)\b", re.I)
GENERIC = ("autopar/runtime", "autopar/engine", "autopar/driver", "autopar/passes", "autopar/planning", "autopar/api.py", "autopar/agreement.py",
           "autopar/runtime/layout.py")
DOCSTRING_QUOTES = ('"' * 3, "'" * 3)
# The generic layers learn what a family is from the registry, not by its name: each
# family declares itself (autopar/planning/declared.py's Language, the built-in ones in
# their packages' language.py) and strategies/registry.py registers it with the family
# object; those two are where family names map to families (the registry lies outside
# GENERIC, declared.py names none). The names the generic layers still hold in code
# (identifiers and strings; docstrings and comments not counted), per file: the check
# fails where a count grows or a new file names one, and where one shrinks (lower it
# here). What remains: the plan.json fields Plan.csub and MeshCandidate.csub and the
# Strategy field csub (D&SP-cSub's common layers on sub-grid 0: the format and the
# strategy values every family reads).
FAMILY_NAME_DEBT = {
    "autopar/planning/strategy.py": 1, "autopar/planning/plan.py": 2,
}


def _family_words(path: pathlib.Path) -> int:
    count = 0
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.NAME or (token.type == tokenize.STRING
                                           and not token.string.startswith(DOCSTRING_QUOTES)):
            count += len(FAMILY_WORDS.findall(token.string))
    return count


def test_the_generic_layers_name_no_more_families():
    found = {}
    for path in MODULES.values():
        rel = str(path.relative_to(ROOT))
        if rel.startswith(GENERIC) and (n := _family_words(path)):
            found[rel] = n
    grown = {f: (FAMILY_NAME_DEBT.get(f, 0), n) for f, n in found.items() if n > FAMILY_NAME_DEBT.get(f, 0)}
    shrunk = {f: (n, found.get(f, 0)) for f, n in FAMILY_NAME_DEBT.items() if found.get(f, 0) < n}
    assert grown == {}, f"family names added to the generic layers (listed, found): {grown}; ask the registry"
    assert shrunk == {}, f"fewer family names than listed (listed, found), lower FAMILY_NAME_DEBT: {shrunk}"


# -- the import graph by folder, drawn in docs/architecture.md --------------------------------

FOLDERS = ["autopar/ (vocabulary)", "autopar/runtime", "autopar/trace", "autopar/passes", "autopar/cost",
           "autopar/planning", "autopar/engine", "autopar/strategies", "autopar/driver", "autopar/ (interface)"]
"""Bottom to top: each folder holds the layers of LAYERS in this order (the vocabulary and
the interface share the package's own folder, at its bottom and top)."""
GRAPH_BEGIN, GRAPH_END = "<!-- import graph by folder: begin -->", "<!-- import graph by folder: end -->"


def _folder(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() and len(parts) == 2:
        return "/".join(parts[:2])
    return "autopar/ (interface)" if _layer(module)[1] == "interface" else "autopar/ (vocabulary)"


def folder_graph() -> str:
    """The imports between folders as a Mermaid flowchart: each arrow with its number of
    imports, those that run from a lower folder to a higher one (:data:`FOLDERS`) dashed."""
    counts: dict[tuple[str, str], int] = {}
    for module, edges in EDGES.items():
        for target, _, _ in edges:
            a, b = _folder(module), _folder(target)
            if a != b:
                counts[a, b] = counts.get((a, b), 0) + 1
    ids = {f: f"f{i}" for i, f in enumerate(FOLDERS)}
    lines = ["```mermaid", "flowchart BT"]
    lines += [f'  {ids[f]}["{f}"]' for f in FOLDERS]
    for (a, b), n in sorted(counts.items(), key=lambda kv: (FOLDERS.index(kv[0][0]), FOLDERS.index(kv[0][1]))):
        up = FOLDERS.index(b) > FOLDERS.index(a)
        lines.append(f"  {ids[a]} {'-.' if up else '--'} {n} {'.->' if up else '-->'} {ids[b]}")
    lines.append("```")
    return "\n".join(lines)


def test_no_folder_import_runs_back_up():
    """Each folder holds a layer (or a run of them): no import runs from a folder to one
    above it in :data:`FOLDERS`."""
    up = [f"{MODULES[m].relative_to(ROOT)}:{line}: {_folder(m)} imports {t} ({_folder(t)}, above)"
          for m, edges in EDGES.items() for t, line, _ in edges
          if FOLDERS.index(_folder(t)) > FOLDERS.index(_folder(m))]
    assert up == []


def test_the_folder_graph_in_the_docs_is_the_codes():
    """docs/architecture.md draws the imports by folder as they are; regenerate the block
    with ``python tests/test_architecture.py`` when this fails."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawn = text[text.index(GRAPH_BEGIN) + len(GRAPH_BEGIN):text.index(GRAPH_END)].strip()
    assert drawn == folder_graph()


if __name__ == "__main__":   # rewrite the drawing in docs/architecture.md
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text()
    start, end = text.index(GRAPH_BEGIN) + len(GRAPH_BEGIN), text.index(GRAPH_END)
    doc.write_text(text[:start] + "\n" + folder_graph() + "\n" + text[end:])
