"""Every k3fleet module documents exactly the options it accepts (shared ones through the
k3fleet_reader doc fragment), and ansible-doc renders them all."""

from __future__ import annotations

import importlib
from typing import Any
from unittest import mock

import pytest
import yaml

from ansible_collections.k3fleet.gpu.plugins.doc_fragments.k3fleet_reader import ModuleDocFragment
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import READER_ARGS
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import COLLECTION, ansible_doc, documentation

MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("k3fleet_*.py"))


class _Captured(Exception):
    pass


def argument_spec(name: str) -> dict[str, Any]:
    """The argument_spec main() hands to AnsibleModule, without running the module."""
    module = importlib.import_module(f"ansible_collections.k3fleet.gpu.plugins.modules.{name}")
    captured: dict[str, Any] = {}

    def fake_init(self: Any, argument_spec: dict[str, Any], **kwargs: Any) -> None:
        captured.update(argument_spec)
        raise _Captured

    with mock.patch("ansible.module_utils.basic.AnsibleModule.__init__", fake_init), pytest.raises(_Captured):
        module.main()
    return captured


def documented_options(name: str) -> dict[str, Any]:
    module = importlib.import_module(f"ansible_collections.k3fleet.gpu.plugins.modules.{name}")
    own_doc = yaml.safe_load(module.DOCUMENTATION)
    if "k3fleet.gpu.k3fleet_reader" in (own_doc.get("extends_documentation_fragment") or []):
        shared = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
        assert not set(own_doc.get("options") or {}) & set(shared), f"{name} repeats shared options"
    return dict(documentation(module).get("options") or {})


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
    docs = ansible_doc(*MODULES)
    assert set(docs) == set(MODULES)
    for name in MODULES:
        assert set(docs[name]["doc"]["options"]) == set(argument_spec(name)), name
