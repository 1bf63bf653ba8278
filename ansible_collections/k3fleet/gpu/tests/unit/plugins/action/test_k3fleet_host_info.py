"""k3fleet_host_info's action on its own: what it adds to a task outside the audit play, how a bad
variable fails the task, and that every option it fills in is one the module documents.

How the audit play's variables and defaults become the options (the play's vars file, the target's
image) is tested with the play in the repository (tests/unit/test_host_info_options.py).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleActionFail

from ansible_collections.k3fleet.gpu.plugins.action.k3fleet_host_info import OPTION_VARIABLES
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import COLLECTION, resolve_host_info


def test_outside_the_audit_play_nothing_is_added_but_the_hostname() -> None:
    # A site's own play with no k3fleet variables: the module's defaults, as before.
    assert resolve_host_info({"image": "x"}, {"inventory_hostname": "n1"}) == {"image": "x", "host": "n1"}


def _documented_options(path: Path) -> set[str]:
    """The options a plugin file's DOCUMENTATION lists (read from its source, not imported)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            return set(yaml.safe_load(ast.literal_eval(node.value))["options"])
    raise AssertionError(f"no DOCUMENTATION in {path}")


def test_every_option_named_is_an_option_of_the_module() -> None:
    plugins = COLLECTION / "plugins"
    documented = (_documented_options(plugins / "modules" / "k3fleet_host_info.py")
                  | _documented_options(plugins / "doc_fragments" / "k3fleet_reader.py"))
    # facts_format is the play's own choice of form, never a site's variable.
    assert set(OPTION_VARIABLES) | {"image", "budget", "facts_format"} == documented


@pytest.mark.parametrize("task_vars, words", [
    ({"k3fleet_host_timeout": "soon"}, "k3fleet_host_timeout is not a number of seconds: 'soon'"),
    ({"k3fleet_audit_defaults": ["not", "a", "mapping"]}, "k3fleet_audit_defaults is not a mapping"),
])
def test_bad_variables_fail_the_task_in_one_line(task_vars: dict[str, Any], words: str) -> None:
    with pytest.raises(AnsibleActionFail) as raised:
        resolve_host_info({}, {"inventory_hostname": "n1", **task_vars})
    assert str(raised.value) == words
