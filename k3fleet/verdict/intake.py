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

The streaming verdict (:func:`k3fleet.verdict.evaluate_stream`) takes hosts one at a time through
:meth:`Intake.judged`: once a node kind has been seen, a host of that kind validates only what is
its own (identity, timing, scheduler section, the GPUs' UUIDs) and keeps only its scheduler
section beside the kind's facts; no per-host model of the rest is built or held.
"""

from __future__ import annotations

import gc
import marshal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from copy import copy
from typing import Any

from pydantic import ValidationError, create_model

from k3fleet.errors import validation_line
from k3fleet.models.facts import (
    ActiveFacts,
    ContainerFacts,
    DriverFacts,
    FabricManagerFacts,
    Gpu,
    HostFacts,
    ImexFacts,
    NcclFacts,
    PackageFacts,
    RdmaFacts,
    SchedulerFacts,
    replaced,
)

# Sections whose content repeats across a fleet's hosts: validated once per distinct content.
SHARED_SECTIONS: dict[str, Any] = {
    "packages": PackageFacts, "fabricmanager": FabricManagerFacts, "rdma": RdmaFacts, "nccl": NcclFacts,
    "container": ContainerFacts, "active": ActiveFacts, "imex": ImexFacts,
}

_SHARED_NAMES = tuple(SHARED_SECTIONS)

# HostFacts' fields that are each host's own (identity, timing, scheduler state, commands), built from
# HostFacts' own field definitions so the two never drift apart. Validating a host of a known kind
# through it gives the same result as validating the whole host: every other field is a shared
# section or the driver, whose validity the kind's content keys already settled.
_OWN_FIELDS: dict[str, Any] = {name: (info.annotation, copy(info)) for name, info in HostFacts.model_fields.items()
                               if name != "driver" and name not in SHARED_SECTIONS}
HostOwnFacts = create_model("HostOwnFacts", __config__=HostFacts.model_config, **_OWN_FIELDS)


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
    return f"host {host}: facts invalid at {validation_line(exc, show_input=True)}"


def validate_facts(
    raw: Mapping[str, Any], *, freeze: bool = True
) -> tuple[dict[str, HostFacts], dict[str, str]]:
    """Validate each host's facts dict; returns (valid facts, host -> reason for invalid ones).

    ``freeze=False`` for a long-lived process that must keep the collector's view of
    everything (it then pays the one scan of the new objects).
    """
    valid: dict[str, HostFacts] = {}
    invalid: dict[str, str] = {}
    intake = Intake()
    with gc_paused(freeze=freeze):
        for host, data in raw.items():
            facts = intake.facts(host, data)
            if isinstance(facts, str):
                invalid[host] = facts
            else:
                valid[host] = facts
    return valid, invalid


class Intake:
    """One fleet's host facts validated one host at a time, equal sections once per content.

    :meth:`facts` gives each host its own :class:`HostFacts` (what :func:`validate_facts` returns);
    :meth:`judged` gives what the verdict reads of a host: its node kind's facts and its own
    scheduler section. The raw facts read the same afterwards (see :func:`_content_key`).
    """

    __slots__ = ("_by_content", "_kinds", "_shared")

    def __init__(self) -> None:
        self._shared: dict[tuple[str, bytes], Any] = {}
        # Rule key -> the facts of the first host of that kind.
        self._kinds: dict[tuple[Any, ...], HostFacts] = {}
        # (schema version, marshal bytes of the shared sections and the driver without GPU UUIDs) -> the
        # facts of that node kind: one key and one look-up for a host of a kind already seen.
        self._by_content: dict[tuple[str, bytes], HostFacts] = {}

    def facts(self, host: str, data: Any) -> HostFacts | str:
        """The host's validated facts (with a rule key when it took the shared path), or why not."""
        if not isinstance(data, Mapping):
            return _not_an_object(host, data)
        taken = _validate_shared(data, self._shared)
        if taken is not None:
            return taken[0]
        try:
            return HostFacts.model_validate(data)
        except ValidationError as exc:
            return describe_invalid(host, exc)

    def judged(self, host: str, data: Any) -> tuple[HostFacts, SchedulerFacts] | str:
        """(facts the host rules read, the host's own scheduler section), or why the facts are invalid.

        For a host of a node kind the facts are the kind's first host's: equal in every section the
        rule key covers (all the host rules and the fleet checks read but the scheduler's state and
        the host's name); the host's own identity, timing and GPU UUIDs are validated, not kept.
        A host of no kind gets its own facts. Valid or not, and with what reason, as :meth:`facts`.
        """
        if not isinstance(data, Mapping):
            return _not_an_object(host, data)
        content: tuple[str, bytes] | None = None
        driver = data.get("driver")
        try:
            if type(driver) is dict and type(driver.get("gpus")) is list:
                key = _content_key(data, driver)
                if key is not None:
                    own = HostOwnFacts.model_validate(data)
                    content = (own.schema_version, key)
                    kind = self._by_content.get(content)
                    if kind is not None:
                        return kind, own.scheduler
        except (ValidationError, ValueError, TypeError):
            # Invalid own fields, or values marshal cannot take: the paths below say which.
            content = None
        taken = _validate_shared(data, self._shared, self._kinds)
        if taken is not None:
            private = taken[0].__pydantic_private__
            if content is not None and private and private.get("_rule_key") is not None:
                self._by_content[content] = taken[0]
            return taken
        try:
            facts = HostFacts.model_validate(data)
        except ValidationError as exc:
            return describe_invalid(host, exc)
        return facts, facts.scheduler


def _not_an_object(host: str, data: Any) -> str:
    return f"host {host}: facts invalid: expected a JSON object, got {type(data).__name__}"


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


def _content_key(data: Mapping[str, Any], driver: dict[str, Any]) -> bytes | None:
    """The marshal bytes of a host's shared sections and driver section with every GPU's UUID read as
    None (no host rule reads them); None when a UUID is neither a string nor absent.

    The UUIDs are set to None in the facts themselves for the one marshal call and put back at once,
    also when it fails: copying every GPU's dict to leave its UUID out costs a fifth of the key. Key
    order is kept (a value is replaced, no key is added or removed), so the facts read the same after.
    """
    saved: list[tuple[dict[str, Any], Any]] = []
    for gpu in driver["gpus"]:
        if type(gpu) is dict and "uuid" in gpu:
            uuid = gpu["uuid"]
            if uuid is not None and type(uuid) is not str:
                return None
            saved.append((gpu, uuid))
    try:
        for gpu, _ in saved:
            gpu["uuid"] = None
        return marshal.dumps((tuple(map(data.get, _SHARED_NAMES)), driver))
    finally:
        for gpu, uuid in saved:
            gpu["uuid"] = uuid


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


def _validate_shared(
    data: Mapping[str, Any], shared: dict[tuple[str, bytes], Any],
    kinds: dict[tuple[Any, ...], HostFacts] | None = None,
) -> tuple[HostFacts, SchedulerFacts] | None:
    """One host through the shared-section cache: (facts, its scheduler section), or None when it must
    take the plain path.

    ``kinds`` None: the host's own facts. Otherwise (:meth:`Intake.judged`) the facts of the host's
    node kind: the first host of a kind becomes the kind's facts. The plain path then gives the usual
    error for invalid facts (with the section in its field path).
    """
    try:
        sections = tuple(map(data.get, _SHARED_NAMES))
        # All shared sections at once first (one key for the common case of a whole node kind
        # repeating); on a miss each section on its own, so kinds still share equal sections.
        combined = ("*", marshal.dumps(sections))
        hit_all = shared.get(combined)
        if hit_all is None:
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
            hit_all = shared[combined] = (tuple(parts), tuple(id(part) if part is not None else 0 for part in parts))
        validated, ids = hit_all
        driver = data.get("driver")
        driver_key = _driver_key(driver)
        template = None
        if driver_key is not None and isinstance(driver, dict) and type(driver.get("gpus")) is list:
            template = shared.get(("driver", driver_key))
            if template is None:
                template = shared[("driver", driver_key)] = DriverFacts.model_validate(driver)
        fast = dict(data)
        for name, part in zip(SHARED_SECTIONS, validated, strict=True):
            if part is not None:
                fast[name] = part
        if template is not None:
            assert isinstance(driver, dict)
            fast["driver"] = _with_own_uuids(template, driver)
        facts = HostFacts.model_validate(fast)
    except (ValidationError, ValueError, TypeError):
        # ValueError / TypeError: a value marshal cannot take (not plain JSON data).
        return None
    if driver_key is not None:
        # The private attribute's own dict: pydantic's attribute hook costs more than the assignment.
        private = facts.__pydantic_private__
        if private is not None:
            rule_key = private["_rule_key"] = (facts.schema_version, driver_key, *ids)
            if kinds is not None:
                return kinds.setdefault(rule_key, facts), facts.scheduler
    return facts, facts.scheduler
