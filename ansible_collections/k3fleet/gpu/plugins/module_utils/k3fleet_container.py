# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""Container runtime, NVIDIA Container Toolkit, the serving image's CUDA, and a CUDA-init probe.

The host driver only matters through what the serving image asks of it:
``CUDA_VERSION`` / ``NVIDIA_REQUIRE_CUDA`` in the image config, and whether
CUDA actually initialises inside a container started from it. The probe is
the only step that starts a container; it is opt-in, and lives in k3fleet_probe, imported
only when it runs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, unknown
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_image import parse_image_ref, same_repository
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    COMMANDS,
    CONTAINER_RUNTIMES,
    image_inspect_argv,
    runtime_version_argv,
)

TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base")

_VERSION_RE = re.compile(r"\bversion\s+v?(\d+(?:\.\d+)+(?:[-+~][0-9A-Za-z.\-+~]+)?)", re.IGNORECASE)
_CTK_RE = re.compile(r"NVIDIA Container Toolkit CLI version\s+v?(\S+)")
# "0.27.1", "v0.27.1-cu130", "0.10.1.1", "0.11.0rc2": the version is the leading dotted number.
_VLLM_TAG_VERSION_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+){0,2}(?:(?:rc|a|b|\.post|\.dev)\d+)?)(?:[-+].*)?$")
_NOT_FOUND_PATTERNS = ("no such image", "image not known", "no such object", "image not found")

# -- pure parsers -------------------------------------------------------------


def parse_runtime_version(text: str | None) -> str | None:
    """``"Docker version 28.2.2, build e6534b4"`` -> ``"28.2.2"``; podman/nerdctl alike."""
    match = _VERSION_RE.search(text or "")
    return match.group(1).rstrip(",") if match else None


def parse_ctk_version(text: str | None) -> str | None:
    """``nvidia-ctk --version`` -> ``"1.17.8"``."""
    match = _CTK_RE.search(text or "")
    return match.group(1) if match else None


