"""Running the k3fleet command line from the decision tests (imported by their conftest and tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def k3fleet(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    full = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([str(bindir / "k3fleet"), *args], capture_output=True, text=True,
                          env=full, timeout=timeout, check=False, cwd=cwd)


def load_probe_ran(run: Path) -> bool:
    """Whether ``accept all`` ran the load probe (it names the probes it did not run)."""
    import json

    return "load" not in (json.loads((run / "accept.json").read_text()).get("not_run") or {})
