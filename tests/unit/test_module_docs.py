"""Every k3fleet module documents exactly the options it accepts (shared ones through the
k3fleet_reader doc fragment), and ansible-doc renders them all."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from k3fleet.ansible.doc_fragments.k3fleet_reader import ModuleDocFragment
from k3fleet.ansible.module_utils.k3fleet_module import READER_ARGS

ANSIBLE_DIR = Path(__file__).resolve().parents[2] / "k3fleet" / "ansible"
MODULES = sorted(p.stem for p in (ANSIBLE_DIR / "modules").glob("k3fleet_*.py"))


class _Captured(Exception):
    pass


def argument_spec(name: str) -> dict[str, Any]:
    """The argument_spec main() hands to AnsibleModule, without running the module."""
    module = importlib.import_module(f"k3fleet.ansible.modules.{name}")
    captured: dict[str, Any] = {}

    def fake_init(self: Any, argument_spec: dict[str, Any], **kwargs: Any) -> None:
        captured.update(argument_spec)
        raise _Captured

    with mock.patch("ansible.module_utils.basic.AnsibleModule.__init__", fake_init), pytest.raises(_Captured):
        module.main()
    return captured


def documented_options(name: str) -> dict[str, Any]:
    module = importlib.import_module(f"k3fleet.ansible.modules.{name}")
    doc = yaml.safe_load(module.DOCUMENTATION)
    options = dict(doc.get("options") or {})
    if "k3fleet_reader" in (doc.get("extends_documentation_fragment") or []):
        shared = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
        assert not set(options) & set(shared), f"{name} repeats shared options"
        options.update(shared)
    return options


def test_fragment_documents_exactly_the_shared_options() -> None:
    shared = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    assert set(shared) == set(READER_ARGS)


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name: str) -> None:
    spec = argument_spec(name)
    docs = documented_options(name)
    assert set(docs) == set(spec), name
    for key, s in spec.items():
        assert docs[key]["type"] == s.get("type", "str"), (name, key)
        assert docs[key].get("default") == s.get("default"), (name, key)
        if "choices" in s:
            assert docs[key]["choices"] == s["choices"], (name, key)


def test_ansible_doc_renders_every_module() -> None:
    env = dict(os.environ, ANSIBLE_MODULE_UTILS=str(ANSIBLE_DIR / "module_utils"),
               ANSIBLE_DOC_FRAGMENT_PLUGINS=str(ANSIBLE_DIR / "doc_fragments"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "-M", str(ANSIBLE_DIR / "modules"),
                           "--json", *MODULES], capture_output=True, text=True, env=env, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    assert set(docs) == set(MODULES)
    for name in MODULES:
        assert set(docs[name]["doc"]["options"]) == set(argument_spec(name)), name
