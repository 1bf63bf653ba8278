"""The collection build's source rewrite: one copy of each module, two import forms."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from build_collection import FQ_UTILS, BuildError, rewrite_source  # noqa: E402

SOURCES = sorted((REPO / "k3fleet" / "ansible" / "modules").glob("k3fleet_*.py")) + sorted(
    (REPO / "k3fleet" / "ansible" / "module_utils").glob("k3fleet_*.py"))


def _imported_modules(source: str) -> set[str]:
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _names(source: str, prefix: str) -> set[tuple[str, str]]:
    return {(n.module.rsplit(".", 1)[-1], a.asname or a.name) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(prefix) for a in n.names}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_collection_form_imports_only_the_collection(path: Path) -> None:
    original = path.read_text()
    rewritten = rewrite_source(original, docs=path.parent.name == "modules")
    before, after = _imported_modules(original), _imported_modules(rewritten)
    assert not any(m.startswith("k3fleet") for m in after), "the controller-package fallback must not ship"
    assert not any(m.startswith("ansible.module_utils.k3fleet_") for m in after)
    # Every module_util the source used is still imported, under the collection's name.
    wanted = {FQ_UTILS + m.split(".")[-1] for m in before if m.startswith("ansible.module_utils.k3fleet_")}
    assert wanted <= after
    # The same names come in, only from the collection's namespace.
    assert _names(original, "ansible.module_utils.k3fleet_") == _names(rewritten, FQ_UTILS)
    if path.parent.name == "modules":
        assert "\n  - k3fleet_reader\n" not in rewritten
        assert "\nmodule: k3fleet_" in rewritten  # the module's own name stays short


def test_a_bare_controller_import_is_refused() -> None:
    with pytest.raises(BuildError, match="k3fleet"):
        rewrite_source("from k3fleet.ansible.module_utils.k3fleet_cmd import guard\n")


def test_fallback_block_is_flattened_with_its_indentation() -> None:
    src = (
        "def load():\n"
        "    try:\n"
        "        from ansible.module_utils.k3fleet_cmd import guard, unknown as unk\n"
        "    except ImportError:  # controller package\n"
        "        from k3fleet.ansible.module_utils.k3fleet_cmd import guard, unknown as unk\n"
        "    return guard, unk\n"
    )
    out = rewrite_source(src)
    assert out == (
        "def load():\n"
        f"    from {FQ_UTILS}k3fleet_cmd import guard, unknown as unk\n"
        "    return guard, unk\n"
    )
