"""The serving image's GPU probe (``sources.probe_argv``): what the container prints on this node.

The failures are the runtime's and PyTorch's own words (docs/facts.md section 8).
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.render.node import Part, Recording

# docs/facts.md section 8, verbatim.
REQUIREMENT_ERROR = ("nvidia-container-cli: requirement error: unsatisfied condition: {req}, please "
                     "update your driver to a newer version, or use an earlier cuda container")
# The legacy prestart hook's failure, which the runtime prints before nvidia-container-cli's own line.
_HOOK = ("docker: Error response from daemon: failed to create task for container: failed to create "
         "shim task: OCI runtime create failed: runc create failed: unable to start container "
         "process: error during container init: error running prestart hook #0: exit status 1, "
         "stdout: , stderr: Auto-detected mode as 'legacy'\n")
_TORCH_WARN = "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:174: UserWarning: "


class ProbeView(Part):
    """The probe's result from the node's driver, CUDA and fabric, and the output that result prints."""

    def probe_result(self) -> str:
        spec = self.p.container.probe
        if spec.result != "auto":
            return spec.result
        drv = self.drv
        if drv is None or not drv.loaded:
            return "error"
        if drv.pending_reboot:
            return "nvml_mismatch"
        cuda_needed = self.p.container.image.cuda_version.split(".")[:2]
        have = self.node.cuda_of(drv.running_version).split(".")
        if not have[0] or [int(x) for x in have[:2]] < [int(x) for x in cuda_needed]:
            # docker's legacy hook checks NVIDIA_REQUIRE_CUDA; podman's CDI path does not, so
            # there CUDA itself fails inside the container.
            return "requirement_error" if self.runtime == "docker" else "driver_too_old"
        if self.p.nvswitches and (self.p.fabricmanager.active != "active"
                                  or self.p.fabricmanager_version != drv.running_version):
            return "not_initialized"
        return "ok"

    def probe(self) -> Recording:
        spec = self.p.container.probe
        result = self.probe_result()
        c = self.p.container
        if not c.image.present:
            return Recording(stderr=f"Unable to find image '{self.image}' locally\n{self.runtime}: Error "
                                    f"response from daemon: manifest for {self.image} not found: manifest "
                                    "unknown: manifest unknown\n", rc=125)
        if result == "ok":
            visible = self.p.gpus.count if spec.visible_gpus is None else spec.visible_gpus
            body = {"cuda_init": visible > 0, "visible_gpus": visible, "torch_cuda": self._torch_cuda(),
                    "error": None, "matmul": self.probe_matmul(visible) if visible > 0 else None}
            return Recording(stdout=f"{sources.PROBE_MARKER} {json.dumps(body)}\n")
        if result == "requirement_error":
            req = c.image.nvidia_require_cuda.split()[0]
            return _hook_failed(spec.message or REQUIREMENT_ERROR.format(req=req))
        if result == "nvml_mismatch":
            return _hook_failed(spec.message or ("nvidia-container-cli: initialization error: nvml error: "
                                                 "driver/library version mismatch"))
        if result == "driver_too_old":
            found = _cuda_int(self.node.cuda_of(self.drv.running_version)) if self.drv else "0"
            return self._cuda_init_failed(spec.message or (
                f"CUDA initialization: The NVIDIA driver on your system is too old (found version {found}). "
                "Please update your GPU driver by downloading and installing a new version from the URL: "
                "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to "
                "install a PyTorch version that has been compiled with your version of the CUDA driver."))
        if result == "not_initialized":
            return self._cuda_init_failed(spec.message or (
                "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
                "functions before calling NumCudaDevices() that might have already set an error? Error 802: "
                "system not yet initialized"))
        return _hook_failed(spec.message or ("nvidia-container-cli: initialization error: load library failed: "
                                             "libnvidia-ml.so.1: cannot open shared object file: no such file or "
                                             "directory"))

    def probe_matmul(self, visible: int) -> list[dict[str, Any]]:
        """The probe's per-GPU matmul: float32 rounding on a healthy GPU; a profile's bad GPUs differ."""
        bad = set(self.p.container.probe.matmul_wrong_gpus)
        tol = 0.0068984375
        out: list[dict[str, Any]] = []
        for i in range(visible):
            err = 3.0517578125e-05 if i not in bad else 61.8125
            out.append({"gpu": i, "tolerance": tol, "max_abs_err": err, "ok": err <= tol})
        return out

    def _torch_cuda(self) -> str:
        return ".".join(self.p.container.image.cuda_version.split(".")[:2])

    def _cuda_init_failed(self, text: str) -> Recording:
        """The container started, but PyTorch's CUDA init failed: the probe's line, and PyTorch's warning."""
        body = {"cuda_init": False, "visible_gpus": 0, "torch_cuda": self._torch_cuda(), "error": None}
        return Recording(stdout=f"{sources.PROBE_MARKER} {json.dumps(body)}\n",
                         stderr=f"{_TORCH_WARN}{text} (Triggered internally at /pytorch/c10/cuda/"
                                "CUDAFunctions.cpp:109.)\n  return torch._C._cuda_getDeviceCount() > 0\n")


def _hook_failed(text: str) -> Recording:
    """The runtime's prestart hook refused the container: nothing ran inside it."""
    return Recording(stderr=_HOOK + text + ": unknown\n", rc=125)


def _cuda_int(cuda: str) -> str:
    # PyTorch reports the driver's CUDA as major*1000 + minor*10 (12.9 -> 12090).
    if not cuda:
        return "0"
    major, _, minor = cuda.partition(".")
    return str(int(major) * 1000 + int(minor or 0) * 10)
