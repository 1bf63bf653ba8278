# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
"""k3fleet.gpu.k3fleet_host_info: the options a task leaves out come from the audit's variables.

The audit play (playbooks/audit.yml) sets no option itself. For each option the task does not give,
this action takes, in this order: the option's variable (``OPTION_VARIABLES``: inventory, group,
host or extra vars, as the site sets them), then the play's ``k3fleet_audit_defaults``
(playbooks/vars/audit_defaults.yml: the defaults of a run without the k3fleet CLI), then the module's
own default. That is what the play said before as one ``{{ var | default(defaults.x) }}`` template
per option; Ansible 2.19 compiles each template of a task anew in every host's fork, 17 of them
about 0.024 s of controller CPU per host (docs/scale.md, "The controller's share"), where reading a
variable is a dictionary lookup. A variable's own value is still templated, so an inventory may
write one as a template.

Two options are derived, as the play derived them:
  - ``image``: the variable ``k3fleet_image``, else the target file's ``image.ref``
    (``k3fleet_audit_defaults.target_file``), so the image is named in one place, the target;
  - ``budget``: 0.8 of the host's time (``k3fleet_host_timeout``, else the defaults' ``host_timeout``),
    so partial facts come back before the task's own timeout kills it.
An option the task gives (a play of the site's own) always wins. On the node each payload source
compiles once (plugins/plugin_utils/k3fleet_action.py); the module's result is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ansible.errors import AnsibleActionFail

from ansible_collections.k3fleet.gpu.plugins.plugin_utils.k3fleet_action import K3fleetModuleAction

# option -> (its variable, its key in k3fleet_audit_defaults or None)
OPTION_VARIABLES = {
    "host": ("inventory_hostname", None),
    "runtime": ("k3fleet_container_runtime", "container_runtime"),
    "probe": ("k3fleet_probe", "probe"),
    "active": ("k3fleet_active", None),
    "active_spec": ("k3fleet_active_spec", None),
    "counter_interval": ("k3fleet_counter_interval", None),
    "use_nvml": ("k3fleet_use_nvml", "use_nvml"),
    "env_files": ("k3fleet_env_files", "env_files"),
    "lspci": ("k3fleet_lspci", "lspci"),
    "slurm_node": ("k3fleet_slurm_node", None),
    "root": ("k3fleet_root", "root"),
    "procfs": ("k3fleet_procfs", None),
    "sysfs": ("k3fleet_sysfs", None),
    "path": ("k3fleet_path", None),
    "timeout": ("k3fleet_command_timeout", "command_timeout"),
}
DEFAULTS_VARIABLE = "k3fleet_audit_defaults"
_MISSING = object()
# The share of the host's time the module may spend before it returns what it has.
BUDGET_SHARE = 0.8


class ActionModule(K3fleetModuleAction):
    """Ansible's normal action for k3fleet_host_info, its left-out options read from the audit's variables."""

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars if task_vars is not None else {}
        self._task.args = resolve_options(self._task.args, task_vars, self._templar.template, self._target_image)
        return super().run(tmp=tmp, task_vars=task_vars)

    def _target_image(self, target_file: object) -> str:
        """``image.ref`` of the target file at ``target_file`` (on the controller), as the play's
        ``lookup('file', ...) | from_yaml`` read it."""
        try:
            data = self._loader.load_from_file(str(target_file))
        except Exception as exc:
            # One line: the loader's own message may run over several.
            reason = " ".join(str(exc).split())
            raise AnsibleActionFail("cannot read the target file {0}: {1}".format(target_file, reason)) from None
        image = data.get("image") if isinstance(data, Mapping) else None
        ref = image.get("ref") if isinstance(image, Mapping) else None
        if not isinstance(ref, str) or not ref:
            raise AnsibleActionFail("the target file {0} has no image.ref".format(target_file))
        return ref


def resolve_options(args: Mapping[str, Any], task_vars: Mapping[str, Any], template: Callable[[Any], Any],
                    target_image: Callable[[Any], str]) -> dict[str, Any]:
    """``args`` with every option it leaves out filled from ``task_vars`` (module docstring).

    ``template`` renders a variable's value (the task's templar); ``target_image`` reads a target
    file's image reference. Options the module would default are left out when no variable names them."""
    resolved = dict(args)
    defaults = _defaults(task_vars, template)

    def lookup(variable: str, default_key: str | None) -> Any:
        """The variable's value, else the defaults' ``default_key``, templated; _MISSING if neither."""
        if variable in task_vars:
            return template(task_vars[variable])
        if default_key is not None and default_key in defaults:
            return template(defaults[default_key])
        return _MISSING

    for option, (variable, default_key) in OPTION_VARIABLES.items():
        if option not in resolved:
            value = lookup(variable, default_key)
            if value is not _MISSING:
                resolved[option] = value
    if "image" not in resolved:
        if "k3fleet_image" in task_vars:
            resolved["image"] = template(task_vars["k3fleet_image"])
        elif "target_file" in defaults:
            # A lookup: rendered only when no image is given.
            resolved["image"] = target_image(template(defaults["target_file"]))
    if "budget" not in resolved:
        host_timeout = lookup("k3fleet_host_timeout", "host_timeout")
        if host_timeout is not _MISSING and host_timeout is not None:
            try:
                resolved["budget"] = float(host_timeout) * BUDGET_SHARE
            except (TypeError, ValueError):
                raise AnsibleActionFail(
                    "k3fleet_host_timeout is not a number of seconds: {0!r}".format(host_timeout)) from None
    return resolved


def _defaults(task_vars: Mapping[str, Any], template: Callable[[Any], Any]) -> Mapping[str, Any]:
    """The play's ``k3fleet_audit_defaults`` as a mapping (empty where the play has none), its values
    not yet templated: only those an option needs are (``target_file`` is a lookup)."""
    if DEFAULTS_VARIABLE not in task_vars:
        return {}
    defaults = task_vars[DEFAULTS_VARIABLE]
    if not isinstance(defaults, Mapping):
        # A site's own defaults written as one template.
        defaults = template(defaults)
    if not isinstance(defaults, Mapping):
        raise AnsibleActionFail("{0} is not a mapping".format(DEFAULTS_VARIABLE))
    return defaults
