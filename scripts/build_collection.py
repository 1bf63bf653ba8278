"""Build the Ansible collection k3fleet.gpu from this repository, layout unchanged.

The repository keeps one copy of every module, module_util, doc fragment and role (the k3fleet
CLI runs them from k3fleet/ansible/ and roles/). This script stages the collection tree

    <staging>/ansible_collections/k3fleet/gpu/
        galaxy.yml  README.md  meta/runtime.yml
        plugins/modules/  plugins/module_utils/  plugins/doc_fragments/
        roles/  tests/sanity/

and rewrites what differs in a collection: module_utils imports become
``ansible_collections.k3fleet.gpu.plugins.module_utils.X`` (the source's ``try: from
ansible.module_utils.X ... except ImportError: from k3fleet.ansible.module_utils.X`` blocks keep
only their first branch: the controller-package fallback has no place on a node), and doc
fragments are named by FQCN. Then `ansible-galaxy collection build` writes the tarball.

    python scripts/build_collection.py [--staging build/collection] [--output dist]
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "k3fleet", "gpu"
FQ_UTILS = f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils."
SRC = REPO / "k3fleet" / "ansible"
_UTILS_IMPORT = re.compile(r"\bansible\.module_utils\.(k3fleet_\w+)")
_FRAGMENT = re.compile(r"^(\s*-\s*)(k3fleet_\w+)\s*$", re.MULTILINE)
# seealso entries name other modules by FQCN in a collection.
_SEEALSO = re.compile(r"^(\s*-\s*module:\s*)(k3fleet_\w+)\s*$", re.MULTILINE)


class BuildError(RuntimeError):
    """The collection could not be staged or built (one line)."""


def _is_import_error_handler(handler: ast.ExceptHandler) -> bool:
    return isinstance(handler.type, ast.Name) and handler.type.id == "ImportError"


def _only_imports(stmts: list[ast.stmt]) -> bool:
    return all(isinstance(s, ast.Import | ast.ImportFrom) for s in stmts)


def _is_fallback(node: ast.Try) -> bool:
    """``try: <imports from ansible.module_utils> except ImportError: <imports from k3fleet>``."""
    if node.orelse or node.finalbody or len(node.handlers) != 1 or not _is_import_error_handler(node.handlers[0]):
        return False
    body, handler = node.body, node.handlers[0].body
    if not (_only_imports(body) and _only_imports(handler)):
        return False
    return any(isinstance(s, ast.ImportFrom) and (s.module or "").startswith("k3fleet.") for s in handler)


def _import_text(node: ast.Import | ast.ImportFrom, indent: str) -> list[str]:
    """One import statement as source, k3fleet module_utils renamed to the collection's namespace."""
    names = [f"{a.name} as {a.asname}" if a.asname else a.name for a in node.names]
    if isinstance(node, ast.Import):
        return [f"{indent}import {', '.join(names)}\n"]
    module = _UTILS_IMPORT.sub(lambda m: FQ_UTILS + m.group(1), "." * node.level + (node.module or ""))
    one = f"{indent}from {module} import {', '.join(names)}\n"
    if len(one) <= 120:
        return [one]
    return [f"{indent}from {module} import (\n", *(f"{indent}    {n},\n" for n in names), f"{indent})\n"]


def _is_k3fleet_utils(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and bool(_UTILS_IMPORT.match(node.module or ""))


def rewrite_source(source: str, *, docs: bool = False) -> str:
    """The collection form of one module or module_util source file."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line, replacement), 1-based inclusive
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and _is_fallback(node):
            indent = " " * node.col_offset
            body = [text for stmt in node.body for text in _import_text(stmt, indent)]  # type: ignore[arg-type]
            edits.append((node.lineno, node.end_lineno or node.lineno, body))
            inside.update(id(stmt) for stmt in node.body)
    for node in ast.walk(tree):
        if _is_k3fleet_utils(node) and id(node) not in inside:  # type: ignore[arg-type]
            assert isinstance(node, ast.ImportFrom)
            edits.append((node.lineno, node.end_lineno or node.lineno, _import_text(node, " " * node.col_offset)))
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1:last] = text
    out = re.sub(r"\n{4,}", "\n\n\n", "".join(lines))
    if re.search(r"^\s*(from|import) k3fleet\b", out, re.MULTILINE):
        raise BuildError("a k3fleet.* import is left outside a try/except ImportError fallback")
    if docs:
        out = _FRAGMENT.sub(lambda m: f"{m.group(1)}{NAMESPACE}.{NAME}.{m.group(2)}", out)
        out = _SEEALSO.sub(lambda m: f"{m.group(1)}{NAMESPACE}.{NAME}.{m.group(2)}", out)
    compile(out, "<collection source>", "exec")
    return out


def _version() -> str:
    sys.path.insert(0, str(REPO))
    import k3fleet

    return str(k3fleet.__version__)


def stage(staging: Path) -> Path:
    root = staging / "ansible_collections" / NAMESPACE / NAME
    if staging.exists():
        shutil.rmtree(staging)
    for sub in ("plugins/modules", "plugins/module_utils", "plugins/doc_fragments", "meta"):
        (root / sub).mkdir(parents=True)
    galaxy = yaml.safe_load((REPO / "collection" / "galaxy.yml").read_text())
    galaxy["version"] = _version()
    (root / "galaxy.yml").write_text("---\n" + yaml.safe_dump(galaxy, sort_keys=False))
    shutil.copy2(REPO / "collection" / "README.md", root / "README.md")
    shutil.copy2(REPO / "collection" / "meta" / "runtime.yml", root / "meta" / "runtime.yml")
    for kind, docs in (("modules", True), ("module_utils", False)):
        for src in sorted((SRC / kind).glob("k3fleet_*.py")):
            (root / "plugins" / kind / src.name).write_text(rewrite_source(src.read_text(), docs=docs))
    for src in sorted((SRC / "doc_fragments").glob("k3fleet_*.py")):
        shutil.copy2(src, root / "plugins" / "doc_fragments" / src.name)
    shutil.copytree(REPO / "roles", root / "roles", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # ansible-test reads the sanity ignore files from the collection's own tests/sanity/.
    shutil.copytree(REPO / "tests" / "sanity", root / "tests" / "sanity")
    return root


def build(root: Path, output: Path) -> Path:
    output.mkdir(parents=True, exist_ok=True)
    galaxy = shutil.which("ansible-galaxy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if galaxy is None:
        raise BuildError("ansible-galaxy not found: install ansible-core")
    proc = subprocess.run([galaxy, "collection", "build", str(root), "--output-path", str(output), "--force"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"ansible-galaxy collection build failed: {' '.join(proc.stderr.split())[-400:]}")
    version = yaml.safe_load((root / "galaxy.yml").read_text())["version"]
    tarball = output / f"{NAMESPACE}-{NAME}-{version}.tar.gz"
    if not tarball.is_file():
        raise BuildError(f"ansible-galaxy reported success but {tarball} is missing")
    return tarball


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--staging", type=Path, default=REPO / "build" / "collection")
    ap.add_argument("--output", type=Path, default=REPO / "dist")
    ap.add_argument("--stage-only", action="store_true", help="stage the tree, do not build the tarball")
    args = ap.parse_args()
    try:
        root = stage(args.staging.resolve())
        if args.stage_only:
            print(root)
            return 0
        print(build(root, args.output.resolve()))
    except (BuildError, OSError, SyntaxError, yaml.YAMLError) as exc:
        print(f"build_collection: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
