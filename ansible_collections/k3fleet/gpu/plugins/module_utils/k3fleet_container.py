# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""Container runtime, NVIDIA Container Toolkit, the serving image's CUDA, and a CUDA-init probe.

The host driver only matters through what the serving image asks of it:
``CUDA_VERSION`` / ``NVIDIA_REQUIRE_CUDA`` in the image config, and whether
CUDA actually initialises inside a container started from it. The probe is
the only step that starts a container; it is opt-in and leaves nothing behind
(``--rm``, no network, a fixed name: a probe that times out is removed with ``rm -f``, since
killing the runtime client does not stop a container that holds the GPUs).
"""

from __future__ import absolute_import, division, print_function

import json
import re

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import unknown
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_image import parse_image_ref, same_repository
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    COMMANDS,
    CONTAINER_RUNTIMES,
    PROBE_CONTAINER,
    PROBE_MARKER,
    image_inspect_argv,
    probe_argv,
    runtime_version_argv,
)

__metaclass__ = type

# Starting a container (image layers, hooks, CUDA init) takes far longer than a query.
PROBE_TIMEOUT_FACTOR = 6
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base")
# Removing a timed-out probe container: seconds, spent even when the node's budget is gone.
PROBE_CLEANUP_TIMEOUT = 30
# docker: 'Conflict. The container name "/k3fleet-probe" is already in use by container ...';
# podman: 'the container name "k3fleet-probe" is already in use by ...'.
_NAME_IN_USE = re.compile(r"container name \"?/?%s\"? is already in use" % re.escape(PROBE_CONTAINER))

_VERSION_RE = re.compile(r"\bversion\s+v?(\d+(?:\.\d+)+(?:[-+~][0-9A-Za-z.\-+~]+)?)", re.IGNORECASE)
_CTK_RE = re.compile(r"NVIDIA Container Toolkit CLI version\s+v?(\S+)")
# "0.27.1", "v0.27.1-cu130", "0.10.1.1", "0.11.0rc2": the version is the leading dotted number.
_VLLM_TAG_VERSION_RE = re.compile(r"^v?(\d+\.\d+(?:\.\d+){0,2}(?:(?:rc|a|b|\.post|\.dev)\d+)?)(?:[-+].*)?$")
_NOT_FOUND_PATTERNS = ("no such image", "image not known", "no such object", "image not found")

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


# -- pure parsers -------------------------------------------------------------


def parse_runtime_version(text):
    """``"Docker version 28.2.2, build e6534b4"`` -> ``"28.2.2"``; podman/nerdctl alike."""
    match = _VERSION_RE.search(text or "")
    return match.group(1).rstrip(",") if match else None


def parse_ctk_version(text):
    """``nvidia-ctk --version`` -> ``"1.17.8"``."""
    match = _CTK_RE.search(text or "")
    return match.group(1) if match else None


def toolkit_version_from_packages(packages):
    """Upstream version of nvidia-container-toolkit from PackageFacts, dropping the distro revision."""
    for pkg in (packages or {}).get("packages") or []:
        if pkg.get("name") in TOOLKIT_PACKAGES and pkg.get("version"):
            version = pkg["version"]
            upstream = version.split(":", 1)[-1].split("-", 1)[0]
            return upstream, "package %s %s" % (pkg["name"], version)
    return None, None


def is_image_not_found(text):
    lowered = (text or "").lower()
    return any(p in lowered for p in _NOT_FOUND_PATTERNS)


def _env_map(env_list):
    env = {}
    # Inspect output is data from the node: a field of the wrong type is read as absent.
    for item in env_list if isinstance(env_list, list) else []:
        if isinstance(item, str):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def _tag_version(tag_ref):
    if not tag_ref:
        return None
    # A whole reference (vllm/vllm-openai:v0.23.0) or the bare tag (v0.23.0).
    try:
        tag = parse_image_ref(tag_ref).tag or tag_ref
    except ValueError:
        return None
    match = _VLLM_TAG_VERSION_RE.match(tag.strip())
    return match.group(1) if match else None


def vllm_version_from_config(env, labels):
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


def parse_image_inspect(ref, rc, stdout, stderr):
    """``<runtime> image inspect <ref>`` -> ``(image_facts, problem)``.

    ``problem`` is ``None`` when the answer is trustworthy (present or absent),
    else a one-line reason and ``image_facts["present"]`` is ``None``.
    Understands the docker shape (``Id: "sha256:..."``, ``RepoDigests``) and the
    podman shape (bare hex ``Id``, top-level ``Digest``).
    """
    image = {"ref": ref, "present": None, "id": None, "digest": None, "cuda_version": None,
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
    config = data.get("Config") if isinstance(data.get("Config"), dict) else {}
    env = _env_map(config.get("Env"))
    labels = config.get("Labels") if isinstance(config.get("Labels"), dict) else {}
    labels = {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
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


def classify_probe_failure(text):
    """``(failure, message)`` for the first known too-old-host failure in ``text``, else ``(None, None)``."""
    for failure, pattern in _FAILURES:
        match = pattern.search(text or "")
        if match:
            return failure, " ".join(match.group(0).split())[:300]
    return None, None


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _judge_matmul(probe, results):
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


def parse_probe_output(rc, stdout, stderr, error=None, duration=0.0):
    """ProbeFacts from the probe container's exit status and output."""
    probe = {"ran": True, "ok": False, "cuda_init": None, "visible_gpus": None, "failure": None, "message": None}
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


