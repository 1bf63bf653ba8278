"""The vLLM venv: built once with pinned versions from the index pip is configured with, reused after.

A venv is complete when its stamp names the same pins; a venv without a stamp (an interrupted or
hand-made install) is checked by what is installed in it and stamped, or completed with pip,
which installs only what is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from k3fleet.lab.common.workdir import read_json_object
from k3fleet.lab.vllm.state import (
    PINS,
    TORCH_VERSION,
    UNWANTED,
    VLLM_DIST,
    VLLM_VERSION,
    VllmLabError,
    last_log_line,
)

Progress = Callable[[str], None]
STAMP = ".k3fleet-vllm.json"
# Printed while pip runs: it is silent for minutes while it downloads torch and vLLM.
_TICK_S = 30.0
_NAMES = [VLLM_DIST, "torch", "transformers", "tokenizers", *UNWANTED]
_CHECK = ("import importlib.metadata as m, json\n"
          "def v(n):\n"
          "    try:\n"
          "        return m.version(n)\n"
          "    except m.PackageNotFoundError:\n"
          "        return None\n"
          f"print(json.dumps({{n: v(n) for n in {_NAMES!r}}}))\n")


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed(venv: Path) -> dict[str, str | None]:
    """Versions of the distributions that matter, as the venv's own Python sees them."""
    py = python_of(venv)
    if not py.exists():
        return {}
    res = subprocess.run([str(py), "-c", _CHECK], capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        return {}
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return data if isinstance(data, dict) else {}


def _complete(versions: dict[str, str | None]) -> bool:
    return (versions.get(VLLM_DIST) == VLLM_VERSION and versions.get("torch") == TORCH_VERSION
            and bool(versions.get("transformers")) and bool(versions.get("tokenizers"))
            and not any(versions.get(n) for n in UNWANTED))


def _stamp(venv: Path) -> dict[str, object] | None:
    return read_json_object(venv / STAMP)


def ensure_venv(venv: Path, progress: Progress) -> Path:
    """The venv's Python, building or completing the venv first when it is not complete."""
    stamp = _stamp(venv)
    if stamp is not None and stamp.get("pins") == list(PINS) and python_of(venv).exists():
        progress(f"vllm venv: reusing {venv} ({', '.join(PINS)}; built {stamp.get('built')})")
        return python_of(venv)
    if python_of(venv).exists():
        versions = installed(venv)
        if _complete(versions):
            _write_stamp(venv, versions)
            progress(f"vllm venv: reusing {venv} (found complete: {', '.join(PINS)})")
            return python_of(venv)
        progress(f"vllm venv: {venv} is incomplete ({_describe(versions)}): completing it with pip")
    else:
        progress(f"vllm venv: creating {venv} (about 3.5 GB and 10 minutes on 2 busy cores)")
        venv.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(venv)], venv, "creating the venv", progress)
    log = venv.parent / (venv.name + ".install.log")
    progress(f"vllm venv: pip install {' '.join(PINS)} (log {log})")
    _run([str(python_of(venv)), "-m", "pip", "install", "--progress-bar", "off", *PINS], venv, "pip install",
         progress, log=log)
    present = [n for n in UNWANTED if installed(venv).get(n)]
    if present:
        progress(f"vllm venv: removing {', '.join(present)} (not CPU builds for this torch; a text model needs none)")
        _run([str(python_of(venv)), "-m", "pip", "uninstall", "-y", *present], venv, "pip uninstall", progress,
             log=log)
    versions = installed(venv)
    if not _complete(versions):
        raise VllmLabError(f"lab vllm: the venv {venv} is still incomplete after pip ({_describe(versions)}); "
                           f"see {log}")
    _write_stamp(venv, versions)
    progress(f"vllm venv: ready ({_describe(versions)})")
    return python_of(venv)


def _describe(versions: dict[str, str | None]) -> str:
    shown = [f"{n} {v}" for n, v in versions.items() if v] or ["nothing installed"]
    return ", ".join(shown)


def _write_stamp(venv: Path, versions: dict[str, str | None]) -> None:
    data = {"pins": list(PINS), "versions": versions, "built": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (venv / STAMP).write_text(json.dumps(data, indent=2) + "\n")


def _run(argv: list[str], venv: Path, what: str, progress: Progress, *, log: Path | None = None) -> None:
    """Run one step, its output into ``log``; a line every half-minute names the step and its last line."""
    t0 = time.monotonic()
    sink = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        done = threading.Event()

        def ticker() -> None:
            while not done.wait(_TICK_S):
                progress(f"vllm venv: {what}: {time.monotonic() - t0:.0f} s{_last_line(log)}")

        thread = threading.Thread(target=ticker, daemon=True)
        thread.start()
        try:
            code = child.wait()
        except BaseException:
            child.terminate()
            child.wait(30)
            raise
        finally:
            done.set()
    except OSError as exc:
        raise VllmLabError(f"lab vllm: {what} for {venv}: cannot run {argv[0]}: {exc}") from exc
    finally:
        if log is not None and not isinstance(sink, int):
            sink.close()
    if code != 0:
        raise VllmLabError(f"lab vllm: {what} for {venv} exited {code}{_last_line(log)}"
                           + (f" (log {log})" if log else ""))


def _last_line(log: Path | None) -> str:
    """The last meaningful line of pip's log (warnings about missing index locations skipped)."""
    line = last_log_line(log, window=8192, width=160, skip=("WARNING: Location",))
    return f": {line}" if line else ""
