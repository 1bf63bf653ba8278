"""One check's catalogue entry and how its texts render for a target; the registry of every entry.

Check ids are a public contract (reports, suppressions and dashboards key on them):
never rename one; add a new id instead. Each entry is defined once, with :func:`check`, in the module
whose rule emits it (k3fleet/verdict/rules/<concern>.py for host checks, fleet.py and pairs.py for the
others); :mod:`k3fleet.verdict.catalogue` lists them in report order. Fix texts are templates over the
target's values (``{target_branch}`` and so on), so a site target with other versions gets fixes that
name its own versions.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from k3fleet.models.findings import Severity
from k3fleet.models.target import Target

Scope = Literal["host", "fleet"]


class Check(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    scope: Scope
    title: str
    why: str
    severity: Severity
    fix: str
    # True: a failure here is part of the image -> CUDA -> driver chain (rebuild_environment).
    chain: bool = False
    # Where the facts the check relies on come from (a docs/facts.md section and its upstream source).
    source: str


_REGISTRY: dict[str, Check] = {}


def check(
    id: str, title: str, why: str, severity: Severity, fix: str, *, source: str, chain: bool = False,
    scope: Scope = "host",
) -> Check:
    """A check's catalogue entry, registered under its id (an id defined twice is a programming error).

    ``source``: where the facts the check relies on come from (a docs/facts.md section and its upstream
    source); docs/checks.md shows it for every check.
    """
    if id in _REGISTRY:
        raise ValueError(f"check id {id!r} is defined twice")
    entry = _REGISTRY[id] = Check(id=id, scope=scope, title=title, why=why, severity=severity, fix=fix,
                                  chain=chain, source=source)
    return entry


def registered(check_id: str) -> Check:
    """The entry of ``check_id`` (KeyError for an id no module defines)."""
    return _REGISTRY[check_id]


def registered_ids() -> frozenset[str]:
    return frozenset(_REGISTRY)


class _Keep(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def template_values(target: Target) -> dict[str, Any]:
    min_driver, _ = target.min_driver()
    return {
        "target_branch": target.driver.branch,
        "target_version": target.driver.target_version,
        "min_driver": min_driver,
        "image": target.image.ref,
        "image_cuda": target.image.cuda,
        "vllm_min": target.vllm.min_version,
        "toolkit_min": target.container.toolkit_min_version,
        "toolkit_advisory": target.container.toolkit_advisory or "Old toolkits have known vulnerabilities",
        "gpus_per_node": target.gpus.per_node,
        "rails_per_node": target.rdma.rails_per_node,
        "runtimes": ", ".join(target.container.runtimes),
        "strategy": target.gpus.strategy if target.gpus.explicit_strategy else "auto: derived from GPU memory",
        "weights_memory": _weights(target),
        "gpu_memory_utilization": f"{target.serve.gpu_memory_utilization:g}",
    }


def _weights(target: Target) -> str:
    w = target.gpus.weights_memory
    if w is None:
        return "not set in the target"
    return f"about {w.gb:g} GB" + ("" if w.confirmed else ", an unconfirmed estimate")


def render(text: str, values: dict[str, Any]) -> str:
    # Unknown placeholders stay visible rather than raising: a catalogue text must never crash a verdict.
    return string.Formatter().vformat(text, (), _Keep(values))


class FixTexts(dict[str, str]):
    """Every check's fix text rendered for one target, each rendered on first use."""

    def __init__(self, target: Target) -> None:
        super().__init__()
        self._values = template_values(target)

    def __missing__(self, check_id: str) -> str:
        text = self[check_id] = render(registered(check_id).fix, self._values)
        return text