# -- collector ------------------------------------------------------------------


def _runtimes(reader):
    found = []
    for name in CONTAINER_RUNTIMES:
        if reader.which(name) is None:
            continue
        res = reader.run_cached(runtime_version_argv(name))
        entry = {"name": name, "version": parse_runtime_version(res.stdout) if res.ok else None}
        if entry["version"] is None:
            entry["reason"] = res.reason() if not res.ok else "%s --version: no version in %r" % (
                name, res.stdout.strip()[:80])
        found.append(entry)
    return found


def _toolkit(reader, packages):
    res = reader.run_cached(COMMANDS["nvidia_ctk_version"])
    if res.ok:
        version = parse_ctk_version(res.stdout)
        if version:
            return version, "nvidia-ctk --version", None
    version, source = toolkit_version_from_packages(packages)
    if version:
        return version, source, None
    return None, None, res.reason() if not res.ok else "nvidia-ctk --version: no version in output"


def collect_container(reader, image, runtime="auto", probe=False, packages=None):
    """Runtime, toolkit, serving-image facts and (``probe=True``) a CUDA-init probe (``ContainerFacts``).

    ``image`` is the target's image reference; ``None`` (a state read that does not need it) leaves
    the image uninspected. ``runtime="auto"`` picks the first of docker, podman, nerdctl found on the
    reader's path. ``packages`` is the PackageFacts dict, used for the toolkit
    version when ``nvidia-ctk`` is not on the path.
    """
    out = {"status": "ok", "reason": None, "runtime": None, "runtimes": _runtimes(reader),
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
        image_facts, problem = {"ref": image, "present": None}, res.reason()
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
        timeout = reader.timeout * PROBE_TIMEOUT_FACTOR
        run = reader.run(probe_argv(rt, image), timeout=timeout)
        if _NAME_IN_USE.search(run.stderr or ""):
            out["probe"]["message"] = (
                "not run: a container named %s already exists on this node (another audit's probe, or one an "
                "interrupted audit left holding the GPUs); when no audit runs: %s rm -f %s"
                % (PROBE_CONTAINER, rt, PROBE_CONTAINER))
            return out
        out["probe"] = parse_probe_output(run.rc, run.stdout, run.stderr, run.error, run.duration)
        if run.error == "timeout":
            out["probe"]["message"] += "; " + remove_probe_container(reader, rt)
    return out


def remove_probe_container(reader, runtime):
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
