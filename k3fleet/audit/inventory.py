"""Read an Ansible inventory before running anything, so a malformed one fails in one clear line.

Besides the host names, the controller reads the k3fleet variables every host carries (from the
inventory, ``group_vars/`` and ``host_vars/``) and validates their types strictly: Ansible's
``| bool`` turns ``k3fleet_lspci: sometimes`` into ``false`` without a word, which silently
switches a check off. It also finds the hosts whose inventory turns host-key checking off
(docs/safety.md "Host keys"), so that choice is applied and recorded, never implicit.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from k3fleet.bounds import check_yaml, read_input
from k3fleet.errors import UsageError

# Ansible's own spellings of a boolean (ansible.module_utils.parsing.convert_bool).
_TRUE = frozenset({"y", "yes", "on", "1", "true", "t"})
_FALSE = frozenset({"n", "no", "off", "0", "false", "f"})
_RUNTIMES = ("auto", "docker", "podman", "nerdctl")
_SCHEDULERS = ("slurm", "kubernetes", "manual", "none")

# Inventory variables whose value turns host-key checking off for a host.
HOST_KEY_VARS = ("k3fleet_host_key_checking", "ansible_host_key_checking", "ansible_ssh_host_key_checking")
_UNCHECKED_SSH_ARG = re.compile(r"StrictHostKeyChecking[= ]+[\"']?(no|off|false)\b", re.IGNORECASE)


def as_bool(value: Any) -> bool | None:
    """``value`` as a boolean the way Ansible spells them, or None when it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    return None


def _check_bool(value: Any) -> str | None:
    return None if as_bool(value) is not None else "a boolean (true/false)"


