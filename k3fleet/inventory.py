"""Read an Ansible inventory before running anything, so a malformed one fails in one clear line."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

from k3fleet.errors import UsageError


def inventory_hosts(inventory: Path, limit: str | None = None) -> list[str]:
    """Host names of ``inventory`` (after ``limit``), parsed by Ansible's own inventory code."""
    return [h.name for h in _hosts(inventory, limit)]


def refuse_simulated(inventory: Path, limit: str | None = None) -> list[str]:
    """Host names, refusing simulated lab hosts: a change on one would run apt on the controller."""
    hosts = _hosts(inventory, limit)
    fake = []
    for host in hosts:
        hv = _host_vars(host)
        root = hv.get("k3fleet_root")
        if hv.get("k3fleet_lab_profile") or (root not in (None, "", "/")):
            fake.append(f"{host.name} (k3fleet_root={root})")
    if fake:
        raise UsageError(f"inventory {inventory} has simulated lab hosts, which cannot be changed: "
                         f"{', '.join(fake[:5])}{' ...' if len(fake) > 5 else ''}")
    return [h.name for h in hosts]


def _host_vars(host: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for group in sorted(host.get_groups(), key=lambda g: g.depth):
        merged.update(group.get_vars())
    merged.update(host.get_vars())
    return merged


def _hosts(inventory: Path, limit: str | None) -> list[Any]:
    if not inventory.exists():
        raise UsageError(f"inventory {inventory} does not exist")
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    captured = io.StringIO()
    try:
        # Ansible explains a parse failure in warnings, one per plugin tried: keep the best one.
        with contextlib.redirect_stderr(captured):
            manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
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
    return hosts


_PLUGIN_WARNING = re.compile(r"Failed to parse inventory with '(?P<plugin>[\w.]+)' plugin: (?P<why>[^\n]+)")


def _parse_reason(warnings: str) -> str | None:
    """The most telling plugin complaint: the structured formats before ini's guess."""
    found = {m.group("plugin"): m.group("why").strip() for m in _PLUGIN_WARNING.finditer(warnings)}
    for plugin in ("yaml", "auto", "toml", "ini"):
        if plugin in found:
            origin = re.search(r"Origin: (\S+:\d+:\d+)", warnings)
            return found[plugin] + (f" ({origin.group(1)})" if origin else "")
    return next(iter(found.values()), None)