def toolkit_version_from_packages(packages: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """Upstream version of nvidia-container-toolkit from PackageFacts, dropping the distro revision."""
    for pkg in (packages or {}).get("packages") or []:
        if pkg.get("name") in TOOLKIT_PACKAGES and pkg.get("version"):
            version = pkg["version"]
            upstream = version.split(":", 1)[-1].split("-", 1)[0]
            return upstream, "package %s %s" % (pkg["name"], version)
    return None, None


def is_image_not_found(text: str | None) -> bool:
    lowered = (text or "").lower()
    return any(p in lowered for p in _NOT_FOUND_PATTERNS)


def _env_map(env_list: object) -> dict[str, str]:
    env = {}
    # Inspect output is data from the node: a field of the wrong type is read as absent.
    for item in env_list if isinstance(env_list, list) else []:
        if isinstance(item, str):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def _tag_version(tag_ref: str | None) -> str | None:
    if not tag_ref:
        return None
    # A whole reference (vllm/vllm-openai:v0.23.0) or the bare tag (v0.23.0).
    try:
        tag = parse_image_ref(tag_ref).tag or tag_ref
    except ValueError:
        return None
    match = _VLLM_TAG_VERSION_RE.match(tag.strip())
    return match.group(1) if match else None


def vllm_version_from_config(env: dict[str, str], labels: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """The image's vLLM version and where it came from, or ``(None, None)``.

    Looked at, in order: env ``VLLM_VERSION``; label ``ai.vllm.version``;
    ``org.opencontainers.image.version`` only when the image's OCI source/title
    names vLLM (CUDA/Ubuntu base images set that label to *their* version, e.g.
    "22.04"); then the version in the release tag the vLLM build records in
    env ``VLLM_IMAGE_TAG`` or label ``ai.vllm.image.tag`` (``vllm/vllm-openai:v0.23.0``).
    A tag without a version (``kimi-k3``) yields nothing: the probe or the
    serving endpoint must then say.
    """
    labels = labels or {}
    value = (env.get("VLLM_VERSION") or "").strip()
    if value:
        return value.lstrip("v"), "env VLLM_VERSION"
    value = (labels.get("ai.vllm.version") or "").strip()
    if value:
        return value.lstrip("v"), "label ai.vllm.version"
    oci_keys = ("org.opencontainers.image.source", "org.opencontainers.image.title", "org.opencontainers.image.url")
    oci_origin = " ".join(str(labels.get(k) or "") for k in oci_keys)
    value = (labels.get("org.opencontainers.image.version") or "").strip()
    if value and "vllm" in oci_origin.lower():
        return value.lstrip("v"), "label org.opencontainers.image.version"
    for where, tag in (("env VLLM_IMAGE_TAG", env.get("VLLM_IMAGE_TAG")),
                       ("label ai.vllm.image.tag", labels.get("ai.vllm.image.tag"))):
        version = _tag_version(tag)
        if version:
            return version, where
    return None, None


def parse_image_inspect(ref: str, rc: int | None, stdout: str | None,
                        stderr: str | None) -> tuple[dict[str, Any], str | None]:
    """``<runtime> image inspect <ref>`` -> ``(image_facts, problem)``.

    ``problem`` is ``None`` when the answer is trustworthy (present or absent),
    else a one-line reason and ``image_facts["present"]`` is ``None``.
    Understands the docker shape (``Id: "sha256:..."``, ``RepoDigests``) and the
    podman shape (bare hex ``Id``, top-level ``Digest``).
    """
    image: dict[str, Any] = {"ref": ref, "present": None, "id": None, "digest": None, "cuda_version": None,
                             "nvidia_require_cuda": None, "vllm_version": None}
    out = (stdout or "").strip()
    if rc != 0:
        if is_image_not_found((stderr or "") + "\n" + out):
            image["present"] = False
            return image, None
        detail = ((stderr or "").strip() or out).splitlines()
        return image, "image inspect %s: exit %s%s" % (ref, rc, (": " + detail[-1][:300]) if detail else "")
    try:
        data = json.loads(out)
    except ValueError as exc:
        return image, "image inspect %s: output is not JSON (%s): %r" % (ref, exc, out[:120])
    if isinstance(data, list):
        if not data:
            image["present"] = False
            return image, None
        data = data[0]
    if not isinstance(data, dict):
        return image, "image inspect %s: expected a JSON object, got %s" % (ref, type(data).__name__)

    image["present"] = True
    ident = data.get("Id") or data.get("ID")
    image["id"] = ident if isinstance(ident, str) else None
    raw_config = data.get("Config")
    config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
    env = _env_map(config.get("Env"))
    raw_labels = config.get("Labels")
    labels = {k: v for k, v in (raw_labels if isinstance(raw_labels, dict) else {}).items()
              if isinstance(k, str) and isinstance(v, str)}
    listed = data.get("RepoDigests")
    repo_digests = [d for d in listed if isinstance(d, str) and "@" in d] if isinstance(listed, list) else []
    image["repo_digests"] = repo_digests

    try:
        wanted = parse_image_ref(ref)
    except ValueError:
        wanted = None
    digest = wanted.digest if wanted is not None and (wanted.digest or "").startswith("sha256:") else None
    if digest is None and wanted is not None:
        for entry in repo_digests:
            name, _, dig = entry.partition("@")
            if name and same_repository(name, ref):
                digest = dig
                break
    if digest is None and isinstance(data.get("Digest"), str) and data["Digest"]:
        digest = data["Digest"]
    if digest is None and repo_digests:
        digest = repo_digests[0].partition("@")[2]
    image["digest"] = digest

    cuda = env.get("CUDA_VERSION", "").strip()
    image["cuda_version"] = cuda or None
    require = " ".join(env.get("NVIDIA_REQUIRE_CUDA", "").split())
    image["nvidia_require_cuda"] = require or None
    image["vllm_version"], image["vllm_version_source"] = vllm_version_from_config(env, labels)
    return image, None


# -- collector ------------------------------------------------------------------


def _runtimes(reader: NodeReader) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for name in CONTAINER_RUNTIMES:
        if reader.which(name) is None:
            continue
        res = reader.run_cached(runtime_version_argv(name))
        entry: dict[str, Any] = {"name": name, "version": parse_runtime_version(res.stdout) if res.ok else None}
        if entry["version"] is None:
            entry["reason"] = res.reason() if not res.ok else "%s --version: no version in %r" % (
                name, res.stdout.strip()[:80])
        found.append(entry)
    return found


def _toolkit(reader: NodeReader, packages: dict[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    res = reader.run_cached(COMMANDS["nvidia_ctk_version"])
    if res.ok:
        version = parse_ctk_version(res.stdout)
        if version:
            return version, "nvidia-ctk --version", None
    version, source = toolkit_version_from_packages(packages)
    if version:
        return version, source, None
    return None, None, res.reason() if not res.ok else "nvidia-ctk --version: no version in output"


def collect_container(reader: NodeReader, image: str | None, runtime: str = "auto", probe: bool = False,
                      packages: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runtime, toolkit, serving-image facts and (``probe=True``) a CUDA-init probe (``ContainerFacts``).

    ``image`` is the target's image reference; ``None`` (a state read that does not need it) leaves
    the image uninspected. ``runtime="auto"`` picks the first of docker, podman, nerdctl found on the
    reader's path. ``packages`` is the PackageFacts dict, used for the toolkit
    version when ``nvidia-ctk`` is not on the path.
    """
    out: dict[str, Any] = {"status": "ok", "reason": None, "runtime": None, "runtimes": _runtimes(reader),
                           "toolkit_version": None, "image": None,
                           "probe": {"ran": False, "ok": None, "cuda_init": None, "visible_gpus": None,
                                     "failure": None, "message": None}}
    out["toolkit_version"], out["toolkit_source"], toolkit_reason = _toolkit(reader, packages)
    if toolkit_reason:
        out["toolkit_reason"] = toolkit_reason

    names = [rt["name"] for rt in out["runtimes"]]
    if runtime == "auto":
        chosen = out["runtimes"][0] if out["runtimes"] else None
    else:
        chosen = next((rt for rt in out["runtimes"] if rt["name"] == runtime), None)
    if chosen is None:
        out["status"] = "absent"
        if runtime == "auto":
            out["reason"] = "no container runtime (%s) on PATH %s" % (", ".join(CONTAINER_RUNTIMES), reader.path)
        else:
            out["reason"] = "container runtime %s not on PATH %s (found: %s)" % (
                runtime, reader.path, ", ".join(names) or "none")
        out["probe"]["message"] = "not run: no container runtime"
        return out
    out["runtime"] = {"name": chosen["name"], "version": chosen["version"]}
    rt = chosen["name"]

    if not image:
        out["probe"]["message"] = "not run: no serving image asked for"
        return out
    res = reader.run_cached(image_inspect_argv(rt, image))
    if res.error:
        image_facts: dict[str, Any] = {"ref": image, "present": None}
        problem: str | None = res.reason()
    else:
        image_facts, problem = parse_image_inspect(image, res.rc, res.stdout, res.stderr)
    out["image"] = image_facts
    if problem:
        out.update(unknown(problem, runtime=out["runtime"], runtimes=out["runtimes"],
                           toolkit_version=out["toolkit_version"], image=image_facts, probe=out["probe"],
                           toolkit_source=out["toolkit_source"]))

    if not probe:
        out["probe"]["message"] = "not run (probe=false)"
    elif image_facts.get("present") is False:
        out["probe"]["message"] = "not run: image %s is not present on this node" % image
    else:
        # Imported here: an audit without the probe (the default) does not compile it on every node.
        from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_probe import run_probe

        out["probe"] = run_probe(reader, rt, image)
    return out
