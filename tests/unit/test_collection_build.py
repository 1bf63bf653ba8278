"""The collection tree is the collection: built as it is, nothing rewritten, node code imports only
the collection's own paths (docs/architecture.md "Layout", docs/scale.md "Collection")."""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import json
import re
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from build_collection import FQ_UTILS, ROOT, BuildError, build, check_tree, node_side_problems  # noqa: E402

SOURCES = sorted((ROOT / "plugins" / "modules").glob("*.py")) + sorted((ROOT / "plugins" / "module_utils").glob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_node_code_imports_only_the_collection(path: Path) -> None:
    assert node_side_problems(path) == []
    tree = ast.parse(path.read_text())
    # No dual imports: one import form that resolves on the node and on the controller.
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            caught = [h.type.id for h in node.handlers if isinstance(h.type, ast.Name)]
            body_imports = [s for s in node.body if isinstance(s, ast.ImportFrom)]
            assert not ("ImportError" in caught and any((s.module or "").startswith(FQ_UTILS) for s in body_imports)), \
                f"{path.name}:{node.lineno}: a fallback import of k3fleet module_utils"


def test_short_name_and_controller_imports_are_found(tmp_path: Path) -> None:
    src = tmp_path / "bad.py"
    src.write_text("from ansible.module_utils.k3fleet_cmd import unknown\nimport k3fleet.errors\n")
    problems = node_side_problems(src)
    assert len(problems) == 2
    assert "short name" in problems[0] and "controller package" in problems[1]


@pytest.mark.parametrize("path", sorted((ROOT / "plugins" / "modules").glob("*.py")), ids=lambda p: p.name)
def test_doc_fragments_and_seealso_are_named_by_fqcn(path: Path) -> None:
    docs = [yaml.safe_load(ast.literal_eval(node.value)) for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DOCUMENTATION"]
    assert len(docs) == 1
    doc = docs[0]
    assert doc["module"] == path.stem  # a module's own name stays short
    for fragment in doc.get("extends_documentation_fragment") or []:
        assert fragment.startswith("k3fleet.gpu."), fragment
    for also in doc.get("seealso") or []:
        if "module" in also:
            assert "." in also["module"], also


@pytest.mark.parametrize("path", sorted((ROOT / "plugins" / "modules").glob("*.py")), ids=lambda p: p.name)
def test_examples_call_every_module_by_fqcn(path: Path) -> None:
    examples = [yaml.safe_load(ast.literal_eval(node.value)) for node in ast.parse(path.read_text()).body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXAMPLES"]
    assert len(examples) == 1
    modules = {p.stem for p in path.parent.glob("*.py")}
    for task in examples[0]:
        short = [key for key in task if key in modules]
        assert not short, f"{path.name}: task {task.get('name')!r} calls {short[0]} by its short name"
        assert any(str(key).startswith(("k3fleet.gpu.", "ansible.builtin.")) for key in task), task.get("name")


PLUGINS = sorted((ROOT / "plugins").rglob("*.py"))


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_every_plugin_is_python_3_with_annotations(path: Path) -> None:
    # Python 3 only (no Python 2 compatibility header), every function's parameters and return annotated;
    # make lint type-checks the bodies (mypy --check-untyped-defs).
    source = path.read_text()
    assert "__metaclass__" not in source and "print_function" not in source, path.name
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *[p for p in (a.vararg, a.kwarg) if p]]
            bare = [p.arg for p in params if p.annotation is None and p.arg not in ("self", "cls")]
            if bare or node.returns is None:
                missing.append(f"{node.name} (line {node.lineno})")
    assert missing == [], f"{path.name}: functions without annotations: {', '.join(missing)}"


def test_a_sanity_ignore_file_for_each_supported_ansible_core() -> None:
    # requires_ansible's floor up to the package's ansible-core bound (pyproject.toml, "<2.N": 2.N-1), or the
    # ansible-core installed here if newer: ansible-test reads tests/sanity/ignore-<major.minor>.txt of the
    # version it runs, and ignores the others.
    import ansible

    floor = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["requires_ansible"].lstrip(">=")
    low = int(floor.split(".")[1])
    bound = re.search(r'"ansible-core>=[0-9.]+,<2\.([0-9]+)"', (REPO / "pyproject.toml").read_text())
    assert bound, "pyproject.toml: no ansible-core upper bound"
    high = max(int(bound.group(1)) - 1, int(ansible.__version__.split(".")[1]))
    sanity = ROOT / "tests" / "sanity"
    want = {f"ignore-2.{minor}.txt" for minor in range(low, max(low, high) + 1)}
    assert want <= {p.name for p in sanity.glob("ignore-*.txt")}
    # The same exceptions with the same reasons on every version.
    assert len({(sanity / name).read_text() for name in want}) == 1


def test_a_version_other_than_the_package_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "ansible_collections" / "k3fleet" / "gpu"
    (fake / "plugins" / "modules").mkdir(parents=True)
    (fake / "galaxy.yml").write_text(yaml.safe_dump({"namespace": "k3fleet", "name": "gpu", "version": "9.9.9"}))
    with pytest.raises(BuildError, match="one version for both"):
        check_tree(fake)


def test_the_tarball_holds_the_tree_byte_for_byte(tmp_path: Path) -> None:
    tarball = build(ROOT, tmp_path)
    with tarfile.open(tarball) as tar:
        files = json.load(tar.extractfile("FILES.json"))["files"]  # type: ignore[arg-type]
        shipped = {f["name"]: f["chksum_sha256"] for f in files if f["ftype"] == "file"}
    ignored = yaml.safe_load((ROOT / "galaxy.yml").read_text())["build_ignore"]

    def kept(rel: Path) -> bool:
        return rel.name != "galaxy.yml" and not any(
            fnmatch.fnmatch(part, pat) or fnmatch.fnmatch(str(rel), pat) or str(rel).startswith(pat + "/")
            for pat in ignored for part in rel.parts)

    tree = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in ROOT.rglob("*") if p.is_file() and kept(p.relative_to(ROOT))}
    assert shipped == tree
