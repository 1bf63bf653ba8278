"""podman on the machine: two vLLM-like images made from the cached guest rootfs (no registry).

crun fails here on rlimits and hybrid cgroups, so the runtime is runc with explicit default
ulimits (docs/architecture.md, testbed); containers never get a network. The image store lives in the work
directory's cache so importing happens once, and nothing is written to the machine's own store.

Images are tagged `docker.io/vllm/vllm-openai:<tag>`, the name a real pull would give, so the
reference people write (`vllm/vllm-openai:kimi-k3`) resolves through podman's normal
short-name expansion exactly as on a production host.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from k3fleet.lab.common.proc import run
from k3fleet.lab.testbed.errors import TestbedError
from k3fleet.lab.testbed.state import Layout, PodmanState, resolve_workdir

REGISTRY = "docker.io"
REPOSITORY = "vllm/vllm-openai"
KIMI_K3_TAG = "kimi-k3"
SELFBUILT_CU129_TAG = "k3-cu129-selfbuilt"

# docs/facts.md sections 1 and 8: the official image is a CUDA 13 (cu130) build; vLLM 0.27.1 is the minimum.
# The 12.9 image stands for the "build vLLM yourself against cu129" evidence track.
# NVIDIA_REQUIRE_CUDA: the head of the value NVIDIA's CUDA base images set (as printed by vLLM's
# collect_env.py from the production image in public vLLM issues), shortened to its first brand
# clauses; consumers only parse the leading `cuda>=X.Y` condition.
_BRANDS_R535 = " ".join(f"brand={b},driver>=535,driver<536" for b in ("unknown", "grid", "tesla"))
IMAGES: dict[str, dict[str, str]] = {
    f"{REGISTRY}/{REPOSITORY}:{KIMI_K3_TAG}": {
        "CUDA_VERSION": "13.0.2",
        "NVIDIA_REQUIRE_CUDA": f"cuda>=13.0 {_BRANDS_R535}",
        "VLLM_VERSION": "0.27.1",
    },
    f"{REGISTRY}/{REPOSITORY}:{SELFBUILT_CU129_TAG}": {
        "CUDA_VERSION": "12.9.1",
        "NVIDIA_REQUIRE_CUDA": f"cuda>=12.9 {_BRANDS_R535}",
        "VLLM_VERSION": "0.27.1",
    },
}
IMAGE_LABEL = "io.k3fleet.testbed"


def _conf_paths(workdir: Path) -> tuple[Path, Path]:
    base = Layout(workdir).podman_dir
    return base / "containers.conf", base / "storage.conf"


def write_podman_conf(workdir: Path) -> tuple[Path, Path]:
    containers_conf, storage_conf = _conf_paths(workdir)
    base = containers_conf.parent
    base.mkdir(parents=True, exist_ok=True)
    containers_conf.write_text(
        "# k3fleet testbed: runc (crun fails on rlimits here), fixed ulimits, never a network.\n"
        "[containers]\n"
        'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
        'netns = "none"\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    storage_conf.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{base / "storage"}"\nrunroot = "{base / "run"}"\n'
    )
    return containers_conf, storage_conf


def podman_env(workdir: Path | None = None) -> dict[str, str]:
    """Environment for `podman` calls that must see the testbed's images and settings."""
    containers_conf, storage_conf = _conf_paths(resolve_workdir(workdir))
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(containers_conf)
    env["CONTAINERS_STORAGE_CONF"] = str(storage_conf)
    env["LC_ALL"] = "C"
    return env


def inspect_image(workdir: Path, reference: str) -> dict[str, Any]:
    """`podman image inspect REF` as a dict (the first and only element)."""
    proc = run(
        ["podman", "image", "inspect", reference],
        what=f"testbed podman: inspecting {reference}",
        env=podman_env(workdir),
        timeout=60,
    )
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        raise TestbedError(f"testbed podman: inspect {reference} printed no JSON: {proc.stdout[:200]!r}") from exc
    if not isinstance(data, list) or not data:
        raise TestbedError(f"testbed podman: inspect {reference} returned {data!r}")
    first = data[0]
    if not isinstance(first, dict):
        raise TestbedError(f"testbed podman: inspect {reference} returned a {type(first).__name__}")
    return first


def image_env(inspect: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in (inspect.get("Config") or {}).get("Env") or []:
        key, _, value = str(item).partition("=")
        env[key] = value
    return env


def _current(workdir: Path, reference: str, wanted: dict[str, str], source_key: str) -> bool:
    proc = run(
        ["podman", "image", "inspect", reference],
        what=f"testbed podman: inspecting {reference}",
        env=podman_env(workdir),
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        return False
    try:
        inspect = json.loads(proc.stdout)[0]
    except (ValueError, IndexError, KeyError):
        return False
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    env = image_env(inspect)
    return labels.get(IMAGE_LABEL) == source_key and all(env.get(k) == v for k, v in wanted.items())


def ensure_images(workdir: Path, tarball: Path, source_key: str) -> PodmanState:
    """Import both images from the rootfs tarball unless the store already has them as wanted."""
    containers_conf, storage_conf = write_podman_conf(workdir)
    env = podman_env(workdir)
    for reference, settings in IMAGES.items():
        if _current(workdir, reference, settings, source_key):
            continue
        changes: list[str] = []
        for key, value in settings.items():
            # Quoted: the value of NVIDIA_REQUIRE_CUDA has spaces, and unquoted `ENV k=v w=x` sets two keys.
            changes += ["--change", f'ENV {key}="{value}"']
        changes += [
            "--change",
            f"LABEL {IMAGE_LABEL}={source_key}",
            "--change",
            f"LABEL vllm.version={settings['VLLM_VERSION']}",
            "--change",
            'CMD ["/bin/sh"]',
        ]
        run(
            ["podman", "import", "--quiet", *changes, str(tarball), reference],
            what=f"testbed podman: importing {reference} from {tarball.name}",
            env=env,
            timeout=600,
        )
    return PodmanState(containers_conf=containers_conf, storage_conf=storage_conf, images=IMAGES)
