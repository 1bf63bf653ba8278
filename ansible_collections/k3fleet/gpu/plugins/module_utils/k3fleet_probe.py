# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""The CUDA-init probe: the serving image run once on the node, its output judged (``ProbeFacts``).

Only an audit asked to probe (``probe=true``) runs it, so it is its own module_util: the container
collector imports it when it runs the probe and a plain audit never compiles it. The probe is the
only step that starts a container; it leaves nothing behind (``--rm``, no network, a fixed name:
a probe that times out is removed with ``rm -f``, since killing the runtime client does not stop
a container that holds the GPUs).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    PROBE_CONTAINER,
    PROBE_MARKER,
    probe_argv,
)

# Starting a container (image layers, hooks, CUDA init) takes far longer than a query.
PROBE_TIMEOUT_FACTOR = 6
# Removing a timed-out probe container: seconds, spent even when the node's budget is gone.
PROBE_CLEANUP_TIMEOUT = 30
# docker: 'Conflict. The container name "/k3fleet-probe" is already in use by container ...';
# podman: 'the container name "k3fleet-probe" is already in use by ...'.
_NAME_IN_USE = re.compile(r"container name \"?/?%s\"? is already in use" % re.escape(PROBE_CONTAINER))

# Failure texts a too-old host produces when the image asks for a newer CUDA (docs/facts.md section 8).
# Order matters: the hook error fires before the container starts; 804/803 name their code;
# PyTorch's "too old" message and the bare runtime error 35 come last.
_FAILURES = (
    ("requirement_error", re.compile(r"nvidia-container-cli: requirement error: [^\n\"\\]*")),
    ("error_804", re.compile(r"(?:Error 804: )?forward compatibility was attempted on non supported HW")),
    ("error_803", re.compile(r"(?:Error 803: )?system has unsupported display driver / cuda driver combination")),
    ("driver_too_old", re.compile(r"The NVIDIA driver on your system is too old \(found version \d+\)")),
    ("cuda_error_35", re.compile(r"(?:returned 35\s*(?:->\s*)?)?CUDA driver version is insufficient for CUDA "
                                 r"runtime version|cudaErrorInsufficientDriver")),
)


def classify_probe_failure(text: str) -> tuple[str | None, str | None]:
    """``(failure, message)`` for the first known too-old-host failure in ``text``, else ``(None, None)``."""
    for failure, pattern in _FAILURES:
        match = pattern.search(text or "")
        if match:
            return failure, " ".join(match.group(0).split())[:300]
    return None, None


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _judge_matmul(probe: dict[str, Any], results: object) -> None:
    """The probe's real CUDA operation: a matmul per GPU checked against the CPU (PROBE_SCRIPT).

    ``kernel_ok`` None: the probe printed no kernel result (an older probe, a captured output):
    CUDA initialised, but no kernel result proves the GPUs compute.
    """
    probe["kernel"] = []
    probe["kernel_ok"] = None
    if not isinstance(results, list):
        probe["message"] += "; no kernel result"
        return
    for item in results:
        if not isinstance(item, dict) or not isinstance(item.get("gpu"), int):
            continue
        err = item.get("max_abs_err")
        tol = item.get("tolerance")
        probe["kernel"].append({
            "gpu": item["gpu"], "ok": item.get("ok") is True,
            "max_abs_err": float(err) if isinstance(err, (int, float)) else None,
            "tolerance": float(tol) if isinstance(tol, (int, float)) else None,
            "error": str(item["error"])[:300] if item.get("error") else None})
    bad = [k for k in probe["kernel"] if not k["ok"]]
    seen = set(k["gpu"] for k in probe["kernel"])
    missing = [i for i in range(probe["visible_gpus"] or 0) if i not in seen]
    if bad:
        probe["ok"] = False
        probe["kernel_ok"] = False
        first = bad[0]
        if first["error"]:
            probe["failure"] = "kernel_error"
            detail = first["error"]
        else:
            probe["failure"] = "kernel_mismatch"
            detail = "max abs difference %s from the CPU result, tolerance %s" % (
                first["max_abs_err"], first["tolerance"])
        probe["message"] = "a 256x256 matmul failed on GPU %s of %s in the container: %s" % (
            ",".join(str(k["gpu"]) for k in bad), probe["visible_gpus"], detail)
    elif missing or not probe["kernel"]:
        probe["message"] += "; no kernel result for GPU %s" % ",".join(str(i) for i in missing)
    else:
        probe["kernel_ok"] = True
        probe["message"] += "; a 256x256 matmul matched the CPU result on every GPU"


