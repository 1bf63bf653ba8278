# -*- coding: utf-8 -*-
# Stdlib only: shipped inside AnsiballZ with the drain module, and imported by the controller
# (k3fleet.change.lease), so the change-id rule and the lease's wording have one definition.
# ruff: noqa: UP001, UP009, UP010, UP031
"""The lease a change puts on a node, where every controller sees it (docs/change-night.md "Lease").

On Slurm the lease is the drain reason; on Kubernetes the same text in a node annotation. Its
first word is ``k3fleet:<change-id>``: that word says which change holds the node. A node whose
reason (annotation) carries another change's word is held by that change and is never drained,
upgraded or returned to service by this one. When a node was already drained by someone else
(an operator, a health check), the lease keeps their reason after `` [was: ...]`` so that it can
be put back exactly when the change is done.
"""

from __future__ import annotations

import re

LEASE_PREFIX = "k3fleet:"
CHANGE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# Change ids end up in Slurm reasons, file names and Kubernetes annotations: keep them plain.
CHANGE_ID_RE = re.compile(CHANGE_ID_PATTERN)
_WAS_RE = re.compile(r"\s\[was: (.*)\]$")
_NO_REASON = ("", "(null)", "none", "None")


def valid_change_id(change_id: str | None) -> bool:
    return bool(change_id and CHANGE_ID_RE.match(change_id))


def lease_id(change_id: str) -> str:
    """``k3fleet:CHG-1042``: the first word of every lease of that change."""
    return LEASE_PREFIX + change_id


def lease_text(change_id: str, operator: str | None = None, text: str | None = None) -> str:
    """``k3fleet:CHG-1042 alice: NVIDIA driver change``."""
    words = [lease_id(change_id)]
    if operator:
        words.append("%s:" % operator)
    if text:
        words.append(text)
    return " ".join(words)


def adopted_text(lease: str, previous: str) -> str:
    """The lease on a node someone else had drained: their reason kept, to be restored."""
    return "%s [was: %s]" % (lease, previous)


def previous_reason(reason: str | None) -> str | None:
    """The reason a lease adopted (``... [was: X]`` -> ``X``), or None."""
    if not reason:
        return None
    match = _WAS_RE.search(reason.strip())
    return match.group(1) if match else None


def lease_holder(reason: str | None) -> str | None:
    """The change id whose lease ``reason`` is, or None when it is nobody's lease (or empty)."""
    if not reason or reason.strip() in _NO_REASON:
        return None
    first = reason.strip().split(None, 1)[0]
    if first.startswith(LEASE_PREFIX) and len(first) > len(LEASE_PREFIX):
        return first[len(LEASE_PREFIX):]
    return None


def lease_owner(reason: str | None, change_id: str | None) -> str | None:
    """Who holds a reason: ``ours``, ``k3fleet`` (another change), ``other``, or None (no reason)."""
    if not reason or reason.strip() in _NO_REASON:
        return None
    holder = lease_holder(reason)
    if holder is None:
        return "other"
    if change_id and holder == change_id:
        return "ours"
    return "k3fleet"


def check_lease(change_id: str | None, text: str | None) -> str | None:
    """None when ``text`` is a lease of ``change_id``, else why not (one line)."""
    if change_id is None or not valid_change_id(change_id):
        return ("change id %r is not valid: letters, digits, '.', '_' and '-', at most 64 characters, starting "
                "with a letter or digit" % (change_id,))
    if lease_holder(text) != change_id:
        return "lease %r does not start with %s" % (text, lease_id(change_id))
    return None
