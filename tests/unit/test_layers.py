"""The package's layers import downward (docs/path.md, "Layers"): an AST walk over every
module of hpccoll and numba_kernels.

    base        errors, config (the settings registry), base/ (ops, fingerprints and
                ledger, Work, pools, units), h5log (the result-file format: it imports
                nothing of hpccoll that climbs)
    algorithms  pure step machines, the selection table, the calibration table
    transport   every data-path MPI call, node-shared memory, single copy, device staging,
                the reduction backends and the kernels (numba_kernels)
    engine      tasks, lanes, the program executor, policies, the ordering protocol, the
                progress thread, the watchdog, the control plane
    core        context, communicator, the communicator's state, validate, plan, calibrate
    top         the package's face (hpccoll/__init__.py), the mpi4py adapter and the tools

A module imports its own layer or lower ones, at module level or in a function.  In the
library (every layer but the top), a function-level import is only for an optional
dependency (CuPy, Numba and the kernels built on it, h5py, matplotlib, ml_dtypes); the
tools may defer their imports (``--help`` and the MPI-free subcommands start no MPI).
Failing here means an import climbs: move the code to the layer it belongs to, or pass
what it needs down as an argument."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = ("base", "algorithms", "transport", "engine", "core", "top")
# module prefixes -> layer, longest prefix wins
LAYERS = {
    "hpccoll._version": "base", "hpccoll._compiled": "base", "hpccoll.errors": "base",
    "hpccoll.config": "base", "hpccoll.base": "base", "hpccoll.h5log": "base",
    "hpccoll.algorithms": "algorithms",
    "hpccoll.transport": "transport", "numba_kernels": "transport",
    "hpccoll.engine": "engine", "hpccoll.ordering": "engine",
    "hpccoll.core": "core",
    "hpccoll": "top",
}
OPTIONAL = ("cupy", "numba", "numba_kernels.cpu", "numba_kernels.cuda", "h5py",
            "matplotlib", "ml_dtypes", "sklearn")


def layer(module: str):
    best = None
    for prefix, name in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[0])):
            best = (prefix, name)
    return None if best is None else best[1]


def modules():
    for top in ("hpccoll", "numba_kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            package = parts[-1] == "__init__"
            if package:
                parts = parts[:-1]
            yield ".".join(parts), package, path


def imports(module: str, package: bool, path: Path):
    """(imported module, in a function?, line) for every import of the file."""
    tree = ast.parse(path.read_text())
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    in_function.add(id(inner))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in in_function, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                # "from . import x" imports module x where x is one, else the package
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULE_NAMES else target), id(node) in in_function, \
                    node.lineno


ALL = list(modules())
MODULE_NAMES = {m for m, _, _ in ALL}


@pytest.mark.parametrize("module,package,path", ALL, ids=[m for m, _, _ in ALL])
def test_imports_go_down(module, package, path):
    mine = layer(module)
    assert mine is not None, f"{module}: not placed in a layer (tests/unit/test_layers.py)"
    climbs, deferred = [], []
    for target, in_function, line in imports(module, package, path):
        theirs = layer(target)
        if theirs is not None and ORDER.index(theirs) > ORDER.index(mine):
            climbs.append(f"line {line}: {target} ({theirs})")
        if (in_function and mine != "top"
                and not any(target == o or target.startswith(o + ".") for o in OPTIONAL)):
            deferred.append(f"line {line}: {target}")
    assert not climbs, f"{module} ({mine}) imports upward: {climbs}"
    assert not deferred, f"{module} ({mine}) imports in a function: {deferred}"


def test_the_library_is_one_acyclic_graph():
    """No import cycle among the library's modules (module-level imports)."""
    graph = {}
    names = MODULE_NAMES
    for module, package, path in ALL:
        if layer(module) == "top":
            continue
        graph[module] = {t for t, fn, _ in imports(module, package, path)
                         if not fn and t in names and t != module and layer(t) != "top"}
    seen, stack, cycle = {}, [], []

    def visit(m):
        seen[m] = "open"
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if seen.get(t) == "open":
                cycle.extend(stack[stack.index(t):] + [t])
                return True
            if t not in seen and visit(t):
                return True
        stack.pop()
        seen[m] = "done"
        return False
    for m in sorted(graph):
        if m not in seen and visit(m):
            break
    assert not cycle, f"import cycle: {' -> '.join(cycle)}"
