"""Evidence privacy: what a run keeps of production-shaped traffic, and who may read it.

Request and response bodies are the most sensitive thing a run directory can hold (prompts, tool
arguments, answers). ``--no-bodies`` keeps them out: an exchange keeps its label, path, status,
timings, error and the size and sha256 of each body, enough to count and compare, not to read
(docs/safety.md "Evidence privacy").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

BODY_KEYS = ("request", "response", "chunks")


def _digest(value: Any) -> dict[str, Any]:
    data = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False).encode("utf-8")
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def without_bodies(row: Mapping[str, Any]) -> dict[str, Any]:
    """An exchange record with its bodies replaced by their size and digest."""
    out = {k: v for k, v in row.items() if k not in BODY_KEYS}
    kept = {k: _digest(row[k]) for k in BODY_KEYS if row.get(k) not in (None, [], {})}
    if "chunks" in row and isinstance(row["chunks"], list):
        kept.setdefault("chunks", {"bytes": 0, "sha256": None})["count"] = len(row["chunks"])
    out["bodies"] = {"kept": False, **kept}
    return out
