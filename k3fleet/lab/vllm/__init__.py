"""A real vLLM in the lab: the CPU build serving a tiny model made on the spot, on loopback.

Public API:

    prepare(venv=None, model_dir=None, progress=...) -> (python, model_dir)   build or reuse
    up(port=8000, extra_args=(), workdir=None, ..., progress=...) -> VllmState
    down(workdir=None) -> list[int]     idempotent, also after an interrupted up or a SIGKILL
    status(workdir=None) -> VllmStatus

The venv lives in ``<checkout>/.cache/vllm-venv`` (``K3FLEET_VLLM_VENV``), the model in
``<checkout>/.cache/vllm-model``, the work directory (state, start-up log) in ``<checkout>/.lab/vllm``.
See docs/acceptance.md ("A real vLLM in the lab").
"""

from __future__ import annotations

# What the CLI, the scripts and the serving tests use; the rest stays in harness and state.
from k3fleet.lab.vllm.harness import VllmStatus, alive_pids, down, prepare, status, up
from k3fleet.lab.vllm.state import SERVED_NAME, VllmLabError, VllmState, default_venv

__all__ = ["SERVED_NAME", "VllmLabError", "VllmState", "VllmStatus", "alive_pids", "default_venv", "down", "prepare",
           "status", "up"]
