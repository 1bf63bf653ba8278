"""The README's rehearsal blocks, read as written (README "Rehearse the night"): the shell block after
the marker comment ``<!-- rehearsal:NAME``, run by bash in a scratch directory that sees the repository's
``inventories/`` and ``k3fleet/`` where the commands name them, with this venv's ``k3fleet`` first on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def block(name: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- rehearsal:" + re.escape(name) + r"\b[^\n]*-->\n```sh\n(.*?)```", text, re.S)
    assert m, f"README.md has no rehearsal:{name} block"
    return m.group(1)


def run_block(name: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    for entry in ("inventories", "k3fleet"):
        link = cwd / entry
        if not link.exists():
            link.symlink_to(ROOT / entry)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "200"}
    return subprocess.run(["bash", "-e", "-x", "-c", block(name)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
