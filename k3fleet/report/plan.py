"""The change plan in sentences, shared by the Markdown and HTML reports and the terminal."""

from __future__ import annotations

from typing import Any


def plan_title(plan: dict[str, Any]) -> str:
    return f"Change plan: R{plan['target_branch']} {plan['target_version']}"


def host_list(hosts: list[str], limit: int | None = None) -> str:
    """``a, b, c``; past ``limit`` names, ``a, b, ... (N more)``: a terminal line stays readable at 1,000 hosts."""
    if limit is None or len(hosts) <= limit:
        return ", ".join(hosts)
    return ", ".join(hosts[:limit]) + f", ... ({len(hosts) - limit} more)"


def plan_lines(plan: dict[str, Any], limit: int | None = None) -> list[str]:
    """Canary, waves, done, blocked and unreachable hosts, one sentence each (``limit``: names per line)."""
    canary = plan.get("canary")
    lines = [f"Canary: {canary['host']} ({canary['reason']})" if canary
             else f"No canary: {plan.get('canary_note') or 'no host needs the change'}"]
    if canary and canary.get("note"):
        lines.append(f"  not the common profile: {canary['note']}")
    waves = plan.get("waves") or []
    lines += [f"Wave {i} ({len(wave)} host{'s' if len(wave) != 1 else ''}): {host_list(wave, limit)}"
              for i, wave in enumerate(waves, 1)]
    if plan.get("done"):
        lines.append(f"Already on target ({len(plan['done'])}): {host_list(plan['done'], limit)}")
    blocked = plan.get("blocked") or []
    shown = blocked if limit is None else blocked[:limit]
    lines += [f"Blocked {b['host']}: {'; '.join(b['reasons'])}" if limit is None
              else f"Blocked {b['host']}: {', '.join(b['check_ids'])}" for b in shown]
    if len(shown) < len(blocked):
        lines.append(f"Blocked: {len(blocked) - len(shown)} more host(s) (k3fleet plan --run RUN --all lists each "
                     "with its reasons)")
    if plan.get("unreachable"):
        lines.append(f"Unreachable (not planned, {len(plan['unreachable'])}): {host_list(plan['unreachable'], limit)}")
    return lines


def package_text(item: dict[str, Any]) -> str:
    """One host's package transaction: ``installed -> new=version`` per package (the installed
    versions are the host's, in the plan's JSON)."""
    parts = []
    for p in item.get("packages") or []:
        new = f"{p['to_name']}={p['to_version']}" if p.get("to_version") else p["to_name"]
        parts.append(f"{p.get('name') or '(new)'} -> {new}")
    return ", ".join(parts) or "(no package change recorded)"


def package_groups(plan: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Hosts grouped by identical package transaction, largest group first: at 1,000 hosts the
    transactions are a handful of lines, each naming its hosts."""
    groups: dict[str, list[str]] = {}
    for it in plan.get("needs_upgrade") or []:
        groups.setdefault(f"{it.get('scope', 'driver')}: {package_text(it)}", []).append(it["host"])
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
