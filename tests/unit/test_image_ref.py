"""The one image-reference parser (module_utils/k3fleet_image.py), as a table of references.

The references are real public ones (vllm/vllm-openai on Docker Hub, nvcr.io's NGC PyTorch
image, Docker Hub's official ubuntu) beside the shapes a local registry or podman gives
(localhost:5000/..., localhost/...); a registry with a port that is not localhost is named under
the reserved .invalid domain.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_container as ctr
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_image import parse_image_ref, same_repository
from k3fleet.decide.checklist import image_repository, image_tag

DIGEST = "sha256:" + "3f1c9d2e7a6b" * 5 + "0a1b"

# ref -> (registry, path, tag, digest, familiar)
CASES = [
    ("vllm/vllm-openai:kimi-k3", ("docker.io", "vllm/vllm-openai", "kimi-k3", None, "vllm/vllm-openai")),
    (f"docker.io/vllm/vllm-openai@{DIGEST}", ("docker.io", "vllm/vllm-openai", None, DIGEST, "vllm/vllm-openai")),
    (f"docker.io/vllm/vllm-openai:v0.10.1.1@{DIGEST}",
     ("docker.io", "vllm/vllm-openai", "v0.10.1.1", DIGEST, "vllm/vllm-openai")),
    ("index.docker.io/vllm/vllm-openai:latest", ("docker.io", "vllm/vllm-openai", "latest", None, "vllm/vllm-openai")),
    ("registry-1.docker.io/vllm/vllm-openai", ("docker.io", "vllm/vllm-openai", None, None, "vllm/vllm-openai")),
    ("ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04", None, "ubuntu")),
    ("docker.io/library/ubuntu", ("docker.io", "library/ubuntu", None, None, "ubuntu")),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", ("docker.io", "nvidia/cuda", "12.4.1-runtime-ubuntu22.04", None,
                                                 "nvidia/cuda")),
    ("nvcr.io/nvidia/pytorch:25.04-py3", ("nvcr.io", "nvidia/pytorch", "25.04-py3", None, "nvcr.io/nvidia/pytorch")),
    # The port of a registry is never a tag; a tag after it still is.
    ("localhost:5000/x", ("localhost:5000", "x", None, None, "localhost:5000/x")),
    ("localhost:5000/x:dev", ("localhost:5000", "x", "dev", None, "localhost:5000/x")),
    (f"registry.invalid:5443/team/vllm-openai:k3@{DIGEST}",
     ("registry.invalid:5443", "team/vllm-openai", "k3", DIGEST, "registry.invalid:5443/team/vllm-openai")),
    ("localhost/k3-cu129-selfbuilt:latest", ("localhost", "k3-cu129-selfbuilt", "latest", None,
                                             "localhost/k3-cu129-selfbuilt")),
    # One component is never a registry: "localhost" alone is a repository, "foo:5000" a tag.
    ("localhost", ("docker.io", "library/localhost", None, None, "localhost")),
    ("foo:5000", ("docker.io", "library/foo", "5000", None, "foo")),
    (" vllm/vllm-openai:kimi-k3\n", ("docker.io", "vllm/vllm-openai", "kimi-k3", None, "vllm/vllm-openai")),
]


@pytest.mark.parametrize(("ref", "want"), CASES, ids=[c[0].strip() for c in CASES])
def test_parse(ref: str, want: tuple[str, str, str | None, str | None, str]) -> None:
    got = parse_image_ref(ref)
    assert (got.registry, got.path, got.tag, got.digest, got.familiar) == want
    assert got.repository == f"{want[0]}/{want[1]}"
    # Written back without the digest, the reference keeps the spelling it came in.
    assert got.without_digest() == ref.strip().partition("@")[0]


@pytest.mark.parametrize("ref", ["", "   ", f"@{DIGEST}", None])
def test_no_name_is_refused(ref: str | None) -> None:
    with pytest.raises(ValueError, match="not an image reference"):
        parse_image_ref(ref)


@pytest.mark.parametrize(("a", "b", "same"), [
    ("vllm/vllm-openai:kimi-k3", f"docker.io/vllm/vllm-openai@{DIGEST}", True),
    ("registry-1.docker.io/library/ubuntu", "ubuntu:22.04", True),
    # podman's name for an image it built or tagged itself answers to the short name.
    ("localhost/vllm/vllm-openai", "vllm/vllm-openai:kimi-k3", True),
    ("docker.io/library/ubuntu", "localhost/ubuntu", True),
    ("localhost:5000/x", "x", False),
    ("nvcr.io/nvidia/pytorch:25.04-py3", "nvidia/pytorch:25.04-py3", False),
    ("vllm/vllm-openai", "vllm/vllm-openai-rocm", False),
])
def test_same_repository(a: str, b: str, same: bool) -> None:
    assert same_repository(a, b) is same
    assert same_repository(b, a) is same


def test_decide_compares_familiar_names() -> None:
    assert image_repository(f"docker.io/vllm/vllm-openai:kimi-k3@{DIGEST}") == "vllm/vllm-openai"
    assert image_repository("registry-1.docker.io/library/ubuntu") == image_repository("ubuntu") == "ubuntu"
    assert image_repository("nvcr.io/nvidia/pytorch:25.04-py3") == "nvcr.io/nvidia/pytorch"
    assert image_repository(None) is None and image_repository(f"@{DIGEST}") is None
    assert image_tag("localhost:5000/x") == "latest" and image_tag("localhost:5000/x:dev") == "dev"


@pytest.mark.parametrize(("ref", "repo_digests", "want"), [
    # docker lists familiar names, podman fully qualified ones or localhost/ for a local build.
    ("vllm/vllm-openai:kimi-k3", ["nvcr.io/nvidia/vllm@sha256:aa", "vllm/vllm-openai@sha256:bb"], "sha256:bb"),
    ("vllm/vllm-openai:kimi-k3", ["quay.io/vllm/vllm-openai@sha256:aa",
                                  "docker.io/vllm/vllm-openai@sha256:bb"], "sha256:bb"),
    ("k3-selfbuilt:dev", ["quay.io/x/k3-selfbuilt@sha256:aa", "localhost/k3-selfbuilt@sha256:bb"], "sha256:bb"),
    (f"vllm/vllm-openai@{DIGEST}", ["vllm/vllm-openai@sha256:bb"], DIGEST),
])
def test_image_inspect_takes_the_digest_of_the_asked_repository(ref: str, repo_digests: list[str],
                                                                 want: str) -> None:
    facts, problem = ctr.parse_image_inspect(ref, 0, json.dumps([{"Id": "sha256:00", "RepoDigests": repo_digests}]),
                                             "")
    assert problem is None and facts["digest"] == want
