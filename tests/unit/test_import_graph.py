"""k3fleet's import graph: no cycle between modules or packages, and every import made inside a
function says why it is there.

The graph holds every import that runs: module level, inside functions, and
``importlib.import_module("k3fleet....")`` with a literal name; only ``if TYPE_CHECKING:`` blocks are
left out (they never run). Importing ``k3fleet.a.b.c`` from outside ``k3fleet.a`` also runs
``k3fleet.a``'s and ``k3fleet.a.b``'s ``__init__``, so those are edges too. A cycle that an in-function
import hides still breaks whoever imports the other end first; a package-level cycle means two
packages each need the other.

Outside ``k3fleet/cli`` (whose modules import their commands' flows lazily by rule, said once at the
top of each), an import inside a function is there only to keep a heavy dependency or a whole flow off
the CLI's start-up path or off a command that does not need it: it carries a ``# lazy:`` comment on
its line or the line before saying so. Standard-library imports are not held to it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "k3fleet"
LAZY = "# lazy:"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


class _Imports(ast.NodeVisitor):
    """Every import statement and literal ``importlib.import_module`` call, with whether it sits in a
    function; ``if TYPE_CHECKING:`` bodies are skipped (they never run)."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.stmt | ast.expr, bool]] = []
        self.depth = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.orelse:
                self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self.depth > 0))

    visit_ImportFrom = visit_Import  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        if (ast.unparse(node.func) in ("importlib.import_module", "import_module") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            self.found.append((node, self.depth > 0))
        self.generic_visit(node)


def _imported_names(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The dotted names an import statement loads, relative imports made absolute."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        is_package = _modules()[module].name == "__init__.py"
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*parts, *([base] if base else [])])
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _runtime_imports(module: str) -> Iterator[tuple[ast.stmt | ast.expr, list[str], bool]]:
    """(node, names, in_function) for every import of ``module`` that can run."""
    visitor = _Imports()
    visitor.visit(_tree(_modules()[module]))
    for node, in_function in visitor.found:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, _imported_names(node, module), in_function
        else:
            assert isinstance(node, ast.Call) and isinstance(node.args[0], ast.Constant)
            yield node, [str(node.args[0].value)], in_function


def _resolve(name: str) -> str | None:
    """The k3fleet module a dotted name loads (``from pkg import name`` may name a module or an attribute)."""
    mods = _modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, names: list[str]) -> set[str]:
    """The modules an import runs: each named module and its ancestor packages outside ``module``'s own."""
    out: set[str] = set()
    for name in names:
        if not name.startswith("k3fleet.") or (target := _resolve(name)) is None:
            continue
        parts = target.split(".")
        for i in range(2, len(parts) + 1):
            dep = ".".join(parts[:i])
            if dep != module and not module.startswith(dep + ".") and dep in _modules():
                out.add(dep)
    return out


@cache
def _graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(t for _n, names, _f in _runtime_imports(m) for t in _targets(m, names))
            for m in _modules()}


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_graph_sees_the_package() -> None:
    graph = _graph()
    assert {"k3fleet.cli.base", "k3fleet.accept.agent", "k3fleet.evidence.writer"} <= graph.keys()
    # An in-function import is an edge, and so is the package __init__ an import runs.
    assert "k3fleet.accept.load" in graph["k3fleet.accept.run"]
    assert "k3fleet.evidence" in graph["k3fleet.accept.run"]


def test_no_module_cycle_with_every_runtime_import() -> None:
    assert _cycles(_graph()) == []


def test_no_package_cycle() -> None:
    packages: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        mine = _package(module)
        packages.setdefault(mine, set()).update(p for p in map(_package, deps) if p != mine)
    assert _cycles({p: frozenset(d) for p, d in packages.items()}) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}) == [
        ["a", "b", "c"]]


def _commented(lines: list[str], node: ast.stmt | ast.expr, starts: dict[int, int]) -> bool:
    """A ``# lazy:`` comment on the import or in the comment lines just above it, or above the run of
    imports it belongs to (``starts``: the first line of each import statement, by its last line)."""
    first, end = node.lineno, node.end_lineno or node.lineno
    while True:
        if any(LAZY in line for line in lines[first - 1:end]):
            return True
        above = first - 1
        while above >= 1 and lines[above - 1].lstrip().startswith("#"):
            if LAZY in lines[above - 1]:
                return True
            above -= 1
        if above != first - 1 or above not in starts:
            return False
        first, end = starts[above], above


def test_every_in_function_import_outside_the_cli_says_why() -> None:
    stdlib = sys.stdlib_module_names
    missing = []
    for module, path in _modules().items():
        if module == "k3fleet.cli" or module.startswith("k3fleet.cli."):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        imports = list(_runtime_imports(module))
        starts = {n.end_lineno or n.lineno: n.lineno for n, _names, _f in imports if isinstance(n, ast.stmt)}
        for node, names, in_function in imports:
            first = names[0].split(".")[0]
            if in_function and first not in stdlib and not _commented(lines, node, starts):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {names[0]}")
    assert missing == [], "in-function imports without a '# lazy:' comment:\n" + "\n".join(missing)


def test_every_cli_module_says_its_imports_are_lazy() -> None:
    """In k3fleet/cli lazy imports are the rule (a command's flow loads when the command runs): one
    ``# lazy:`` comment above the first definition says so for the whole module."""
    silent = []
    for module, path in _modules().items():
        in_cli = module == "k3fleet.cli" or module.startswith("k3fleet.cli.")
        if not in_cli or not any(f for _n, _names, f in _runtime_imports(module)):
            continue
        tree = _tree(path)
        first = next((s.lineno for s in tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef
                                                                    | ast.ClassDef)), 10**9)
        head = path.read_text(encoding="utf-8").splitlines()[:first]
        if not any(LAZY in line for line in head):
            silent.append(str(path.relative_to(ROOT)))
    assert silent == [], "k3fleet/cli modules with in-function imports and no '# lazy:' comment at the top"


def test_no_test_module_imports_another_test_module() -> None:
    """Shared test data lives in helper modules (tests/unit/decide_evidence.py, nodetree.py, ...), never in a
    test module another one imports: a test module runs its own tests wherever it is imported."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(_tree(path)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                      if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")]
    assert found == []
