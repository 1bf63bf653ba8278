"""Stand-in NVIDIA driver for the real testbed: a local apt repository of fake driver,
NVML and Fabric Manager packages whose behaviour k3fleet cannot tell from the real ones
where it looks (package relations, /proc, NVML, nvidia-smi, the Fabric Manager unit)."""

from __future__ import annotations

from k3fleet.lab.standin.builder import (
    GPU_MODELS,
    RELEASES,
    DriverRelease,
    GpuModel,
    StandinBuildError,
    build_repo,
    compile_shim,
    gpus_conf,
    install_pins,
    release,
    render_template,
)

__all__ = [
    "GPU_MODELS",
    "RELEASES",
    "DriverRelease",
    "GpuModel",
    "StandinBuildError",
    "build_repo",
    "compile_shim",
    "gpus_conf",
    "install_pins",
    "release",
    "render_template",
]
