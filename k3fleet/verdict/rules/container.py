"""Container checks: runtime, toolkit, the serving image, its CUDA runtime, the probe, vLLM's version.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import HostFacts
from k3fleet.models.target import cuda_tuple, version_tuple
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import CompiledTarget, Emitter, HostContext, release_key

# Probe failures that mean "this driver is too old for this image" (docs/facts.md section 8).
CHAIN_PROBE_FAILURES = frozenset({"requirement_error", "cuda_error_35", "driver_too_old", "error_803", "error_804"})

_REQUIRE_CUDA = re.compile(r"cuda>=(\d+\.\d+(?:\.\d+)?)")

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("container.runtime", "Container runtime present",
          "The serving image needs a container runtime with GPU support.",
          "error",
          "Install one of the supported runtimes ({runtimes}) with the NVIDIA Container Toolkit.",
          source='docs/facts.md section 8'),
    check("container.toolkit", "NVIDIA Container Toolkit not vulnerable",
          "{toolkit_advisory}.",
          "error",
          "Upgrade nvidia-container-toolkit to {toolkit_min} or newer.",
          source='docs/facts.md section 8 (CVE-2025-23266: nvidia-container-toolkit <= 1.17.7)'),
    check("container.image_present", "Serving image present",
          "The serving image ({image}) must be on the node for a fast, predictable start.",
          "error",
          "Pull {image} on the node (and pin its digest in the target).",
          source='docs/facts.md section 1 (image vllm/vllm-openai:kimi-k3)'),
    check("container.cuda_runtime", "Host driver supports the image's CUDA runtime",
          "The image's CUDA runtime needs a driver whose maximum CUDA is at least its major release "
          "(minor-version compatibility covers the rest with a limited feature set).",
          "critical",
          "Upgrade the driver to {target_version}, or use an image built for the host's CUDA.",
          chain=True,
          source='docs/facts.md sections 2 and 8 (CUDA minor-version compatibility; nvidia-smi CUDA Version is the '
          "driver's maximum)"),
    check("container.probe", "CUDA initialises inside the image",
          "Only a real container start proves the chain image -> toolkit -> driver; the failures "
          "(requirement error, CUDA error 35/803/804, driver too old) name the broken link. CUDA initialising "
          "is not enough: the probe runs a matmul on every GPU and checks it against the CPU's result, so a GPU "
          "that is 'available' but fails or miscomputes a real kernel fails here.",
          "critical",
          "Follow the probe's failure: upgrade the driver to {target_version} for version errors, "
          "fix the toolkit/CDI configuration otherwise; for a kernel that failed or differs from the CPU, drain "
          "the node, reset the GPU it names and run the DCGM diagnostic (dcgmi diag -r 3), RMA it if it repeats.",
          chain=True,
          source="docs/facts.md section 8 (requirement error, CUDA errors 35/803/804, PyTorch 'driver too old'; the "
          "probe's matmul checked against the CPU)"),
    check("container.vllm_version", "vLLM in the image new enough",
          "The recipe needs vLLM {vllm_min} or newer.",
          "error",
          "Pull a newer {image} (vLLM >= {vllm_min}).",
          source='docs/facts.md section 1 (Kimi K3 recipe: vLLM 0.27.1 or newer)'),
)


def _runtime(f: HostFacts, c: HostContext, e: Emitter) -> None:
    ct = f.container
    if ct.status == "unknown" and ct.runtime is None:
        e.unknown("container.runtime", "the container runtime", ct.reason, error=True)
        return
    if ct.runtime is None:
        e.fail("container.runtime",
               f"no container runtime found (looked for {', '.join(e.ct.target.container.runtimes)})",
               {"reason": ct.reason})
    elif ct.runtime.name not in e.ct.runtimes:
        e.fail("container.runtime", f"container runtime {ct.runtime.name} is not one the target supports",
               {"runtime": ct.runtime.name, "supported": sorted(e.ct.runtimes)}, severity="warning")


def _toolkit(f: HostFacts, c: HostContext, e: Emitter) -> None:
    ct = f.container
    tv = version_tuple(ct.toolkit_version)
    if tv is None:
        if ct.runtime is not None or ct.status == "ok":
            e.unknown("container.toolkit", "the NVIDIA Container Toolkit version", ct.reason)
        return
    if tv < e.ct.toolkit_min:
        adv = e.ct.target.container.toolkit_advisory
        e.fail("container.toolkit",
               f"nvidia-container-toolkit {ct.toolkit_version} is older than "
               f"{e.ct.target.container.toolkit_min_version}" + (f" ({adv})" if adv else ""),
               {"toolkit_version": ct.toolkit_version, "min": e.ct.target.container.toolkit_min_version})


def _image(f: HostFacts, c: HostContext, e: Emitter) -> None:
    ct = f.container
    want = e.ct.target.image.ref
    img = ct.image
    if img is None or img.present is False:
        if ct.status == "unknown" and img is None:
            e.unknown("container.image_present", f"whether {want} is present", ct.reason)
        else:
            e.fail("container.image_present", f"image {want} is not present", {"image": want})
        return
    if img.present is None:
        e.unknown("container.image_present", f"whether {want} is present", ct.reason)
        return
    if img.ref != want:
        e.fail("container.image_present", f"facts describe image {img.ref}, the target serves {want}",
               {"image": img.ref, "target_image": want}, severity="warning")
    pin = e.ct.target.image.digest
    if pin and img.digest and img.digest != pin:
        e.fail("container.image_present", f"image {want} has digest {img.digest}, the target pins {pin}",
               {"digest": img.digest, "pinned": pin})


def image_cuda(f: HostFacts, ct: CompiledTarget) -> tuple[str, str]:
    """The CUDA release the host's image carries, and where that came from."""
    img = f.container.image
    if img is not None and img.present:
        if img.cuda_version and cuda_tuple(img.cuda_version):
            return img.cuda_version, "image CUDA_VERSION"
        m = _REQUIRE_CUDA.search(img.nvidia_require_cuda or "")
        if m:
            return m.group(1), "image NVIDIA_REQUIRE_CUDA"
    return ct.image_cuda, "target image.cuda"


