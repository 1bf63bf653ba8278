"""Builders the collection's unit tests share: a node's file tree under a root prefix, commands replaying
recorded output, and module exits that raise instead of exiting.

One copy: the repository's own tests (tests/unit/nodetree.py) import these too. Only the collection,
ansible-core's module_utils and pytest are imported, so ``ansible-test units`` runs them from the built
collection.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.module_utils import basic

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader

# The recorded outputs these tests read, each area with a SOURCES.md naming its public source.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The collection's root (galaxy.yml), in the repository or where ansible-galaxy installed it.
COLLECTION = Path(__file__).resolve().parents[3]
FQCN = "k3fleet.gpu."


def fixture(area: str, name: str) -> str:
    """The text of fixtures/<area>/<name>."""
    return (FIXTURES / area / name).read_text(encoding="utf-8")


def exe(path: Path, body: str) -> None:
    """A /bin/sh script at path running body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def fake_command(bin_dir: Path, name: str, cases: list[tuple[str, str, str, int]], sleep: float = 0) -> None:
    """An executable replaying recorded output; cases are (shell glob on "$*", stdout, stderr, rc)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    if sleep:
        lines.append(f"/bin/sleep {sleep}")
    lines.append('case "$*" in')
    for pos, (pattern, out, err, rc) in enumerate(cases):
        out_file = bin_dir / f".{name}.{pos}.out"
        err_file = bin_dir / f".{name}.{pos}.err"
        out_file.write_text(out, encoding="utf-8")
        err_file.write_text(err, encoding="utf-8")
        lines.append(f"  {pattern}) /bin/cat '{out_file}'; /bin/cat '{err_file}' >&2; exit {rc};;")
    lines += ["esac", "exit 127"]
    exe(bin_dir / name, "\n".join(lines))


def write_tree(root: Path, files: dict[str, str] | None = None) -> Path:
    """Files at their node paths under root (which is created even when there are none)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in (files or {}).items():
        target = root / rel.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


def node(tmp_path: Path, files: dict[str, str] | None = None, timeout: float = 10) -> NodeReader:
    """A reader over tmp_path/root with only tmp_path/bin on its PATH."""
    root = write_tree(tmp_path / "root", files)
    (tmp_path / "bin").mkdir(exist_ok=True)
    return NodeReader(root=str(root), path=str(tmp_path / "bin"), timeout=timeout)


class ExitJson(Exception):
    """AnsibleModule.exit_json was called; args[0] is the result."""


class FailJson(Exception):
    """AnsibleModule.fail_json was called; args[0] is the result."""


def nvswitch_node(tmp_path: Path, files: dict[str, str] | None = None,
                  switches: list[str] | None = None, dev: list[str] | None = None) -> NodeReader:
    """A node (``files`` under its root) whose procfs lists ``switches`` as NVSwitch devices and whose /dev
    holds ``dev``: the Fabric Manager collector's view of the node."""
    reader = node(tmp_path, files)
    root = tmp_path / "root"
    if switches is not None:
        devices = root / "proc" / "driver" / "nvidia-nvswitch" / "devices"
        devices.mkdir(parents=True)
        for bdf in switches:
            (devices / bdf).mkdir()
    if dev is not None:
        (root / "dev").mkdir()
        for name in dev:
            (root / "dev" / name).write_text("", encoding="utf-8")
    return reader


def resolve_host_info(args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
    """k3fleet_host_info's action filling in ``args`` from ``task_vars``, rendered with Ansible's own
    templar and data loader as in a host's fork (the target file read as the action reads it)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    from ansible_collections.k3fleet.gpu.plugins.action.k3fleet_host_info import resolve_options

    loader = DataLoader()
    templar = Templar(loader=loader, variables=task_vars)

    def target_image(path: str) -> str:
        return str(loader.load_from_file(path)["image"]["ref"])

    return resolve_options(args, task_vars, templar.template, target_image)


def patch_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """exit_json/fail_json raise instead of exiting (ansible-core test/units/modules/utils.py style)."""
    def exit_json(self: Any, **kwargs: Any) -> None:
        raise ExitJson(kwargs)

    def fail_json(self: Any, **kwargs: Any) -> None:
        raise FailJson(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


@contextlib.contextmanager
def module_args(args: dict[str, Any]) -> Iterator[None]:
    """The arguments an AnsibleModule built inside the block reads: ansible-core's own
    ``ansible.module_utils.testing.patch_module_args`` where it has one (2.19 and later), else what
    that helper replaces, the serialized ``basic._ANSIBLE_ARGS`` (2.17, 2.18)."""
    try:
        from ansible.module_utils.testing import patch_module_args
    except ImportError:
        pass
    else:
        with patch_module_args(args):
            yield
        return
    saved = basic._ANSIBLE_ARGS
    full = {"_ansible_remote_tmp": "/tmp", "_ansible_keep_remote_files": False, **args}
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": full}).encode("utf-8")
    try:
        yield
    finally:
        basic._ANSIBLE_ARGS = saved


# -- documentation: the collection's modules as ansible-doc sees them ----------------------------

def documentation(module: ModuleType) -> dict[str, Any]:
    """A module's DOCUMENTATION with its k3fleet.gpu doc fragments merged in (the module's own
    entries win, as ansible-doc merges them); each fragment named ``k3fleet.gpu.<file>[.<part>]``."""
    doc = yaml.safe_load(module.DOCUMENTATION)
    for entry in doc.get("extends_documentation_fragment") or []:
        if not entry.startswith(FQCN):
            raise AssertionError(f"{module.__name__}: doc fragment {entry} is not named by FQCN")
        name, _sep, part = entry[len(FQCN):].partition(".")
        fragment_cls = importlib.import_module(f"ansible_collections.k3fleet.gpu.plugins.doc_fragments.{name}")
        fragment = yaml.safe_load(getattr(fragment_cls.ModuleDocFragment, part.upper() or "DOCUMENTATION"))
        for key in ("options", "attributes"):
            merged = {**(fragment.get(key) or {})}
            for item, value in (doc.get(key) or {}).items():
                merged[item] = {**merged.get(item, {}), **value}
            if merged:
                doc[key] = merged
    return doc


def ansible_doc(*modules: str) -> dict[str, Any]:
    """``ansible-doc --json`` of the given short module names, found through this copy of the collection
    (its ``ansible_collections`` parent is the collections path); keyed by short name."""
    beside = Path(sys.executable).parent / "ansible-doc"
    command = str(beside) if beside.exists() else shutil.which("ansible-doc")
    assert command, "ansible-doc is neither beside this Python nor on PATH"
    # ansible-doc is a controller program: ansible-test's PYTHONPATH for module tests (ansible.module_utils
    # alone, as on a node) is not its own.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(COLLECTION.parents[2]), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([command, "-t", "module", "--json", *(FQCN + m for m in modules)],
                          capture_output=True, text=True, env=env, timeout=180, check=False,
                          cwd=COLLECTION.parents[2])
    assert proc.returncode == 0, proc.stderr
    return {name.removeprefix(FQCN): value for name, value in json.loads(proc.stdout).items()}
