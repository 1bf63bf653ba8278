"""A vLLM-compatible serving simulator (``k3fleet lab serve-vllm``): a real HTTP server over a
simulated engine with a paged, prefix-cached KV cache, a continuous-batching scheduler and a latency
model, so acceptance probes can be proven to pass and to fail (docs/acceptance-load.md)."""

from __future__ import annotations

from k3fleet.lab.vllm_sim.config import DEFECTS, SimConfig, parse_defects
from k3fleet.lab.vllm_sim.server import SimHandle, serve, start_simulator

__all__ = ["DEFECTS", "SimConfig", "SimHandle", "parse_defects", "serve", "start_simulator"]
