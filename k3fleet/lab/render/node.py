"""What every part of a rendered node shares: the recordings it is made of and the node it describes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from k3fleet.lab.osdata import OS_INFO, OsInfo
from k3fleet.lab.profile import BRANCH_CUDA, DriverSpec, Profile

# The lab's fixed clock: rendered output must be identical on every generation.
LAB_TIMESTAMP = "Mon Sep 15 09:00:00 2025"
LAB_ISO_TIME = "2025-09-15T09:00:00"

# The canonical nvidia-smi bus ids of the eight SXM GPUs on an HGX baseboard, in index order.
HGX_BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
               "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0")


@dataclass
class Recording:
    stdout: str = ""
    stderr: str = ""
    rc: int = 0
    sleep: float = 0.0


@dataclass
class HostImage:
    """What one lab host looks like: node files (``None`` is a directory) and command recordings."""

    files: dict[str, str | None] = field(default_factory=dict)
    # tool -> argv -> recording
    commands: dict[str, dict[tuple[str, ...], Recording]] = field(default_factory=dict)

    def record(self, argv: list[str] | tuple[str, ...], rec: Recording) -> None:
        self.commands.setdefault(argv[0], {})[tuple(argv)] = rec

    def forget(self, argv: list[str] | tuple[str, ...]) -> None:
        tool = self.commands.get(argv[0])
        if tool is None:
            return
        tool.pop(tuple(argv), None)
        if not tool:
            del self.commands[argv[0]]


def hex_of(seed: str, length: int = 64) -> str:
    """A stable hex string of ``length`` digits derived from ``seed`` (ids, digests, UUIDs)."""
    out = ""
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(f"{seed}#{counter}".encode()).hexdigest()
        counter += 1
    return out[:length]


def gpu_uuid(hostname: str, index: int) -> str:
    h = hex_of(f"gpu-uuid/{hostname}/{index}", 32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def kv_block(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"{k}={v}\n" for k, v in pairs)


def lines_text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


class Node:
    """One profile's node as every renderer sees it: its OS, kernel, driver and runtime."""

    def __init__(self, profile: Profile, image: str) -> None:
        self.p = profile
        self.image = image
        self.os: OsInfo = OS_INFO[profile.os]
        self.kernel = profile.kernel or self.os.default_kernel
        self.drv: DriverSpec | None = profile.driver
        self.runtime = profile.container.runtime

    @property
    def module_loaded(self) -> bool:
        return self.drv is not None and self.drv.loaded

    def cuda_of(self, version: str) -> str:
        if self.drv is not None and self.drv.cuda and version == self.drv.running_version:
            return self.drv.cuda
        return BRANCH_CUDA.get(version.split(".", 1)[0], "")

    def bus_ids(self) -> list[str]:
        g = self.p.gpus
        if g.pci_bus_ids is not None:
            return list(g.pci_bus_ids)
        ids = list(HGX_BUS_IDS[: g.count])
        # Beyond one HGX baseboard, continue on further buses in the same layout.
        bus = 0xE0
        while len(ids) < g.count:
            ids.append(f"00000000:{bus:02X}:00.0")
            bus += 1
        return ids


class Part:
    """A renderer of one side of the node (driver, packages, PCI and RDMA, container, scheduler)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.p = node.p
        self.os = node.os
        self.kernel = node.kernel
        self.drv = node.drv
        self.runtime = node.runtime
        self.image = node.image
