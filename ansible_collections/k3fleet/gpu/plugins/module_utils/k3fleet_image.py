# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload, and the controller
# package imports it, so an image reference is split by these rules in one place.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""Image references, split the way the distribution reference grammar does.

``[registry/]path[:tag][@digest]``:

- the digest follows the first ``@``; the tag follows the last ``:`` of the last path component,
  so the port of a registry (``localhost:5000/x``) is never read as a tag;
- the first component is a registry only when more components follow and it contains ``.`` or
  ``:`` or is ``localhost``; otherwise the reference is on Docker Hub (``docker.io``);
- Docker Hub answers under several names (``index.docker.io``, ``registry-1.docker.io``): all are
  ``docker.io``; a one-component path there is an official image, ``library/<name>``.

Reading evidence, the parser is lenient: it does not refuse a name outside the grammar's
character set, it splits it by the same rules.
"""

from __future__ import annotations

DOCKER_HUB = "docker.io"
# Every name Docker Hub answers under; a reference may use any of them.
DOCKER_HUB_NAMES = (DOCKER_HUB, "index.docker.io", "registry-1.docker.io")
# The namespace of Docker Hub's official images (``ubuntu`` is ``docker.io/library/ubuntu``).
OFFICIAL_NAMESPACE = "library"
# Podman's registry name for images it built or tagged itself.
LOCAL_REGISTRY = "localhost"


class ImageRef(object):
    """One parsed reference.

    ``registry`` and ``path`` are normalised (Docker Hub's one name, ``library/`` added);
    ``written`` is the name as the reference wrote it, without tag and digest.
    """

    __slots__ = ("registry", "path", "tag", "digest", "written")

    def __init__(self, registry: str, path: str, tag: str | None, digest: str | None, written: str) -> None:
        self.registry = registry
        self.path = path
        self.tag = tag
        self.digest = digest
        self.written = written

    @property
    def repository(self) -> str:
        """The fully qualified repository (``docker.io/vllm/vllm-openai``), as podman names it."""
        return "%s/%s" % (self.registry, self.path)

    @property
    def familiar(self) -> str:
        """The repository as docker prints it: Docker Hub's name and ``library/`` left out."""
        if self.registry != DOCKER_HUB:
            return self.repository
        prefix = OFFICIAL_NAMESPACE + "/"
        return self.path[len(prefix):] if self.path.startswith(prefix) else self.path

    def without_digest(self) -> str:
        """The reference as written, with its tag and without its digest."""
        return self.written + (":" + self.tag if self.tag else "")

    def _key(self) -> tuple[str, str, str | None, str | None]:
        return (self.registry, self.path, self.tag, self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageRef) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "ImageRef(registry=%r, path=%r, tag=%r, digest=%r)" % self._key()


def parse_image_ref(ref: str | None) -> ImageRef:
    """``ref`` -> :class:`ImageRef`; ``ValueError`` for an empty reference (nothing to name)."""
    text = (ref or "").strip()
    name, at, digest = text.partition("@")
    if not name:
        raise ValueError("not an image reference: %r" % (ref,))
    tag: str | None = None
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1:]
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == LOCAL_REGISTRY):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, name
    if registry.lower() in DOCKER_HUB_NAMES:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = "%s/%s" % (OFFICIAL_NAMESPACE, path)
    return ImageRef(registry, path, tag or None, (digest if at else "") or None, name)


def same_repository(one: str, other: str) -> bool:
    """Whether two references name one repository (tags and digests aside).

    Podman names an image it built or tagged itself ``localhost/<name>`` and resolves the short
    name ``<name>`` to it first, so ``localhost/<name>`` is the repository ``<name>`` names.
    """
    a, b = parse_image_ref(one), parse_image_ref(other)
    if a.repository == b.repository:
        return True
    return any(x.registry == LOCAL_REGISTRY and x.path == y.familiar for x, y in ((a, b), (b, a)))
