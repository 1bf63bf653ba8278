"""The change id, the operator, and the lease a change puts on each node (docs/change-night.md "Lease").

The rule and the wording live in ``k3fleet_lease`` (shipped to nodes with the drain module);
this is the controller's side of them. The controller builds the lease once and hands it to
the playbooks as a value (``k3fleet_lease``): the roles compare and pass it on, they never
rebuild it.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from pydantic import BaseModel, ConfigDict

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_lease import (
    CHANGE_ID_PATTERN,
    LEASE_PREFIX,
    lease_holder,
    lease_id,
    lease_owner,
    lease_text,
    valid_change_id,
)
from k3fleet.errors import UsageError

__all__ = ["CHANGE_ID_PATTERN", "DRAIN_TEXT", "ROLLBACK_TEXT", "Lease", "lease_holder", "lease_owner",
           "validate_change_id", "validate_operator"]

# What the lease says the node is out for, after the change id and the operator.
DRAIN_TEXT = "NVIDIA driver change"
ROLLBACK_TEXT = "rollback of the NVIDIA driver change"


def validate_change_id(change_id: str) -> str:
    cid = (change_id or "").strip()
    if not valid_change_id(cid):
        raise UsageError(f"--change-id {change_id!r} is not valid: letters, digits, '.', '_' and '-', "
                         "at most 64 characters, starting with a letter or digit (it goes into drain reasons)")
    return cid


def validate_operator(operator: str) -> str:
    name = (operator or "").strip()
    if not name or any(ch in name for ch in "\n\r\t[]") or len(name) > 64:
        raise UsageError(f"--operator {operator!r} is not valid: give who runs the change (one line without "
                         "brackets, at most 64 characters)")
    return name


class Lease(BaseModel):
    """One change's lease, as handed to the playbooks."""

    model_config = ConfigDict(frozen=True)

    change_id: str
    operator: str | None = None
    text: str
    id: str
    prefix: str = LEASE_PREFIX
    # Kubernetes has no drain reason that expires by itself: the annotation says until when the
    # change expects to hold the node, so a stale one is recognisable (it is still never taken over).
    expires: str

    @classmethod
    def build(cls, change_id: str, operator: str | None, what: str, ttl_s: int,
              now: _dt.datetime | None = None) -> Lease:
        cid = validate_change_id(change_id)
        start = now or _dt.datetime.now(_dt.UTC)
        expires = (start + _dt.timedelta(seconds=ttl_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(change_id=cid, operator=operator, text=lease_text(cid, operator, what), id=lease_id(cid),
                   expires=expires)

    def extravar(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
