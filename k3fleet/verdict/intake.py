"""From collector JSON to validated host facts, one host's bad data never sinking the rest.

``validate_facts`` validates every host's dict into :class:`HostFacts`; a host whose
facts do not validate comes back in a second mapping as a one-line reason, which
:func:`k3fleet.verdict.evaluate_fleet` takes as ``invalid`` (evidence incomplete,
check ``facts.schema``), never as an exception.

Validating thousands of hosts allocates millions of small objects (about 160 per host);
CPython's cyclic garbage collector then re-scans the growing heap again and again
(measured: 10,000 hosts validate in about 0.6 s with the collector paused, 2.5-3.5 s
with it running). Re-enabling it afterwards would still scan every new object once
(about 0.5 s), so the validated facts, which live for the rest of the run and hold no
reference cycles, are moved out of its view with ``gc.freeze()``: they are still freed
by reference counting when dropped.

A fleet is mostly copies of a few node kinds: the package set, Fabric Manager, RDMA, NCCL and
container sections of one kind are equal on thousands of hosts. Each such section is keyed by
its ``marshal`` bytes (about a sixth of what validating it costs) and validated once per distinct
content; the hosts share that one validated, read-only object. Each host also gets a rule key
(:attr:`HostFacts._rule_key`): its shared sections' identities plus its driver section without
the GPUs' UUIDs, so the verdict runs the host rules once per node kind
(:func:`k3fleet.verdict.evaluate_fleet`). Any host whose sections are not plain JSON, or that
fails the fast path, is validated on its own as before, with the same error message.
"""

from __future__ import annotations

import gc
import marshal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from k3fleet.models.facts import (
    ActiveFacts,
    ContainerFacts,
    DriverFacts,
    FabricManagerFacts,
    Gpu,
    HostFacts,
    NcclFacts,
    PackageFacts,
    RdmaFacts,
    replaced,
)

# Sections whose content repeats across a fleet's hosts: validated once per distinct content.
SHARED_SECTIONS: dict[str, Any] = {
    "packages": PackageFacts, "fabricmanager": FabricManagerFacts, "rdma": RdmaFacts, "nccl": NcclFacts,
    "container": ContainerFacts, "active": ActiveFacts,
}


@contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic GC for a bulk step; restore the caller's setting afterwards.

    ``freeze``: afterwards move every object alive to the permanent generation, so the
    collector never re-scans what the bulk step built.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def describe_invalid(host: str, exc: ValidationError) -> str:
    """One line: which host, which field, what is wrong (and how many more problems)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    got = first.get("input")
    detail = f" (got {got!r})" if first["type"] != "missing" and not isinstance(got, dict | list) else ""
    more = f"; {len(errors) - 1} more problem(s)" if len(errors) > 1 else ""
    return f"host {host}: facts invalid at {loc}: {first['msg']}{detail}{more}"


def validate_facts(
    raw: Mapping[str, Any], *, freeze: bool = True
) -> tuple[dict[str, HostFacts], dict[str, str]]:
    """Validate each host's facts dict; returns (valid facts, host -> reason for invalid ones).

    ``freeze=False`` for a long-lived process that must keep the collector's view of
    everything (it then pays the one scan of the new objects).
    """
    valid: dict[str, HostFacts] = {}
    invalid: dict[str, str] = {}
    shared: dict[tuple[str, bytes], Any] = {}
    with gc_paused(freeze=freeze):
        for host, data in raw.items():
            if not isinstance(data, Mapping):
                invalid[host] = f"host {host}: facts invalid: expected a JSON object, got {type(data).__name__}"
                continue
            facts = _validate_shared(data, shared)
            if facts is not None:
                valid[host] = facts
                continue
            try:
                valid[host] = HostFacts.model_validate(data)
            except ValidationError as exc:
                invalid[host] = describe_invalid(host, exc)
    return valid, invalid


def _driver_key(driver: Any) -> bytes | None:
    """The driver section without the GPUs' UUIDs (no host rule reads them), as marshal bytes.

    Facts arrive as JSON, so exact type checks (cheaper than the abstract Mapping) suffice; other
    shapes get no key and take the plain path.
    """
    if type(driver) is not dict:
        return None
    gpus = driver.get("gpus")
    if type(gpus) is not list:
        return marshal.dumps(driver)
    rest = driver.copy()
    del rest["gpus"]
    stripped = []
    for g in gpus:
        if type(g) is dict and "uuid" in g:
            g = g.copy()  # a C-level copy and a delete cost a fraction of a filtering comprehension
            del g["uuid"]
        stripped.append(g)
    return marshal.dumps((rest, stripped))


_set = object.__setattr__


def _with_own_uuids(template: DriverFacts, driver: dict[str, Any]) -> DriverFacts:
    """The validated driver section of a host whose driver equals ``template`` but for GPU UUIDs.

    Each differing GPU is a copy of the template's with the host's UUID (the copy of
    :func:`k3fleet.models.facts.replaced`, inlined: this runs for every GPU of the fleet). Raises
    TypeError for a UUID that is not a string, so the host takes the plain path.
    """
    raw: list[Any] = driver["gpus"]
    if not template.gpus:
        return template
    own: list[Gpu] = []
    changed = False
    for gpu, entry in zip(template.gpus, raw, strict=True):
        uuid = entry.get("uuid") if type(entry) is dict else None
        if uuid == gpu.uuid:
            own.append(gpu)
            continue
        if uuid is not None and type(uuid) is not str:
            raise TypeError("GPU uuid is not a string")
        fields = gpu.__dict__.copy()
        fields["uuid"] = uuid
        copy = Gpu.__new__(Gpu)
        _set(copy, "__dict__", fields)
        _set(copy, "__pydantic_fields_set__", gpu.__pydantic_fields_set__)
        _set(copy, "__pydantic_extra__", None)
        _set(copy, "__pydantic_private__", None)
        own.append(copy)
        changed = True
    return replaced(template, gpus=own) if changed else template


def _validate_shared(data: Mapping[str, Any], shared: dict[tuple[str, bytes], Any]) -> HostFacts | None:
    """One host through the shared-section cache; None when it must take the plain path.

    The plain path then gives the usual error for invalid facts (with the section in its field path).
    """
    fast = dict(data)
    try:
        sections = tuple(data.get(name) for name in SHARED_SECTIONS)
        # All shared sections at once first (one key for the common case of a whole node kind
        # repeating); on a miss each section on its own, so kinds still share equal sections.
        combined = ("*", marshal.dumps(sections))
        validated = shared.get(combined)
        if validated is None:
            parts: list[Any] = []
            for (name, model), section in zip(SHARED_SECTIONS.items(), sections, strict=True):
                if section is None:
                    parts.append(None)
                    continue
                key = (name, marshal.dumps(section))
                hit = shared.get(key)
                if hit is None:
                    hit = shared[key] = model.model_validate(section)
                parts.append(hit)
            validated = shared[combined] = tuple(parts)
        ids = [id(part) if part is not None else 0 for part in validated]
        for name, part in zip(SHARED_SECTIONS, validated, strict=True):
            if part is not None:
                fast[name] = part
        driver = data.get("driver")
        driver_key = _driver_key(driver)
        if driver_key is not None and isinstance(driver, dict) and type(driver.get("gpus")) is list:
            template = shared.get(("driver", driver_key))
            if template is None:
                template = shared[("driver", driver_key)] = DriverFacts.model_validate(driver)
            fast["driver"] = _with_own_uuids(template, driver)
        facts = HostFacts.model_validate(fast)
    except (ValidationError, ValueError, TypeError):
        # ValueError / TypeError: a value marshal cannot take (not plain JSON data).
        return None
    if driver_key is not None:
        # The private attribute's own dict: pydantic's attribute hook costs more than the assignment.
        private = facts.__pydantic_private__
        if private is not None:
            private["_rule_key"] = (facts.schema_version, driver_key, *ids)
    return facts
