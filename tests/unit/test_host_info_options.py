"""k3fleet_host_info's action: the options a task leaves out come from the audit's variables.

playbooks/audit.yml sets no option of the module; the action (plugins/action/k3fleet_host_info.py)
reads each from its variable, else from the play's ``k3fleet_audit_defaults``, else leaves it to the
module's default, as the play's ``{{ var | default(defaults.x) }}`` templates did. Rendered here with
Ansible's own templar and data loader, as the action renders them in a host's fork; the whole play
runs in tests/integration (test_audit_lab, test_merge and test_awx_stream: the CLI's extra vars, and
ansible-runner without them, where the image comes from the target file). The action's own rules
without the audit play (a site's play, bad variables, the documented options) are tested with the
collection (ansible_collections/k3fleet/gpu/tests/unit/plugins/action/test_k3fleet_host_info.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import trust_as_template

from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import resolve_host_info

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "k3fleet" / "targets" / "kimi-k3.yaml"
PLAY_DEFAULTS = REPO / "playbooks" / "vars" / "audit_defaults.yml"




def _play_defaults() -> dict[str, Any]:
    """The play's k3fleet_audit_defaults, loaded as Ansible loads vars_files (trusted templates).

    Its target_file is a first_found lookup, which needs Ansible's plugin loader (and that, once
    initialised, changes how this process imports the collection): here it is the file the lookup
    finds in this checkout. The lookup itself runs in the plays of tests/integration/test_merge.py."""
    loaded = DataLoader().load_from_file(str(PLAY_DEFAULTS), trusted_as_template=True)
    defaults = dict(loaded["k3fleet_audit_defaults"])
    assert "first_found" in defaults["target_file"] and "/k3fleet/targets/kimi-k3.yaml" in defaults["target_file"]
    defaults["target_file"] = str(TARGET)
    return {"k3fleet_audit_defaults": defaults, "playbook_dir": str(REPO / "playbooks")}


def test_the_clis_extra_vars_become_the_options() -> None:
    task_vars = {"inventory_hostname": "gpu-a01", "k3fleet_image": "vllm/vllm-openai:kimi-k3",
                 "k3fleet_host_timeout": 300.0, "k3fleet_command_timeout": 20.0, "k3fleet_probe": True,
                 "k3fleet_active": "quick", "k3fleet_active_spec": {"dcgm": {"level": 1}},
                 "k3fleet_root": "/lab/gpu-a01", "k3fleet_path": "/lab/bin", **_play_defaults()}
    resolved = resolve_host_info({}, task_vars)
    assert resolved == {
        "host": "gpu-a01", "image": "vllm/vllm-openai:kimi-k3", "runtime": "auto", "probe": True,
        "active": "quick", "active_spec": {"dcgm": {"level": 1}}, "use_nvml": True, "env_files": [],
        "lspci": True, "root": "/lab/gpu-a01", "path": "/lab/bin", "timeout": 20.0, "budget": 240.0,
    }


def test_without_variables_the_play_defaults_apply_and_the_image_is_the_targets() -> None:
    resolved = resolve_host_info({}, {"inventory_hostname": "gpu-b07", **_play_defaults()})
    target = yaml.safe_load(TARGET.read_text())
    defaults = yaml.safe_load(PLAY_DEFAULTS.read_text())["k3fleet_audit_defaults"]
    assert resolved["image"] == target["image"]["ref"]
    assert resolved["budget"] == pytest.approx(defaults["host_timeout"] * 0.8)
    assert resolved["timeout"] == defaults["command_timeout"]
    assert resolved["runtime"] == defaults["container_runtime"]
    # Options neither a variable nor the defaults name are left to the module's own default.
    for option in ("active", "active_spec", "slurm_node", "procfs", "sysfs", "path"):
        assert option not in resolved


def test_a_task_option_wins_and_a_variable_beats_the_defaults() -> None:
    task_vars = {"inventory_hostname": "gpu-a01", "k3fleet_container_runtime": "podman",
                 "k3fleet_lspci": False, "k3fleet_image": "registry.invalid/site:1", **_play_defaults()}
    resolved = resolve_host_info({"runtime": "docker", "host": "named-by-task", "budget": 5.0}, task_vars)
    assert (resolved["runtime"], resolved["host"], resolved["budget"]) == ("docker", "named-by-task", 5.0)
    assert resolved["lspci"] is False
    assert resolved["image"] == "registry.invalid/site:1"


def test_a_variable_written_as_a_template_is_rendered() -> None:
    task_vars = {"inventory_hostname": "gpu-a01", "site_root": "/host",
                 "k3fleet_root": trust_as_template("{{ site_root }}"),
                 "k3fleet_host_timeout": trust_as_template("{{ 10 * 6 }}"), **_play_defaults()}
    resolved = resolve_host_info({}, task_vars)
    assert resolved["root"] == "/host"
    assert resolved["budget"] == pytest.approx(48.0)
