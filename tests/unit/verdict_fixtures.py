"""The verdict tests' synthetic hosts: a fixture of tests/fixtures/verdict (see its README) with dotted
paths patched, and the default target with its GPU strategy pinned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from k3fleet.targets import load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
GOOD, R575, B200 = "r580_h200_hgx", "r575_h200_hgx", "r580_b200_hgx"
TARGET = load_target(None)
SINGLE = TARGET.model_copy(update={"gpus": TARGET.gpus.model_copy(update={"strategy": "single_node_tp"})})


def raw(base: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"host_{base}.json").read_text())
    return data


def set_path(data: Any, path: str, value: Any) -> None:
    """Set one dotted path (list indexes as numbers); a callable value maps the old value."""
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last: Any = int(keys[-1]) if isinstance(node, list) else keys[-1]
    node[last] = value(node[last]) if callable(value) else value


def patched(data: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """``data`` with every dotted path of ``patch`` set."""
    for path, value in (patch or {}).items():
        set_path(data, path, value)
    return data
