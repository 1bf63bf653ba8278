"""The serving suite: every acceptance probe against a real vLLM (the CPU build, `k3fleet lab vllm`).

One server per test module (at most one vLLM at a time on the machine), each in its own work
directory, stopped with `down` when the module ends whatever happened. The venv and the tiny model
are the lab's (`make test-serving` prepares them first). docs/acceptance.md ("The serving suite").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from k3fleet.lab import vllm
from k3fleet.lab.vllm import VllmState

MODEL = vllm.SERVED_NAME


def say(message: str) -> None:
    # Progress of the 2.5-minute start-ups, visible with -s and in the captured output of a failure.
    print(message, file=sys.stderr, flush=True)


@contextmanager
def lab_server(workdir: Path, *extra: str) -> Iterator[VllmState]:
    try:
        yield vllm.up(0, list(extra), workdir=workdir, progress=say)
    finally:
        vllm.down(workdir)


def k3fleet(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    return subprocess.run([str(bindir / "k3fleet"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@pytest.fixture(scope="session", autouse=True)
def _prepared() -> None:
    """The venv and the model must be there: building them is `make test-serving`'s first step, not a test's."""
    stamp = vllm.default_venv() / ".k3fleet-vllm.json"
    if not stamp.is_file():
        pytest.fail(f"no complete vLLM venv at {vllm.default_venv()}: run `k3fleet lab vllm prepare` "
                    "(make test-serving does)")
