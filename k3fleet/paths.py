"""Where k3fleet's non-Python files live, from a checkout or from an installed wheel.

The wheel force-includes playbooks/, inventories/ and ansible.cfg under ``k3fleet/_data/``
(see pyproject.toml); a source checkout keeps them at the repository root. Callers ask for a
name and never need to know which case they are in.

The Ansible collection k3fleet.gpu (modules, module_utils, doc fragments, roles) is one tree,
``ansible_collections/k3fleet/gpu/``, beside the ``k3fleet`` package in both cases: at the
repository root in a checkout, in site-packages from the wheel (docs/architecture.md "Layout").
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The installed-wheel location is checked first: an installed package must not pick up a
# stray checkout that merely happens to be its parent directory.
_CANDIDATE_ROOTS = (PACKAGE_DIR / "_data", PACKAGE_DIR.parent)


def data_dir(name: str) -> Path:
    """Return the path of a packaged data entry (``playbooks``, ``roles``, ``inventories/lab``...).

    Raises FileNotFoundError naming every place that was looked at.
    """
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"data_dir: {name!r} must be a relative name inside the k3fleet data tree")
    for root in _CANDIDATE_ROOTS:
        candidate = root / rel
        if candidate.exists():
            return candidate
    looked = ", ".join(str(root / rel) for root in _CANDIDATE_ROOTS)
    raise FileNotFoundError(f"k3fleet data {name!r} not found (looked in: {looked})")


COLLECTION_NAMESPACE, COLLECTION_NAME = "k3fleet", "gpu"
COLLECTION_FQCN = f"{COLLECTION_NAMESPACE}.{COLLECTION_NAME}"


def collections_path() -> Path:
    """The directory holding ``ansible_collections/k3fleet/gpu`` (Ansible's COLLECTIONS_PATHS entry)."""
    return PACKAGE_DIR.parent


def collection_root() -> Path:
    """The collection's own root (galaxy.yml, plugins/, roles/, meta/)."""
    root = collections_path() / "ansible_collections" / COLLECTION_NAMESPACE / COLLECTION_NAME
    if not (root / "plugins" / "modules").is_dir():
        raise FileNotFoundError(f"the k3fleet.gpu collection is not installed beside the k3fleet package ({root})")
    return root
