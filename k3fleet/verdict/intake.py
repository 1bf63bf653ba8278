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
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from k3fleet.models.facts import HostFacts


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
    with gc_paused(freeze=freeze):
        for host, data in raw.items():
            if not isinstance(data, Mapping):
                invalid[host] = f"host {host}: facts invalid: expected a JSON object, got {type(data).__name__}"
                continue
            try:
                valid[host] = HostFacts.model_validate(data)
            except ValidationError as exc:
                invalid[host] = describe_invalid(host, exc)
    return valid, invalid
