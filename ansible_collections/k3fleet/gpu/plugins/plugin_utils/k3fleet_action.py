# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
"""The action of every k3fleet module: Ansible's ``normal`` action, with each source of the payload compiled once.

A node has no bytecode cache for an AnsiballZ payload and zipimport compiles every source module it
imports twice (python/cpython#141276; k3fleet_load says why). A module can make its own imports
single-compile (k3fleet_load.install), but only after AnsiballZ's wrapper has imported Ansible's
module_utils (``ansible.module_utils._internal._ansiballz._loader`` imports ``basic`` and most of
the rest): about 50 files, half of a module run's CPU on a node. This action builds the module
exactly as ``normal`` does and, for a module of this collection, inserts into the built wrapper,
right before that import, a guarded call of ``k3fleet_load.install_payload()``: from there every
source in the payload compiles once. Any exception in it is swallowed on the node, so the module
runs as it would unpatched.

The wrapper is changed only where its text is the one this was written against (ansible-core
2.19's ``invoke_module``: the payload put first on ``sys.path``, then that import), found exactly
once; any other wrapper (ansible-core 2.17 and 2.18 import ``basic`` themselves) goes out as
Ansible built it. The module's arguments, its result and everything else of the task are
Ansible's own.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ansible.plugins.action.normal import ActionModule as NormalActionModule

# The modules of this collection (plugins/modules beside plugins/plugin_utils).
MODULES_DIR = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "modules"))

# ansible-core 2.19's invoke_module (ansible/_internal/_ansiballz/_wrapper.py), with or without the
# comments Ansible strips from the wrapper unless remote files are kept: the payload first on
# sys.path, a blank line, then the import of Ansible's module_utils.
ANCHOR = (b"        sys.path.insert(0, modlib_path)\n"
          b"\n"
          b"        from ansible.module_utils._internal._ansiballz import _loader\n")
_INSERT_AT = len(b"        sys.path.insert(0, modlib_path)\n")
MARKER = b"# k3fleet.gpu: one compile per payload source"
SNIPPET = (b"        " + MARKER + b" (python/cpython#141276; k3fleet_load.install_payload)\n"
           b"        try:\n"
           b"            from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load\n"
           b"            k3fleet_load.install_payload()\n"
           b"        except Exception:\n"
           b"            pass\n")


def patch_wrapper(data: bytes) -> bytes:
    """``data`` (an AnsiballZ wrapper) with the install call before Ansible's module_utils import;
    ``data`` itself unless the anchor is there exactly once. (A patched wrapper has the call inside
    the anchor's text, so it has no anchor left: patching twice changes nothing.)"""
    found = data.find(ANCHOR)
    if found < 0 or data.find(ANCHOR, found + 1) >= 0:
        return data
    at = found + _INSERT_AT
    return data[:at] + SNIPPET + data[at:]


def is_collection_module(module_path: str | None) -> bool:
    """Whether ``module_path`` is one of this collection's modules (each imports k3fleet_load)."""
    if not module_path:
        return False
    return os.path.dirname(os.path.realpath(module_path)) == MODULES_DIR


def patch_built(built: Any, module_path: str | None) -> Any:
    """``_configure_module``'s module (ansible-core 2.19: a ``_BuiltModule``; 2.17 and 2.18 give the
    wrapper's bytes) with its wrapper patched where :func:`patch_wrapper` applies; else as given."""
    if not is_collection_module(module_path):
        return built
    if isinstance(built, bytes):
        return patch_wrapper(built)
    data = getattr(built, "b_module_data", None)
    if getattr(built, "module_style", None) != "new" or not isinstance(data, bytes):
        return built
    patched = patch_wrapper(data)
    if patched is data:
        return built
    try:
        return dataclasses.replace(built, b_module_data=patched)
    except TypeError:
        # Not the dataclass this was written against: the module as Ansible built it.
        return built


class K3fleetModuleAction(NormalActionModule):
    """Ansible's ``normal`` action; the module's AnsiballZ wrapper compiles each payload source once."""

    def _configure_module(self, module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]) -> Any:
        configured = super()._configure_module(module_name=module_name, module_args=module_args, task_vars=task_vars)
        if isinstance(configured, tuple) and len(configured) == 2:
            # ansible-core 2.19 and later: (built module, module path).
            built, module_path = configured
            return patch_built(built, module_path), module_path
        if isinstance(configured, tuple) and len(configured) == 4:
            # ansible-core 2.17 and 2.18: (style, shebang, wrapper bytes, module path).
            style, shebang, data, module_path = configured
            if style == "new":
                data = patch_built(data, module_path)
            return style, shebang, data, module_path
        return configured
