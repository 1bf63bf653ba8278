"""podman on the machine: two vLLM-like images made from the cached guest rootfs (no registry).

crun fails here on rlimits and hybrid cgroups, so the runtime is runc with explicit default
ulimits (docs/architecture.md, testbed); containers never get a network. The image store lives in the work
directory's cache so importing happens once, and nothing is written to the machine's own store. The
guests run these images with their own podman, over this store mounted read-only (image.py writes their
containers.conf and storage.conf, harness.py mounts the store).

Each image serves: its entrypoint is `vllm serve` (as the official image's), here the k3fleet vLLM
simulator behind vLLM's command line (files/vllm_serve.py), copied into the image under SERVE_SITE with
the packages it imports, so `podman run IMAGE MODEL --port P` answers OpenAI-compatible requests.

Images are tagged `docker.io/vllm/vllm-openai:<tag>`, the name a real pull would give, so the
reference people write (`vllm/vllm-openai:kimi-k3`) resolves through podman's normal
short-name expansion exactly as on a production host.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
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

# Where the serving layer lives in the images: the simulator and its packages, and vLLM's command.
SERVE_SITE = "/opt/k3fleet-serve"
SERVE_COMMAND = "/usr/local/bin/vllm"
SERVE_SCRIPT = Path(__file__).parent / "files" / "vllm_serve.py"
# The official image's entrypoint (vLLM's Dockerfile, vllm-openai stage): `docker run IMAGE MODEL ...`.
ENTRYPOINT = '["vllm", "serve"]'
SERVE_WRAPPER = f"""#!/bin/sh
# vLLM's `vllm` command in the k3fleet testbed's stand-in image: the simulator behind vLLM's command line.
PYTHONPATH={SERVE_SITE} exec python3 {SERVE_SITE}/vllm_serve.py "$@"
"""
# What the entrypoint imports: the simulator (and through it aiohttp, pydantic, prometheus_client).
_SERVE_IMPORTS = ("k3fleet.lab.vllm_sim", "k3fleet.lab.vllm_sim.server")
# Run by the interpreter that serves here (same minor version as the guests' Debian python3): the
# modules importing the simulator loads, outside the standard library, with the sys.path entry each
# was found under (the most specific one).
_CLOSURE_CODE = """
import json, os, sys, sysconfig
before = set(sys.modules)
for name in sys.argv[1:]:
    __import__(name)
std = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
roots = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}, key=len, reverse=True)
out = []
for name in sorted(set(sys.modules) - before):
    if name.split(".")[0] in sys.stdlib_module_names:
        continue
    f = getattr(sys.modules[name], "__file__", None)
    if not f:
        continue
    f = os.path.realpath(f)
    if f.startswith(std) and os.sep + "site-packages" + os.sep not in f:
        continue
    root = next((r for r in roots if f.startswith(r + os.sep)), None)
    if root is not None:
        out.append([name, root, os.path.relpath(f, root)])
print(json.dumps(out))
"""


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


def serve_closure(python: str = sys.executable) -> dict[str, Path]:
    """Every file the serving layer needs: path under SERVE_SITE -> the file on this machine.

    k3fleet's own modules are taken one by one (only the simulator, not the controller package); a
    third-party package whole (its compiled parts and data load lazily), a single-file module alone.
    """
    try:
        done = subprocess.run([python, "-c", _CLOSURE_CODE, *_SERVE_IMPORTS], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"testbed podman: cannot list what the simulator imports with {python}: {exc}") from exc
    if done.returncode != 0:
        raise TestbedError(f"testbed podman: importing the simulator with {python} failed: "
                           f"{' '.join(done.stderr.split()[-30:])}")
    files: dict[str, Path] = {}
    for _name, root, rel in json.loads(done.stdout):
        top = rel.split(os.sep, 1)[0]
        base = Path(root) / top
        if top == "k3fleet" or not base.is_dir():
            files[rel] = Path(root) / rel
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files[str(path.relative_to(root))] = path
    if not any(rel.startswith("k3fleet" + os.sep) for rel in files):
        raise TestbedError(f"testbed podman: {python} did not load the simulator from a k3fleet package")
    return dict(sorted(files.items()))


def serve_layer(closure: dict[str, Path]) -> dict[str, tuple[bytes, int]]:
    """The serving layer's files (path in the image -> content, mode)."""
    layer = {f"{SERVE_SITE}/{rel}": (src.read_bytes(), 0o644) for rel, src in closure.items()}
    layer[f"{SERVE_SITE}/vllm_serve.py"] = (SERVE_SCRIPT.read_bytes(), 0o644)
    layer[SERVE_COMMAND] = (SERVE_WRAPPER.encode(), 0o755)
    return layer


def layer_key(layer: dict[str, tuple[bytes, int]]) -> str:
    digest = hashlib.sha256()
    for path, (data, mode) in sorted(layer.items()):
        digest.update(f"{path}\0{mode:o}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def write_image_tar(rootfs_tar: Path, layer: dict[str, tuple[bytes, int]], out: Path) -> None:
    """The guest rootfs with the serving layer on top, as one tarball for `podman import`."""
    names = set()
    with tarfile.open(rootfs_tar, "r|") as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            names.add(member.name.removeprefix("./").rstrip("/"))
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        dirs = sorted({str(Path(p).parent).lstrip("/") for p in layer} - {""})
        for d in dirs:
            parts = Path(d).parts
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                if sub in names:
                    continue
                names.add(sub)
                info = tarfile.TarInfo("./" + sub)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                dst.addfile(info)
        for path, (data, mode) in sorted(layer.items()):
            info = tarfile.TarInfo("./" + path.lstrip("/"))
            info.size, info.mode = len(data), mode
            dst.addfile(info, io.BytesIO(data))


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
    """Import both images (rootfs + serving layer) unless the store already has them as wanted."""
    containers_conf, storage_conf = write_podman_conf(workdir)
    env = podman_env(workdir)
    layer = serve_layer(serve_closure())
    key = f"{source_key}.{layer_key(layer)}"
    missing = [(ref, settings) for ref, settings in IMAGES.items() if not _current(workdir, ref, settings, key)]
    if not missing:
        return PodmanState(containers_conf=containers_conf, storage_conf=storage_conf, images=IMAGES)
    combined = containers_conf.parent / f"serving-{key}.tar"
    try:
        write_image_tar(tarball, layer, combined)
        for reference, settings in missing:
            changes: list[str] = []
            for k, value in settings.items():
                # Quoted: the value of NVIDIA_REQUIRE_CUDA has spaces, and unquoted `ENV k=v w=x` sets two keys.
                changes += ["--change", f'ENV {k}="{value}"']
            changes += [
                "--change",
                f"LABEL {IMAGE_LABEL}={key}",
                "--change",
                f"LABEL vllm.version={settings['VLLM_VERSION']}",
                "--change",
                f"ENTRYPOINT {ENTRYPOINT}",
            ]
            run(
                ["podman", "import", "--quiet", *changes, str(combined), reference],
                what=f"testbed podman: importing {reference} from {tarball.name} and the serving layer",
                env=env,
                timeout=600,
            )
    finally:
        combined.unlink(missing_ok=True)
    # The images these replaced (an older serving layer) are untagged now: free their space.
    run(["podman", "image", "prune", "--force"], what="testbed podman: removing replaced images", env=env,
        timeout=300)
    return PodmanState(containers_conf=containers_conf, storage_conf=storage_conf, images=IMAGES)
