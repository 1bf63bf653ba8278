"""Build the Ansible collection k3fleet.gpu from its tree, as it is (make collection).

The collection is one tree in the repository, ``ansible_collections/k3fleet/gpu/`` (galaxy.yml,
meta/, plugins/modules, plugins/module_utils, plugins/doc_fragments, roles/, tests/sanity/). The
k3fleet CLI, the wheel and an AWX project run that same tree, so nothing is copied or rewritten
here: this script checks that the tree is what ansible-galaxy expects, then runs
`ansible-galaxy collection build` on it.

    python scripts/build_collection.py [--output dist]
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "k3fleet", "gpu"
ROOT = REPO / "ansible_collections" / NAMESPACE / NAME
FQ_UTILS = f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils."


class BuildError(RuntimeError):
    """The collection tree is not buildable as it is (one line)."""


def node_side_problems(path: Path) -> list[str]:
    """What in one plugin source would not run on a node: imports of the controller package or of
    module_utils by a short name (only the collection path resolves everywhere)."""
    problems = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            if name == "k3fleet" or name.startswith("k3fleet."):
                problems.append(f"{path.name}:{node.lineno}: imports the controller package ({name})")
            elif name.startswith("ansible.module_utils.k3fleet_"):
                problems.append(f"{path.name}:{node.lineno}: imports {name} by its short name; use {FQ_UTILS}...")
    return problems


def check_tree(root: Path = ROOT) -> dict[str, object]:
    """The tree's galaxy.yml, after checking what a build relies on; BuildError names the first fault."""
    try:
        galaxy = yaml.safe_load((root / "galaxy.yml").read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BuildError(f"{root / 'galaxy.yml'}: {exc}") from exc
    if (galaxy.get("namespace"), galaxy.get("name")) != (NAMESPACE, NAME):
        raise BuildError(f"galaxy.yml names {galaxy.get('namespace')}.{galaxy.get('name')}, not {NAMESPACE}.{NAME}")
    sys.path.insert(0, str(REPO))
    import k3fleet

    if str(galaxy.get("version")) != k3fleet.__version__:
        raise BuildError(f"galaxy.yml version {galaxy.get('version')} is not the k3fleet package's "
                         f"{k3fleet.__version__}: one version for both")
    problems = [p for kind in ("modules", "module_utils")
                for src in sorted((root / "plugins" / kind).glob("*.py")) for p in node_side_problems(src)]
    if problems:
        raise BuildError(f"{len(problems)} node-side import problem(s), first: {problems[0]}")
    return galaxy


def build(root: Path, output: Path) -> Path:
    galaxy_meta = check_tree(root)
    output.mkdir(parents=True, exist_ok=True)
    galaxy = shutil.which("ansible-galaxy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if galaxy is None:
        raise BuildError("ansible-galaxy not found: install ansible-core")
    proc = subprocess.run([galaxy, "collection", "build", str(root), "--output-path", str(output), "--force"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"ansible-galaxy collection build failed: {' '.join(proc.stderr.split())[-400:]}")
    tarball = output / f"{NAMESPACE}-{NAME}-{galaxy_meta['version']}.tar.gz"
    if not tarball.is_file():
        raise BuildError(f"ansible-galaxy reported success but {tarball} is missing")
    return tarball


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=REPO / "dist")
    args = ap.parse_args()
    try:
        print(build(ROOT, args.output.resolve()))
    except (BuildError, OSError, SyntaxError) as exc:
        print(f"build_collection: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