def parse_probe_output(rc: int | None, stdout: str | None, stderr: str | None, error: str | None = None,
                       duration: float = 0.0) -> dict[str, Any]:
    """ProbeFacts from the probe container's exit status and output."""
    probe: dict[str, Any] = {"ran": True, "ok": False, "cuda_init": None, "visible_gpus": None, "failure": None,
                             "message": None}
    if error == "timeout":
        probe["failure"] = "runtime_error"
        probe["message"] = "probe container did not finish within %.0fs" % duration
        return probe
    if error:
        probe["failure"] = "runtime_error"
        probe["message"] = "probe could not start: %s" % (_last_line(stderr) or error)
        return probe

    marker = None
    for line in (stdout or "").splitlines():
        if line.startswith(PROBE_MARKER + " "):
            try:
                candidate = json.loads(line[len(PROBE_MARKER) + 1:])
            except ValueError:
                continue
            if isinstance(candidate, dict):
                marker = candidate
    if marker is not None:
        probe["cuda_init"] = bool(marker.get("cuda_init"))
        gpus = marker.get("visible_gpus")
        probe["visible_gpus"] = gpus if isinstance(gpus, int) else None
        if marker.get("torch_cuda"):
            probe["torch_cuda"] = str(marker["torch_cuda"])
        if rc == 0 and probe["cuda_init"]:
            probe["ok"] = True
            probe["message"] = "CUDA initialised in the container; %s GPU(s) visible" % probe["visible_gpus"]
            _judge_matmul(probe, marker.get("matmul"))
            return probe

    text = "\n".join([stdout or "", stderr or "", str((marker or {}).get("error") or "")])
    failure, message = classify_probe_failure(text)
    if failure:
        probe["failure"], probe["message"] = failure, message
        return probe
    probe["failure"] = "runtime_error"
    if rc != 0:
        probe["message"] = "probe exited %s: %s" % (rc, _last_line(stderr) or _last_line(stdout) or "no output")
    elif marker is not None:
        probe["message"] = "CUDA did not initialise in the container (torch.cuda.is_available() is False)%s" % (
            (": " + str(marker["error"])[:200]) if marker.get("error") else "")
    else:
        probe["message"] = "probe printed no %s line: %s" % (PROBE_MARKER, _last_line(stdout) or "no output")
    return probe


def run_probe(reader: NodeReader, runtime: str, image: str) -> dict[str, Any]:
    """Run the probe container of ``image`` on ``runtime`` and return its ProbeFacts.

    A container of the probe's name that already exists (another audit's probe, or one an interrupted
    audit left) is not touched: the probe does not run and says so. A probe that times out is removed.
    """
    run = reader.run(probe_argv(runtime, image), timeout=reader.timeout * PROBE_TIMEOUT_FACTOR)
    if _NAME_IN_USE.search(run.stderr or ""):
        return {"ran": False, "ok": None, "cuda_init": None, "visible_gpus": None, "failure": None,
                "message": "not run: a container named %s already exists on this node (another audit's probe, "
                           "or one an interrupted audit left holding the GPUs); when no audit runs: %s rm -f %s"
                           % (PROBE_CONTAINER, runtime, PROBE_CONTAINER)}
    probe = parse_probe_output(run.rc, run.stdout, run.stderr, run.error, run.duration)
    if run.error == "timeout":
        probe["message"] += "; " + remove_probe_container(reader, runtime)
    return probe


def remove_probe_container(reader: NodeReader, runtime: str) -> str:
    """Remove the probe container after a timeout; say what happened (for the probe's message)."""
    # The node's time budget may be spent by now: the removal runs regardless, else the
    # container outlives the audit holding every GPU.
    deadline, reader.deadline = reader.deadline, None
    try:
        res = reader.run([runtime, "rm", "-f", PROBE_CONTAINER], timeout=PROBE_CLEANUP_TIMEOUT)
    finally:
        reader.deadline = deadline
    if res.ok:
        return "container %s removed" % PROBE_CONTAINER
    return "removing container %s failed (%s): remove it by hand: %s rm -f %s" % (
        PROBE_CONTAINER, res.reason(), runtime, PROBE_CONTAINER)
