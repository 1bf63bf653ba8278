"""k3fleet: decide whether a GPU fleet may serve Kimi K3 with vLLM, and change it safely."""

from __future__ import annotations

__version__ = "0.1.0"
