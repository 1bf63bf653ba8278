"""OOM records as a table over requests and samples (the pure ``oom_records``): which engine, which
success came last, what memory looked like, and when uneven pressure makes it a topology OOM."""

from __future__ import annotations

from typing import Any

import pytest

from k3fleet.accept.load import Shot
from k3fleet.accept.oom import oom_records, uneven

# vLLM's answer when an engine core dies on a CUDA OOM (the simulator's wording of it), with a token in it.
OOM_MSG = ("EngineCore died: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
           "(Authorization: Bearer sk-abcdefghijklmnopqrstuvwxyz0123456789)")


def shot(t: float, ok: bool = True, message: str | None = None, rid: str | None = None) -> Shot:
    return Shot(phase="agent_ramp", step="16 sessions", concurrency=16, context_tokens=None, t=t, ok=ok,
                kind=None if ok else "http_5xx", message=message, e2e=0.5 if ok else 0.1, rid=rid)


def sample(t: float, **kv: float) -> dict[str, Any]:
    return {"t_s": t, "kv_usage": max(kv.values()), "kv_by_engine": {k.removeprefix("e"): v for k, v in kv.items()},
            "running": 16.0, "waiting": 0.0}


@pytest.mark.parametrize(("before", "engine", "topology"), [
    ({"e0": 0.97, "e1": 0.41}, "0", True),    # one rank full, the other with room: placement, not capacity
    ({"e0": 0.95, "e1": 0.93}, "0", False),   # both full: capacity
    ({"e0": 0.6, "e1": 0.2}, "0", False),     # uneven but neither near full
    ({"e0": 0.98}, "0", False),               # one engine: nothing to compare
])
def test_oom_record(before: dict[str, float], engine: str, topology: bool) -> None:
    shots = [shot(1.0, rid="chatcmpl-1"), shot(2.0, rid="chatcmpl-2"), shot(3.0, ok=False, message="boom"),
             shot(4.0, ok=False, message=OOM_MSG), shot(4.2, ok=False, message=OOM_MSG)]
    samples = [sample(3.5, **before), sample(4.5, e0=0.0, e1=0.0) if len(before) > 1 else sample(4.5, e0=0.0)]
    recs = oom_records(shots, samples, "http://gpu-b01.lab:8000")
    assert len(recs) == 2
    rec = recs[0]
    assert rec["node"] == "gpu-b01.lab" and rec["engine"] == engine and rec["topology"] is topology
    assert rec["last_success"] == {"t_s": 2.5, "id": "chatcmpl-2"}
    assert rec["memory_before"]["kv_by_engine"] == {k.removeprefix("e"): v for k, v in before.items()}
    assert rec["memory_after"]["kv_usage"] == 0.0
    # The answers around it, redacted before they were cut: no token survives, not even its start.
    assert len(rec["excerpt"]) == 3 and "boom" in rec["excerpt"][0]
    assert all("sk-abc" not in line for line in rec["excerpt"]) and "sk-abc" not in rec["message"]


def test_no_oom_no_record() -> None:
    assert oom_records([shot(1.0), shot(2.0, ok=False, message="timeout")], [], None) == []


@pytest.mark.parametrize(("kv", "want"), [({"0": 0.95, "1": 0.5}, True), ({"0": 0.95, "1": 0.7}, False),
                                          ({}, False)])
def test_uneven(kv: dict[str, float], want: bool) -> None:
    assert uneven(kv) is want
