"""Serving acceptance over HTTP: start-up log, prefix cache, agent tool-call contract, load.

Each probe returns a :class:`k3fleet.accept.result.ProbeResult`; ``accept all`` writes them into
one run directory (docs/acceptance.md describes every probe and the directory's format).
"""

from __future__ import annotations
