"""The change plan in sentences, shared by the Markdown report and the terminal."""

from __future__ import annotations

from typing import Any


def plan_title(plan: dict[str, Any]) -> str:
    return f"Change plan: R{plan['target_branch']} {plan['target_version']}"


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """Canary, waves, done, blocked and unreachable hosts, one sentence each."""
    canary = plan.get("canary")
    lines = [f"Canary: {canary['host']} ({canary['reason']})" if canary
             else f"No canary: {plan.get('canary_note') or 'no host needs the change'}"]
    lines += [f"Wave {i}: {', '.join(wave)}" for i, wave in enumerate(plan.get("waves") or [], 1)]
    if plan.get("done"):
        lines.append(f"Already on target: {', '.join(plan['done'])}")
    lines += [f"Blocked {b['host']}: {'; '.join(b['reasons'])}" for b in plan.get("blocked") or []]
    if plan.get("unreachable"):
        lines.append(f"Unreachable (not planned): {', '.join(plan['unreachable'])}")
    return lines