def _cuda_runtime(f: HostFacts, c: HostContext, e: Emitter) -> None:
    ct = e.ct
    if c.platform_note is not None:
        return  # driver.platform says why: no data-center driver, so no CUDA chain to judge
    cuda, src = image_cuda(f, ct)
    want = cuda_tuple(cuda)
    assert want is not None
    reported = f.driver.cuda_driver_version
    host_max = reported if cuda_tuple(reported) else None
    row_max = ct.max_cuda(c.version) if c.version else None
    hm = cuda_tuple(host_max) or (row_max.key if row_max else None)
    # Like nvidia-smi's "CUDA Version": major.minor, whether reported or derived from the matrix.
    ev: dict[str, Any] = {"image_cuda": cuda, "image_cuda_source": src, "driver_version": c.version,
                          "host_max_cuda": host_max or (f"{row_max.key[0]}.{row_max.key[1]}" if row_max else None)}
    if c.version_t is None and hm is None:
        if not c.driver_failed:
            e.unknown("container.cuda_runtime", f"the host's maximum CUDA (image needs {cuda})",
                      f.driver.reason, error=True)
        return
    floor = ct.target.matrix.floor_branch(want[0])
    if c.version_t is not None and floor is not None and c.version_t[0] < floor.min_driver_branch:
        e.fail("container.cuda_runtime",
               f"image CUDA {cuda} needs an R{floor.min_driver_branch}-or-newer driver; the host runs "
               f"{c.version} (max CUDA {ev['host_max_cuda'] or '?'})",
               {**ev, "min_driver_branch": floor.min_driver_branch}, chain=True)
        return
    if hm is not None and hm[0] < want[0]:
        e.fail("container.cuda_runtime", f"image CUDA {cuda} is newer than the host's maximum CUDA "
               f"{ev['host_max_cuda']}", ev, chain=True)
        return
    row, exact = ct.row_for(cuda)
    if row is None or row.min_driver is None:
        label = row.label if row else cuda
        if row is not None:
            c.unconfirmed.add(row.label)
        e.unknown("container.cuda_runtime", f"the minimum driver for CUDA {cuda}",
                  f"the CUDA driver matrix has no {'value' if row else 'row'} for {label}", error=True)
        return
    if not row.confirmed:
        c.unconfirmed.add(row.label)
    ev.update(matrix_row=row.label, matrix_exact=exact, matrix_confirmed=row.confirmed, min_driver=row.min_driver)
    below = (c.version_t is not None and c.version_t < (version_tuple(row.min_driver) or (0,))) or (
        c.version_t is None and hm is not None and hm[:2] < want[:2])
    if below:
        note = "" if row.confirmed else " [unconfirmed matrix row]"
        e.fail("container.cuda_runtime",
               f"image CUDA {cuda} runs only under minor-version compatibility (limited features): CUDA "
               f"{row.label} wants driver {row.min_driver}, host has {c.version or host_max}{note}",
               ev, severity="warning")


def _probe(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if not e.ct.target.container.require_probe:
        return
    ct = f.container
    pr = ct.probe
    if c.platform_note is not None:
        return  # driver.platform says why; no driver change would make CUDA start here
    if ct.image is None or ct.image.present is False or ct.runtime is None:
        # No image or runtime: container.image_present / container.runtime already say why.
        return
    ev = {"failure": pr.failure, "message": pr.message, "cuda_init": pr.cuda_init, "visible_gpus": pr.visible_gpus}
    if not pr.ran:
        e.unknown("container.probe", "the in-container CUDA probe (not run)", pr.message)
    elif pr.ok:
        if c.gpu_count is not None and pr.visible_gpus is not None and pr.visible_gpus < c.gpu_count:
            e.fail("container.probe", f"the container sees {pr.visible_gpus} of {c.gpu_count} GPUs", ev,
                   severity="error")
        elif pr.kernel_ok is None:
            # CUDA initialised, but only a kernel's verified result proves the GPUs compute.
            e.unknown("container.probe", "a verified CUDA operation in the image",
                      "the probe printed no matmul result (a probe of an older collector, or a captured output)")
    elif pr.failure in CHAIN_PROBE_FAILURES:
        e.fail("container.probe", f"CUDA does not initialise in the image ({pr.failure}): {pr.message or ''}"
               .rstrip(": "), ev, chain=True)
    elif pr.ok is False:
        e.fail("container.probe", f"the container probe failed ({pr.failure or 'error'}): {pr.message or ''}"
               .rstrip(": "), ev, severity="error")
    else:
        e.unknown("container.probe", "the in-container CUDA probe result", pr.message)


def _vllm(f: HostFacts, c: HostContext, e: Emitter) -> None:
    img = f.container.image
    if img is None or not img.present:
        return
    have = release_key(img.vllm_version)
    if have is None:
        e.unknown("container.vllm_version", f"the vLLM version in {img.ref}",
                  f"image reports {img.vllm_version!r}" if img.vllm_version else "no vLLM version label")
    elif e.ct.vllm_min is not None and have < e.ct.vllm_min:
        e.fail("container.vllm_version",
               f"vLLM {img.vllm_version} in {img.ref} is older than {e.ct.target.vllm.min_version}",
               {"vllm_version": img.vllm_version, "min": e.ct.target.vllm.min_version})


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (
    _runtime, _toolkit, _image, _cuda_runtime, _probe, _vllm,
)