def _check_str(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _check_str_list(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return None if ok else "a list of strings"


def _check_choice(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"one of {', '.join(choices)}"
    return check


def _check_positive(kind: type) -> Callable[[Any], str | None]:
    what = "a whole number of seconds above 0" if kind is int else "a number of seconds above 0"

    def check(value: Any) -> str | None:
        if isinstance(value, bool):
            return what
        try:
            number = kind(value) if isinstance(value, str) else value
        except ValueError:
            return what
        ok = isinstance(number, int) if kind is int else isinstance(number, int | float)
        return None if ok and number > 0 else what
    return check


# The k3fleet variables an inventory may set, and what each must be. Playbooks read them with
# Jinja filters that coerce anything (``| bool``, ``| int``): the type is checked here instead.
HOST_VARS: Mapping[str, Callable[[Any], str | None]] = {
    "k3fleet_probe": _check_bool,
    "k3fleet_use_nvml": _check_bool,
    "k3fleet_lspci": _check_bool,
    "k3fleet_has_pynvml": _check_bool,
    "k3fleet_host_key_checking": _check_bool,
    "k3fleet_root": _check_str,
    "k3fleet_procfs": _check_str,
    "k3fleet_sysfs": _check_str,
    "k3fleet_path": _check_str,
    "k3fleet_image": _check_str,
    "k3fleet_slurm_node": _check_str,
    "k3fleet_slurm_client": _check_str,
    "k3fleet_slurm_path": _check_str,
    "k3fleet_slurm_conf": _check_str,
    "k3fleet_lab_profile": _check_str,
    "k3fleet_env_files": _check_str_list,
    "k3fleet_container_runtime": _check_choice(*_RUNTIMES),
    "k3fleet_scheduler": _check_choice(*_SCHEDULERS),
    "k3fleet_host_timeout": _check_positive(int),
    "k3fleet_command_timeout": _check_positive(float),
}


def _check_port(value: Any) -> str | None:
    what = "a TCP port (1-65535)"
    if isinstance(value, bool):
        return what
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return None if isinstance(value, int) and 1 <= value <= 65535 else what


def _check_connection(value: Any) -> str | None:
    """A connection plugin Ansible has: a bare name (``ssh``) or ``ansible.builtin.<name>`` is looked up;
    another collection's plugin (``community.docker.docker``) is left to Ansible, which loads collections."""
    if not isinstance(value, str) or not value.strip():
        return "the name of a connection plugin (ssh, local, paramiko_ssh, ...)"
    name = value.strip().removeprefix("ansible.builtin.")
    if "." in name:
        return None
    from ansible.plugins.loader import connection_loader  # lazy: Ansible is heavy, kept off the CLI's start-up path

    if connection_loader.has_plugin(name):
        return None
    return "a connection plugin Ansible has (ssh, local, paramiko_ssh, ...)"


# Ansible's own connection variables that k3fleet checks too: a value that cannot work (``ansible_port: abc``,
# a connection plugin that does not exist) is bad input before the play, not an unreachable host after it.
ANSIBLE_VARS: Mapping[str, Callable[[Any], str | None]] = {
    "ansible_port": _check_port,
    "ansible_ssh_port": _check_port,
    "ansible_connection": _check_connection,
}


@dataclass(frozen=True)
class Inventory:
    """What the controller knows about an inventory before the play: hosts and their checked k3fleet vars."""

    path: Path
    hosts: list[str]
    host_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    # host -> the inventory setting that turns its host-key checking off
    host_key_opt_outs: dict[str, str] = field(default_factory=dict)


def inventory_hosts(inventory: Path, limit: str | None = None) -> list[str]:
    """Host names of ``inventory`` (after ``limit``), parsed by Ansible's own inventory code; their
    k3fleet variables validated (UsageError naming host, variable, value and expected type)."""
    return load_inventory(inventory, limit).hosts


def load_inventory(inventory: Path, limit: str | None = None) -> Inventory:
    """The parsed and validated inventory (cached per file state: audit and runner parse it once)."""
    inventory = Path(inventory)
    if not inventory.exists() and not inventory.is_symlink():
        raise UsageError(f"inventory {inventory} does not exist")
    state = _state(inventory)
    check_inventory_files(inventory)
    return _load(inventory.resolve(), state, limit)


# Files Ansible's inventory and vars plugins read as YAML (or JSON, which is YAML); an extensionless file may be
# either YAML or INI: it is judged as YAML only when it parses as YAML.
_YAML_NAMES = (".yml", ".yaml", ".json")


def _inventory_files(inventory: Path) -> list[tuple[str, Path]]:
    """(what, path) of the inventory file (or every file of an inventory directory) and of the files in the
    group_vars/ and host_vars/ beside it: what Ansible will read."""
    if inventory.is_dir():
        files, roots = [], [inventory]
    else:
        files, roots = [("inventory", inventory)], [inventory.parent / "group_vars", inventory.parent / "host_vars"]
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [("inventory file", Path(dirpath) / n) for n in sorted(names) if not n.startswith(".")]
    return files


@lru_cache(maxsize=16)
def _checked(inventory: Path, _stamp: tuple[int, ...]) -> None:
    for what, f in _inventory_files(inventory):
        # Regular files under the inventory cap only: a FIFO would hang Ansible's read, /dev/zero or a huge
        # sparse file would fill memory (docs/safety.md "Bounds").
        raw = read_input(f, what, kind="an inventory file", limit="inventory")
        if f.suffix and f.suffix.lower() not in _YAML_NAMES:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary: Ansible refuses it in its own words
        # Depth and alias budget before Ansible's loader expands anything (an alias bomb in a host variable).
        check_yaml(text, f"{what} {f}")


def check_inventory_files(inventory: Path) -> None:
    """Refuse, in one line, an inventory file or vars file that is not a regular file, is above the
    ``inventory`` cap, or is YAML nested too deep or with too many nodes once its aliases are expanded:
    all before Ansible reads it."""
    _checked(inventory, _state(inventory))


def _state(inventory: Path) -> tuple[int, ...]:
    """Modification times of the inventory and the vars directories next to it (the cache key)."""
    base = inventory if inventory.is_dir() else inventory.parent
    stamps = []
    # An inventory directory is all inventory: every file in it counts.
    watched = (inventory,) if inventory.is_dir() else (inventory, base / "group_vars", base / "host_vars")
    for p in watched:
        with contextlib.suppress(OSError):
            stamps.append(p.stat().st_mtime_ns)
        if p.is_dir():
            for dirpath, _dirs, files in os.walk(p):
                for name in files:
                    with contextlib.suppress(OSError):
                        stamps.append(os.stat(os.path.join(dirpath, name)).st_mtime_ns)
    return tuple(stamps)


@lru_cache(maxsize=16)
def _load(inventory: Path, _stamp: tuple[int, ...], limit: str | None) -> Inventory:
    hosts, manager, loader = _hosts(inventory, limit)
    from ansible.vars.manager import VariableManager  # lazy: Ansible is heavy, kept off the CLI's start-up path

    vm = VariableManager(loader=loader, inventory=manager)
    problems: list[str] = []
    host_vars: dict[str, dict[str, Any]] = {}
    opt_outs: dict[str, str] = {}
    for host in hosts:
        # get_vars adds group_vars/ and host_vars/ next to the inventory to what the inventory says.
        merged = vm.get_vars(host=host, include_hostvars=False)
        mine: dict[str, Any] = {}
        for name, check in HOST_VARS.items():
            if name not in merged:
                continue
            value = merged[name]
            if isinstance(value, str) and "{{" in value:
                continue  # a template: Ansible resolves it, the module's argument spec checks it
            expected = check(value)
            if expected is not None:
                problems.append(f"host {host.name}: {name} = {_shown(value)}: expected {expected}")
            mine[name] = value
        for name, check in ANSIBLE_VARS.items():
            value = merged.get(name)
            if value is None or (isinstance(value, str) and "{{" in value):
                continue
            expected = check(value)
            if expected is not None:
                problems.append(f"host {host.name}: {name} = {_shown(value)}: expected {expected}")
        for name in HOST_KEY_VARS:
            if name in merged and as_bool(merged[name]) is False:
                opt_outs.setdefault(host.name, f"{name}: false")
        ssh_args = merged.get("ansible_ssh_args")
        if isinstance(ssh_args, str) and _UNCHECKED_SSH_ARG.search(ssh_args):
            opt_outs.setdefault(host.name, "ansible_ssh_args: StrictHostKeyChecking=no")
        host_vars[host.name] = mine
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"inventory {inventory}: {problems[0]}{more}")
    return Inventory(path=inventory, hosts=[h.name for h in hosts], host_vars=host_vars, host_key_opt_outs=opt_outs)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refuse_simulated(inventory: Path, limit: str | None = None) -> list[str]:
    """Host names, refusing simulated lab hosts: a change on one would run apt on the controller."""
    inv = load_inventory(inventory, limit)
    fake = []
    for name in inv.hosts:
        hv = inv.host_vars.get(name, {})
        root = hv.get("k3fleet_root")
        if hv.get("k3fleet_lab_profile") or (root not in (None, "", "/")):
            fake.append(f"{name} (k3fleet_root={root})")
    if fake:
        raise UsageError(f"inventory {inventory} has simulated lab hosts, which cannot be changed: "
                         f"{', '.join(fake[:5])}{' ...' if len(fake) > 5 else ''}")
    return inv.hosts


def _hosts(inventory: Path, limit: str | None) -> tuple[list[Any], Any, Any]:
    # lazy: Ansible is heavy, kept off the CLI's start-up path (this module is on it)
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    captured = io.StringIO()
    loader = DataLoader()
    try:
        # Ansible explains a parse failure in warnings, one per plugin tried: keep the best one.
        with contextlib.redirect_stderr(captured):
            manager = InventoryManager(loader=loader, sources=[str(inventory)])
            if limit:
                manager.subset(limit)
            hosts = list(manager.get_hosts())
    except AnsibleError as exc:
        detail = _parse_reason(captured.getvalue()) or " ".join(str(exc).split())
        raise UsageError(f"inventory {inventory} cannot be parsed: {detail[:300]}") from exc
    # By default Ansible only warns about a source no plugin could parse: here that is an error.
    reason = _parse_reason(captured.getvalue())
    if reason:
        raise UsageError(f"inventory {inventory} cannot be parsed: {reason[:300]}")
    if not hosts:
        what = f" matching --limit {limit!r}" if limit else ""
        raise UsageError(f"inventory {inventory} has no hosts{what}")
    return hosts, manager, loader


_PLUGIN_WARNING = re.compile(r"Failed to parse inventory with '(?P<plugin>[\w.]+)' plugin: (?P<why>[^\n]+)")


def _parse_reason(warnings: str) -> str | None:
    """The most telling plugin complaint: the structured formats before ini's guess."""
    found = {m.group("plugin"): m.group("why").strip() for m in _PLUGIN_WARNING.finditer(warnings)}
    for plugin in ("yaml", "auto", "toml", "ini"):
        if plugin in found:
            origin = re.search(r"Origin: (\S+:\d+:\d+)", warnings)
            return found[plugin] + (f" ({origin.group(1)})" if origin else "")
    return next(iter(found.values()), None)
