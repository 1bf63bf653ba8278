"""Render a lab profile into the files and command outputs a real node would show.

Every output is written in the format the real tool prints (see the notes at each renderer
and tests/fixtures/lab/ for the captures they follow). File paths and argv come from
k3fleet_sources, so the lab answers exactly the questions a collector asks. A profile's
``raw`` captures replace the rendered text of the same source name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.osdata import OS_INFO, OsInfo, kernel_package_rows
from k3fleet.lab.profile import (
    BRANCH_CUDA,
    DYNAMIC_COMMANDS,
    KMD_HEADER_BRANCH,
    RAW_FILE_SOURCES,
    FabricHealthSpec,
    Profile,
    RawCapture,
)

# The lab's fixed clock: rendered output must be identical on every generation.
LAB_TIMESTAMP = "Mon Sep 15 09:00:00 2025"
LAB_ISO_TIME = "2025-09-15T09:00:00"


# The canonical nvidia-smi bus ids of the eight SXM GPUs on an HGX baseboard, in index order.
HGX_BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
               "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0")
NVSWITCH_BDFS = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0",
                 "0000:09:00.0", "0000:0a:00.0", "0000:0b:00.0", "0000:0c:00.0")

IB_STATE_CODES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
IB_PHYS_CODES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}

# nvidia-smi exit statuses: 9 driver not loaded (nvidia-smi man page); 18 is what it returns
# for NVML_ERROR_LIB_RM_VERSION_MISMATCH (the NVML return code is passed through).
SMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                 "Make sure that the latest NVIDIA driver is installed and running.\n\n")
# docs/facts.md section 8, verbatim.
REQUIREMENT_ERROR = ("nvidia-container-cli: requirement error: unsatisfied condition: {req}, please "
                     "update your driver to a newer version, or use an earlier cuda container")


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


def _hex(seed: str, length: int = 64) -> str:
    out = ""
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(f"{seed}#{counter}".encode()).hexdigest()
        counter += 1
    return out[:length]


def gpu_uuid(hostname: str, index: int) -> str:
    h = _hex(f"gpu-uuid/{hostname}/{index}", 32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _kv_block(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"{k}={v}\n" for k, v in pairs)


class ProfileRenderer:
    """Renders one profile; host-independent output is computed once and shared by every host."""

    def __init__(self, profile: Profile, image: str) -> None:
        self.p = profile
        self.image = image
        self.os: OsInfo = OS_INFO[profile.os]
        self.kernel = profile.kernel or self.os.default_kernel
        self.drv = profile.driver
        self.runtime = profile.container.runtime
        self._shared = self._render_shared()

    # -- driver state -----------------------------------------------------------------
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

    # -- files ------------------------------------------------------------------------
    def proc_driver_version(self) -> str:
        assert self.drv is not None
        v = self.drv.running_version
        # docs/facts.md section 5: the open module inserts "Open ... for x86_64" and a build tag.
        if self.drv.running_flavour == "open":
            first = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
                     f"(dvs-builder@U16-A24-9-2)  {self.drv.build_date}")
        else:
            first = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  {self.drv.build_date}"
        return f"{first}\nGCC version:  {self._gcc()}\n"

    def _gcc(self) -> str:
        return {
            "ubuntu-22.04": "gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) ",
            "ubuntu-24.04": "gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) ",
            "rhel-9": "gcc version 11.4.1 20231218 (Red Hat 11.4.1-3) (GCC) ",
        }[self.p.os]

    def proc_modules(self) -> str:
        # /proc/modules: name size refcount deps state address taint. Addresses read as zero
        # for non-root readers; taint: P proprietary, O out-of-tree, E unsigned (DKMS builds
        # are not signed by the distribution key).
        lines = []
        if self.module_loaded:
            assert self.drv is not None
            taint = ("P" if self.drv.running_flavour == "proprietary" else "") + "O" + ("E" if self.drv.dkms else "")
            users = ["nvidia_uvm"] + (["nvidia_peermem"] if self.p.nvidia_peermem else []) + ["nvidia_modeset"]
            lines.append(f"nvidia_uvm 2076672 0 - Live 0x0000000000000000 ({taint})")
            lines.append(f"nvidia_drm 135168 0 - Live 0x0000000000000000 ({taint})")
            if self.p.nvidia_peermem:
                lines.append(f"nvidia_peermem 16384 0 - Live 0x0000000000000000 ({taint})")
            lines.append(f"nvidia_modeset 1638400 1 nvidia_drm, Live 0x0000000000000000 ({taint})")
            lines.append(f"nvidia 104071168 {len(users) + 40} {','.join(users)}, Live 0x0000000000000000 "
                         f"({taint})")
        if self.p.infiniband.hcas:
            lines += [
                "mlx5_ib 495616 0 - Live 0x0000000000000000",
                "ib_uverbs 176128 2 nvidia_peermem,mlx5_ib, Live 0x0000000000000000"
                if self.module_loaded and self.p.nvidia_peermem
                else "ib_uverbs 176128 1 mlx5_ib, Live 0x0000000000000000",
                "ib_core 442368 3 mlx5_ib,ib_uverbs,ib_ipoib, Live 0x0000000000000000",
                "mlx5_core 2191360 1 mlx5_ib, Live 0x0000000000000000",
            ]
        lines += [
            "ib_ipoib 139264 0 - Live 0x0000000000000000",
        ] if self.p.infiniband.hcas else []
        lines += [
            "ipmi_si 81920 0 - Live 0x0000000000000000",
            "ipmi_devintf 20480 0 - Live 0x0000000000000000",
            "ipmi_msghandler 77824 2 ipmi_devintf,ipmi_si, Live 0x0000000000000000",
            "overlay 151552 0 - Live 0x0000000000000000",
            "nf_tables 376832 0 - Live 0x0000000000000000",
        ]
        return "".join(line + "\n" for line in lines)

    def os_release(self) -> str:
        return self.os.os_release

    def nccl_conf(self) -> str | None:
        if self.p.nccl_conf is None:
            return None
        return _kv_block(list(self.p.nccl_conf.items()))

    def etc_environment(self) -> str:
        path = ('PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/games:'
                '/usr/local/games:/snap/bin"\n') if self.os.family == "debian" else ""
        return path + _kv_block(list(self.p.environment.items()))

    def apt_auto_upgrades(self) -> str | None:
        u = self.p.unattended_upgrades
        if self.os.family != "debian" or not u.installed:
            return None
        flag = "1" if u.enabled else "0"
        return f'APT::Periodic::Update-Package-Lists "{flag}";\nAPT::Periodic::Unattended-Upgrade "{flag}";\n'

    def dnf_versionlock(self) -> str | None:
        if self.os.family != "redhat":
            return None
        held = [name for name, _v, _a, is_held in self._rpm_packages() if is_held]
        if not held:
            return None
        # versionlock.list entries are NEVRA globs with the epoch; NVIDIA's RPMs carry epoch 3.
        lines = []
        for name, vr, _arch, is_held in self._rpm_packages():
            if is_held:
                epoch = "3" if name.startswith(("nvidia-", "kmod-nvidia", "cuda-drivers")) else "0"
                lines.append(f"{name}-{epoch}:{vr}.*")
        return "".join(line + "\n" for line in lines)

    def infiniband_files(self) -> dict[str, str | None]:
        ib = self.p.infiniband
        base = sources.FILES["infiniband_dir"]
        out: dict[str, str | None] = {}
        for dev in ib.device_names():
            port = ib.ports.get(dev)
            state = port.state if port else "ACTIVE"
            phys = port.phys_state if port else "LinkUp"
            rate = (port.rate if port and port.rate else None) or ib.rate
            layer = (port.link_layer if port and port.link_layer else None) or ib.link_layer
            d = f"{base}/{dev}/ports/1"
            out[f"{d}/state"] = f"{IB_STATE_CODES[state]}: {state}\n"
            out[f"{d}/phys_state"] = f"{IB_PHYS_CODES[phys]}: {phys}\n"
            out[f"{d}/rate"] = f"{rate}\n"
            out[f"{d}/link_layer"] = f"{layer}\n"
        return out

    def nvswitch_dirs(self) -> dict[str, str | None]:
        if not self.module_loaded or not self.p.nvswitches:
            return {}
        base = sources.FILES["nvswitch_devices_dir"]
        return {f"{base}/{bdf}": None for bdf in NVSWITCH_BDFS[: self.p.nvswitches]}

    # -- packages ---------------------------------------------------------------------
    def _driver_packages(self) -> list[tuple[str, str, str]]:
        """(name, version, role) of the installed NVIDIA packages, named as the distribution does."""
        out: list[tuple[str, str, str]] = []
        drv = self.drv
        fm_version = self.p.fabricmanager_version
        if self.os.manager == "dpkg":
            if drv is not None:
                b, ver = drv.branch, drv.version + self.os.driver_pkg_suffix
                open_ = "-open" if drv.flavour == "open" else ""
                out += [(f"nvidia-driver-{b}-server{open_}", ver, "driver"),
                        (f"nvidia-utils-{b}-server", ver, "driver"),
                        (f"nvidia-compute-utils-{b}-server", ver, "driver"),
                        (f"nvidia-kernel-common-{b}-server", ver, "driver"),
                        (f"libnvidia-compute-{b}:amd64", ver, "driver")]
                if drv.dkms:
                    out += [(f"nvidia-dkms-{b}-server{open_}", ver, "driver"),
                            (f"nvidia-kernel-source-{b}-server{open_}", ver, "driver")]
                else:
                    out.append((f"linux-modules-nvidia-{b}-server{open_}-{self.kernel}",
                                f"{self.kernel.rsplit('-', 1)[0]}+{drv.version}", "driver"))
            if fm_version is not None:
                fb = fm_version.split(".", 1)[0]
                out += [(f"nvidia-fabricmanager-{fb}", f"{fm_version}-1", "fabricmanager"),
                        (f"cuda-drivers-fabricmanager-{fb}", f"{fm_version}-1", "fabricmanager")]
        else:
            if drv is not None:
                ver = drv.version + self.os.driver_pkg_suffix
                kmod = ("kmod-nvidia-open-dkms" if drv.flavour == "open" else "kmod-nvidia-latest-dkms") \
                    if drv.dkms else f"kmod-nvidia-{drv.version}-{self.kernel.rsplit('.', 1)[0]}"
                out += [("nvidia-driver", ver, "driver"), ("nvidia-driver-cuda", ver, "driver"),
                        ("nvidia-driver-libs", ver, "driver"), ("nvidia-driver-cuda-libs", ver, "driver"),
                        ("nvidia-kmod-common", ver, "driver"), ("nvidia-persistenced", ver, "driver"),
                        (kmod, ver, "driver")]
            if fm_version is not None:
                fb = fm_version.split(".", 1)[0]
                out += [(f"nvidia-fabricmanager-{fb}", f"{fm_version}-1", "fabricmanager"),
                        (f"cuda-drivers-fabricmanager-{fb}", f"{fm_version}-1", "fabricmanager")]
        return out

    def _other_packages(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        c = self.p.container
        rpm = self.os.manager == "rpm"
        if c.toolkit_version:
            tk = f"{c.toolkit_version}-1"
            out += [("nvidia-container-toolkit", tk), ("nvidia-container-toolkit-base", tk),
                    ("libnvidia-container-tools", tk),
                    ("libnvidia-container1" if rpm else "libnvidia-container1:amd64", tk)]
        if self.runtime == "docker":
            dist = "el9" if rpm else f"ubuntu.{self.p.os.split('-')[1]}~{self._codename()}"
            sep = "." if rpm else "~"
            out += [("docker-ce", f"{'' if rpm else '5:'}{c.runtime_version}-1{sep}{dist}"),
                    ("docker-ce-cli", f"{'' if rpm else '5:'}{c.runtime_version}-1{sep}{dist}"),
                    ("containerd.io", "1.7.27-1" if not rpm else "1.7.27-3.1.el9")]
        elif self.runtime == "podman":
            out.append(("podman", f"{c.runtime_version}-1" if rpm else f"{c.runtime_version}+ds1-1ubuntu1"))
        out += sorted(self.p.compat_packages.items())
        if self.drv is not None and self.drv.dkms:
            out.append(("dkms", "3.1.6-1.el9" if rpm else
                        ("2.8.7-2ubuntu2.2" if self.p.os == "ubuntu-22.04" else "3.0.11-1ubuntu13")))
        return out

    def _codename(self) -> str:
        return {"ubuntu-22.04": "jammy", "ubuntu-24.04": "noble"}.get(self.p.os, "")

    def _held(self, name: str, role: str) -> bool:
        bare = name.split(":", 1)[0]
        if bare in self.p.held_packages or name in self.p.held_packages:
            return True
        if role == "driver" and self.drv is not None:
            return self.drv.held
        if role == "fabricmanager":
            return self.p.fabricmanager.held
        return False

    def dpkg_query(self) -> str:
        rows: list[tuple[str, str, bool]] = []
        rows += [(r[0], r[1], False) for r in self.os.base]
        rows += [(r[0], r[1], False) for r in self.os.platform]
        rows += [(r[0], r[1], False) for r in kernel_package_rows(self.os, self.kernel)]
        if self.p.unattended_upgrades.installed and self.os.unattended_package:
            rows.append((self.os.unattended_package[0], self.os.unattended_package[1], False))
        rows += [(n, v, self._held(n, role)) for n, v, role in self._driver_packages()]
        rows += [(n, v, self._held(n, "other")) for n, v in self._other_packages()]
        rows.sort(key=lambda r: r[0])
        # ${db:Status-Abbrev} is three characters: want, status, error flag ("ii ", "hi ").
        return "".join(f"{n}\t{v}\t{'h' if held else 'i'}i \n" for n, v, held in rows)

    def _rpm_packages(self) -> list[tuple[str, str, str, bool]]:
        rows: list[tuple[str, str, str, bool]] = []
        rows += [(r[0], r[1], r[2], False) for r in self.os.base]
        rows += [(r[0], r[1], r[2], False) for r in self.os.platform]
        rows += [(r[0], r[1], r[2], False) for r in kernel_package_rows(self.os, self.kernel)]
        if self.p.unattended_upgrades.installed and self.os.unattended_package:
            name, ver, arch = self.os.unattended_package
            rows.append((name, ver, arch, False))
        rows += [(n, v, "x86_64", self._held(n, role)) for n, v, role in self._driver_packages()]
        rows += [(n, v, "x86_64", self._held(n, "other")) for n, v in self._other_packages()]
        return rows

    def rpm_query(self) -> str:
        # rpm -qa lists in database order, not sorted; keep insertion order.
        return "".join(f"{n}\t{vr}\t{a}\n" for n, vr, a, _h in self._rpm_packages())

    # -- commands ---------------------------------------------------------------------
    def _smi_failure(self) -> Recording | None:
        assert self.drv is not None
        if not self.drv.loaded:
            return Recording(stdout=SMI_NO_DRIVER, rc=9)
        if self.drv.pending_reboot:
            # The user-space library is the new package; the kernel still runs the old module.
            lib = ".".join(self.drv.version.split(".")[:2])
            return Recording(stdout="Failed to initialize NVML: Driver/library version mismatch\n"
                                    f"NVML library version: {lib}\n", rc=18)
        return None

    def nvidia_smi_query(self, hostname: str) -> Recording:
        failure = self._smi_failure()
        if failure:
            return failure
        g = self.p.gpus
        assert self.drv is not None
        pm = "Enabled" if g.persistence_mode else "Disabled"
        lines = [f"{i}, {g.model}, {gpu_uuid(hostname, i)}, {self.drv.running_version}, {g.memory_mib}, "
                 f"{pm}, {bus}, {g.compute_cap}" for i, bus in enumerate(self.bus_ids())]
        return Recording(stdout="".join(line + "\n" for line in lines))

    def fabric_state(self) -> str:
        """The NVLink fabric State nvidia-smi -q prints for this host's GPUs."""
        drv = self.drv
        major = self.p.gpus.compute_cap.split(".", 1)[0]
        # Fabric registration exists from Hopper on, and only with NVSwitches; older boards and
        # boards without a fabric print N/A (tests/fixtures/driver/SOURCES.md: A100 HGX, RTX 4090).
        if drv is None or not self.p.nvswitches or not major.isdigit() or int(major) < 9:
            return "N/A"
        fm = self.p.fabricmanager
        if fm.installed and fm.active == "active" and self.p.fabricmanager_version == drv.running_version:
            return "Completed"
        # Without a running Fabric Manager of the driver's version the GPUs wait in registration:
        # "In Progress" (NVIDIA/NVSentinel#889: stays "In Progress" while FM is down;
        # NVIDIA/gpu-operator#2511 shows the block; the FM user guide quoted in
        # siderolabs/extensions#717: "In Progress ... FabricManager is likely not running").
        return "In Progress"

    def _smi_header(self, version: str) -> str:
        def row(label: str, value: str) -> str:
            return f"{label:<42}: {value}\n"

        cuda = self.cuda_of(version)
        out = row("Timestamp", LAB_TIMESTAMP)
        branch = version.split(".", 1)[0]
        if branch.isdigit() and int(branch) >= KMD_HEADER_BRANCH:
            # R610 keeps the old lines, marked deprecated, and adds the new names after them
            # (docs/facts.md section 12; tests/fixtures/driver/smi_q_610_header_kmd.txt).
            gone = "[Deprecated; will be removed in CUDA 14.0. Use {} instead]"
            out += row("Driver Version", f"{version} {gone.format('KMD Version')}")
            out += row("CUDA Version", f"{cuda} {gone.format('CUDA UMD Version')}")
            return out + row("KMD Version", version) + row("CUDA UMD Version", cuda)
        return out + row("Driver Version", version) + row("CUDA Version", cuda)

    @staticmethod
    def _health_rows(spec: FabricHealthSpec | None, index: int, completed: bool,
                     row: Callable[[str, str, int], str]) -> str:
        """The Fabric > Health lines: R565's one line without a spec, R580's seven with one."""
        if spec is None:
            return row("Bandwidth", "N/A", 12)
        faulty = spec if spec.gpus is None or index in spec.gpus else FabricHealthSpec()
        values = [("Summary", faulty.summary), ("Bandwidth", faulty.bandwidth),
                  ("Route Recovery in progress", faulty.route_recovery_in_progress),
                  ("Route Unhealthy", faulty.route_unhealthy),
                  ("Access Timeout Recovery", faulty.access_timeout_recovery),
                  ("Incorrect Configuration", faulty.incorrect_configuration),
                  ("Partition Assigned", faulty.partition_assigned)]
        # Before registration completes nothing is known about the fabric's health.
        return "".join(row(label, value if completed else "N/A", 12) for label, value in values)

    def _process_rows(self, index: int, row: Callable[[str, str, int], str]) -> str:
        procs = self.p.gpus.processes_on(index)
        if not procs:
            return row("Processes", "None", 4)
        # The layout of a real busy node (tests/fixtures/driver/smi_q_535_rtx4090x8_fabric_na.txt).
        out = "    Processes\n"
        for proc in procs:
            out += row("GPU instance ID", "N/A", 8) + row("Compute instance ID", "N/A", 8)
            out += row("Process ID", str(proc.pid), 8) + row("Type", proc.type, 12) + row("Name", proc.name, 12)
            out += row("Used GPU Memory", f"{proc.used_mib} MiB", 12)
        return out

    def _link_rows(self, index: int, row: Callable[[str, str, int], str]) -> str:
        """PCI > GPU Link Info, in the nesting of the 8x H100 capture (tests/fixtures/driver/SOURCES.md)."""
        g = self.p.gpus
        h = g.health_of(index)
        gen = h.pcie_gen or g.pcie_gen_max
        return ("        GPU Link Info\n            PCIe Generation\n" + row("Max", str(g.pcie_gen_max), 16)
                + row("Current", str(gen), 16) + row("Device Current", str(gen), 16)
                + row("Device Max", str(g.pcie_gen_max), 16) + row("Host Max", str(g.pcie_gen_max), 16)
                + "            Link Width\n" + row("Max", "16x", 16) + row("Current", f"{h.pcie_width or 16}x", 16))

    def _clock_event_rows(self, index: int, row: Callable[[str, str, int], str]) -> str:
        """Clocks Event Reasons in R565's labels and order (the H100 capture; docs/facts.md section 14)."""
        h = self.p.gpus.health_of(index)

        def flag(label: str, indent: int = 8) -> str:
            return row(label, "Active" if label in h.clock_events else "Not Active", indent)

        idle = "Idle" in h.clock_events or not self.p.gpus.processes_on(index)
        out = "    Clocks Event Reasons\n" + row("Idle", "Active" if idle else "Not Active", 8)
        out += row("Applications Clocks Setting", "Not Active", 8) + flag("SW Power Cap") + flag("HW Slowdown")
        out += flag("HW Thermal Slowdown", 12) + flag("HW Power Brake Slowdown", 12)
        out += row("Sync Boost", "Not Active", 8) + flag("SW Thermal Slowdown")
        return out + row("Display Clock Setting", "Not Active", 8)

    def _memory_error_rows(self, index: int, row: Callable[[str, str, int], str]) -> str:
        """ECC Mode, ECC Errors, Retired Pages and Remapped Rows as the H100 capture prints them."""
        h = self.p.gpus.health_of(index)
        out = "    ECC Mode\n" + row("Current", "Enabled", 8) + row("Pending", "Enabled", 8) + "    ECC Errors\n"
        for scope, dram in (("Volatile", h.ecc_volatile_uncorrectable), ("Aggregate", h.ecc_aggregate_uncorrectable)):
            out += f"        {scope}\n" + row("SRAM Correctable", "0", 12) + row("SRAM Uncorrectable Parity", "0", 12)
            out += row("SRAM Uncorrectable SEC-DED", "0", 12) + row("DRAM Correctable", "0", 12)
            out += row("DRAM Uncorrectable", str(dram), 12)
            if scope == "Aggregate":
                out += row("SRAM Threshold Exceeded", "No", 12)
        out += "    Retired Pages\n" + row("Single Bit ECC", "N/A", 8) + row("Double Bit ECC", "N/A", 8)
        out += row("Pending Page Blacklist", "N/A", 8)
        out += "    Remapped Rows\n" + row("Correctable Error", "0", 8)
        out += row("Uncorrectable Error", str(h.remapped_uncorrectable), 8)
        out += row("Pending", "Yes" if h.remap_pending else "No", 8)
        out += row("Remapping Failure Occurred", "Yes" if h.remap_failure else "No", 8)
        return out

    def dmesg(self) -> Recording:
        """The kernel log: the module's load line (docs/facts.md section 5) and the profile's Xid lines in
        the driver's format (tests/fixtures/gpu_health/SOURCES.md). Refused as util-linux dmesg refuses
        it under kernel.dmesg_restrict=1."""
        if self.p.dmesg_restricted:
            return Recording(stderr="dmesg: read kernel buffer failed: Operation not permitted\n", rc=1)
        return Recording(stdout="".join(line + "\n" for line in self._kernel_lines()))

    def journalctl_kernel(self, hostname: str) -> Recording:
        """journalctl -k -b -o short-iso: the same kernel lines with the journal's prefix."""
        stamp = "2026-11-30T21:04:11+0000"
        return Recording(stdout="".join(f"{stamp} {hostname} kernel: {line.split('] ', 1)[-1]}\n"
                                        for line in self._kernel_lines()))

    def _kernel_lines(self) -> list[str]:
        lines = []
        if self.drv is not None and self.module_loaded:
            first = self.proc_driver_version().splitlines()[0].removeprefix("NVRM version: ")
            lines.append(f"[    5.812337] NVRM: loading {first}")
        bus_ids = self.bus_ids()
        for x in sorted(self.p.xid, key=lambda x: x.uptime_s):
            _domain, bus, dev_fn = bus_ids[x.gpu].split(":")
            who = f"pid={x.pid}, name={x.name or 'python3'}, " if x.pid is not None else ""
            lines.append(f"[{x.uptime_s:12.6f}] NVRM: Xid (PCI:0000:{bus.lower()}:{dev_fn.split('.')[0]}): {x.code}, "
                         f"{who}{x.text}")
        return lines

    def nvidia_smi_q(self, hostname: str) -> Recording:
        """Full `nvidia-smi -q`: the header, then one block per GPU in nvidia-smi's key order.

        The blocks carry the sections a collector reads (identity, PCI, memory, compute mode,
        Fabric with its Health, Processes) in the order and nesting of a real 8x H100 HGX capture
        (tests/fixtures/lab/nvidia_smi_q_gpu_h100_565.txt); sections with sensor readings are
        left out rather than invented. R610-and-newer drivers print the KMD header.
        """
        failure = self._smi_failure()
        if failure:
            return failure
        assert self.drv is not None
        v = self.drv.running_version
        g = self.p.gpus

        def row(label: str, value: str, indent: int = 0) -> str:
            return f"{' ' * indent}{label:<{42 - indent}}: {value}\n"

        out = "\n==============NVSMI LOG==============\n\n"
        out += self._smi_header(v)
        out += "\n" + row("Attached GPUs", str(g.count))
        state = self.fabric_state()
        completed = state == "Completed"
        for index, bus_id in enumerate(self.bus_ids()):
            _domain, bus, dev_fn = bus_id.split(":")
            device = dev_fn.split(".", 1)[0]
            used = g.used_mib(index)
            out += f"GPU {bus_id}\n"
            out += row("Product Name", g.model, 4) + row("Product Brand", "NVIDIA", 4)
            out += row("Persistence Mode", "Enabled" if g.persistence_mode else "Disabled", 4)
            out += "    MIG Mode\n" + row("Current", "Disabled", 8) + row("Pending", "Disabled", 8)
            out += row("GPU UUID", gpu_uuid(hostname, index), 4) + row("Minor Number", str(index), 4)
            out += row("GSP Firmware Version", v, 4)
            out += "    PCI\n" + row("Bus", f"0x{bus}", 8) + row("Device", f"0x{device}", 8)
            out += row("Domain", "0x0000", 8) + row("Device Id", f"0x{g.pci_device_id.upper()}10DE", 8)
            out += row("Bus Id", bus_id, 8) + self._link_rows(index, row)
            out += self._clock_event_rows(index, row)
            out += "    FB Memory Usage\n" + row("Total", f"{g.memory_mib} MiB", 8)
            out += row("Used", f"{used} MiB", 8) + row("Free", f"{g.memory_mib - used} MiB", 8)
            out += row("Compute Mode", g.compute_mode, 4) + self._memory_error_rows(index, row)
            # A single-node NVSwitch fabric has clique 0 and a zero cluster UUID (the H100 capture).
            out += "    Fabric\n" + row("State", state, 8) + row("Status", "Success" if completed else "N/A", 8)
            out += row("CliqueId", "0" if completed else "N/A", 8)
            out += row("ClusterUUID", "00000000-0000-0000-0000-000000000000" if completed else "N/A", 8)
            out += "        Health\n" + self._health_rows(g.fabric_health, index, completed, row)
            out += self._process_rows(index, row) + "\n"
        return Recording(stdout=out)

    def dkms_status(self) -> Recording:
        assert self.drv is not None
        v = self.drv.version
        if self.os.dkms_slash_format:
            line = f"nvidia/{v}, {self.kernel}, x86_64: installed"
        else:
            line = f"nvidia, {v}, {self.kernel}, x86_64: installed"
        return Recording(stdout=line + "\n")

    def systemctl_show(self) -> Recording:
        argv = sources.COMMANDS["systemctl_show"]
        units = [a for a in argv[argv.index("-p") + 2:] if not a.startswith("-")]
        blocks = [self._unit_block(unit) for unit in units]
        return Recording(stdout="\n".join(blocks))

    def _unit_block(self, unit: str) -> str:
        fm = self.p.fabricmanager
        u = self.p.unattended_upgrades
        sub_of = {"active": "running", "failed": "failed", "inactive": "dead", "activating": "start"}
        state: tuple[str, str, str, str] | None = None  # load, active, sub, unit-file
        if unit == "nvidia-fabricmanager.service" and fm.installed and self.p.fabricmanager_version:
            state = ("loaded", fm.active, sub_of[fm.active], fm.enabled)
        elif unit == "nvidia-persistenced.service" and self.drv is not None:
            if self.p.gpus.persistence_mode and self.module_loaded:
                state = ("loaded", "active", "running", "enabled")
            else:
                state = ("loaded", "inactive", "dead", "disabled")
        elif unit == "unattended-upgrades.service" and self.os.family == "debian" and u.installed:
            # The service is the shutdown-time hook and runs either way; the apt.conf.d flags decide.
            state = ("loaded", "active", "running", "enabled")
        elif unit == "dnf-automatic.timer" and self.os.family == "redhat" and u.installed:
            state = ("loaded", "active", "waiting", "enabled") if u.enabled else \
                ("loaded", "inactive", "dead", "disabled")
        if state is None:
            state = ("not-found", "inactive", "dead", "")
        load, active, sub, file_state = state
        return _kv_block([("Id", unit), ("LoadState", load), ("ActiveState", active),
                          ("SubState", sub), ("UnitFileState", file_state)])

    def fabricmanager_version(self) -> Recording:
        return Recording(stdout=f"Fabric Manager version is : {self.p.fabricmanager_version}\n")

    def lspci_vvv(self) -> str:
        # lspci -vvv as root: one block per function, capability lines indented with tabs;
        # ACS control (ACSCtl) on the switch downstream ports above each GPU.
        acs_on = self.p.acs.enabled
        ctl = ("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-" if acs_on
               else "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-")
        blocks = []
        for bus_id in self.bus_ids():
            bus = int(bus_id.split(":")[1], 16)
            bridge = f"{bus - 1:02x}:00.0"
            blocks.append(
                f"{bridge} PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) "
                "(prog-if 00 [Normal decode])\n"
                "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ "
                "FastB2B- DisINTx+\n"
                "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- "
                ">SERR- <PERR- INTx-\n"
                "\tLatency: 0, Cache Line Size: 64 bytes\n"
                f"\tBus: primary={bus - 2:02x}, secondary={bus:02x}, subordinate={bus:02x}, sec-latency=0\n"
                "\tCapabilities: [40] Power Management version 3\n"
                "\t\tFlags: PMEClk- DSI- D1- D2- AuxCurrent=0mA PME(D0+,D1-,D2-,D3hot+,D3cold+)\n"
                "\t\tStatus: D0 NoSoftRst+ PME-Enable- DSel=0 DScale=0 PME-\n"
                "\tCapabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00\n"
                "\tCapabilities: [1c0 v1] Access Control Services\n"
                "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ "
                "DirectTrans+\n"
                f"\t\tACSCtl:\t{ctl}\n"
                "\tKernel driver in use: pcieport\n")
            gpu = (f"{bus:02x}:00.0 3D controller: NVIDIA Corporation Device {self.p.gpus.pci_device_id} "
                   "(rev a1)\n"
                   "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ "
                   "FastB2B- DisINTx+\n"
                   "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- "
                   ">SERR- <PERR- INTx-\n"
                   "\tCapabilities: [60] Power Management version 3\n"
                   "\tCapabilities: [78] Express (v2) Endpoint, MSI 00\n")
            if self.module_loaded:
                gpu += "\tKernel driver in use: nvidia\n"
            if self.drv is not None:
                gpu += "\tKernel modules: nvidia\n"
            blocks.append(gpu)
        return "\n".join(blocks) + "\n"

    def nvidia_ctk_version(self) -> Recording:
        c = self.p.container
        out = f"NVIDIA Container Toolkit CLI version {c.toolkit_version}\n"
        if c.toolkit_commit:
            out += f"commit: {c.toolkit_commit}\n"
        return Recording(stdout=out)

    def runtime_version(self) -> Recording:
        c = self.p.container
        if self.runtime == "docker":
            build = f", build {c.runtime_build}" if c.runtime_build else ""
            return Recording(stdout=f"Docker version {c.runtime_version}{build}\n")
        return Recording(stdout=f"podman version {c.runtime_version}\n")

    # -- serving image ------------------------------------------------------------------
    def image_ids(self) -> tuple[str, str]:
        spec = self.p.container.image
        digest = (spec.digest or _hex(f"digest/{self.image}")).removeprefix("sha256:")
        image_id = (spec.id or _hex(f"id/{self.image}/{spec.cuda_version}")).removeprefix("sha256:")
        return digest, image_id

    def image_env(self) -> list[str]:
        spec = self.p.container.image
        # The nvidia/cuda base image's variables, then vLLM's, then the profile's own.
        env = {
            "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin",
            "NVARCH": "x86_64",
            "NVIDIA_REQUIRE_CUDA": spec.nvidia_require_cuda,
            "CUDA_VERSION": spec.cuda_version,
            "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
            "UV_HTTP_TIMEOUT": "500",
            "VLLM_USAGE_SOURCE": "production-docker-image",
        }
        env.update(spec.env)
        return [f"{k}={v}" for k, v in env.items()]

    def image_labels(self) -> dict[str, str]:
        spec = self.p.container.image
        # The Ubuntu base image's OCI labels; a release pipeline that tags the image with its
        # vLLM version overwrites org.opencontainers.image.version with it.
        labels = {"maintainer": "NVIDIA CORPORATION <cudatools@nvidia.com>",
                  "org.opencontainers.image.ref.name": "ubuntu",
                  "org.opencontainers.image.version": "22.04"}
        if spec.vllm_version:
            labels.update({"org.opencontainers.image.source": "https://github.com/vllm-project/vllm",
                           "org.opencontainers.image.title": "vllm-openai",
                           "org.opencontainers.image.version": spec.vllm_version})
        labels.update(spec.labels)
        return labels

    def image_inspect(self) -> Recording:
        spec = self.p.container.image
        by_digest = "@" in self.image
        if by_digest:
            repo = self.image.split("@", 1)[0]
        else:
            repo = self.image.rsplit(":", 1)[0] if ":" in self.image.rsplit("/", 1)[-1] else self.image
        if not spec.present:
            if self.runtime == "docker":
                return Recording(stdout="[]\n", stderr=f"Error response from daemon: No such image: {self.image}\n",
                                 rc=1)
            return Recording(stdout="[]\n", stderr=f"Error: {self.image}: image not known\n", rc=125)
        digest, image_id = self.image_ids()
        if by_digest:
            # Pulled by digest: the reference names the digest, and the image has no tag.
            digest = self.image.split("@sha256:", 1)[-1]
        tags = [] if by_digest else [self.image]
        layers = [f"sha256:{_hex(f'layer/{self.image}/{i}')}" for i in range(4)]
        if self.runtime == "docker":
            doc: dict[str, Any] = {
                "Id": f"sha256:{image_id}",
                "RepoTags": tags,
                "RepoDigests": [f"{repo}@sha256:{digest}"],
                "Parent": "",
                "Comment": "buildkit.dockerfile.v0",
                "Created": spec.created,
                "DockerVersion": "",
                "Author": "",
                "Config": {
                    "Hostname": "", "Domainname": "", "User": "", "AttachStdin": False,
                    "AttachStdout": False, "AttachStderr": False, "Tty": False, "OpenStdin": False,
                    "StdinOnce": False, "Env": self.image_env(), "Cmd": None, "Image": "",
                    "Volumes": None, "WorkingDir": "/vllm-workspace",
                    "Entrypoint": ["vllm", "serve"], "OnBuild": None, "Labels": self.image_labels(),
                },
                "Architecture": "amd64",
                "Os": "linux",
                "Size": 21474836480,
                "GraphDriver": {"Data": None, "Name": "overlayfs"},
                "RootFS": {"Type": "layers", "Layers": layers},
                "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
            }
        else:
            doc = {
                "Id": image_id,
                "Digest": f"sha256:{digest}",
                # podman names images fully qualified.
                "RepoTags": [t if t.split("/", 1)[0].count(".") else f"docker.io/{t}" for t in tags],
                "RepoDigests": [f"{repo}@sha256:{digest}"],
                "Parent": "",
                "Comment": "buildkit.dockerfile.v0",
                "Created": spec.created,
                "Config": {"Env": self.image_env(), "Entrypoint": ["vllm", "serve"],
                           "WorkingDir": "/vllm-workspace", "Labels": self.image_labels()},
                "Version": "",
                "Author": "",
                "Architecture": "amd64",
                "Os": "linux",
                "Size": 21474836480,
                "VirtualSize": 21474836480,
                "GraphDriver": {"Name": "overlay", "Data": {}},
                "RootFS": {"Type": "layers", "Layers": layers},
                "Labels": self.image_labels(),
                "Annotations": {},
                "ManifestType": "application/vnd.oci.image.manifest.v1+json",
                "User": "",
                "History": [],
                "NamesHistory": tags,
            }
        return Recording(stdout=json.dumps([doc], indent=4) + "\n")

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
        have = self.cuda_of(drv.running_version).split(".")
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
        hook = ("docker: Error response from daemon: failed to create task for container: failed to create "
                "shim task: OCI runtime create failed: runc create failed: unable to start container "
                "process: error during container init: error running prestart hook #0: exit status 1, "
                "stdout: , stderr: Auto-detected mode as 'legacy'\n")
        marker = sources.PROBE_MARKER
        torch_cuda = ".".join(c.image.cuda_version.split(".")[:2])
        if not c.image.present:
            return Recording(stderr=f"Unable to find image '{self.image}' locally\n{self.runtime}: Error "
                                    f"response from daemon: manifest for {self.image} not found: manifest "
                                    "unknown: manifest unknown\n", rc=125)
        if result == "ok":
            visible = self.p.gpus.count if spec.visible_gpus is None else spec.visible_gpus
            body = {"cuda_init": visible > 0, "visible_gpus": visible, "torch_cuda": torch_cuda, "error": None,
                    "matmul": self.probe_matmul(visible) if visible > 0 else None}
            return Recording(stdout=f"{marker} {json.dumps(body)}\n")
        if result == "requirement_error":
            req = c.image.nvidia_require_cuda.split()[0]
            text = spec.message or REQUIREMENT_ERROR.format(req=req)
            return Recording(stderr=hook + text + ": unknown\n", rc=125)
        if result == "nvml_mismatch":
            text = spec.message or ("nvidia-container-cli: initialization error: nvml error: "
                                    "driver/library version mismatch")
            return Recording(stderr=hook + text + ": unknown\n", rc=125)
        warn_at = "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:174: UserWarning: "
        if result == "driver_too_old":
            found = self._cuda_int(self.cuda_of(self.drv.running_version)) if self.drv else "0"
            text = spec.message or (
                f"CUDA initialization: The NVIDIA driver on your system is too old (found version {found}). "
                "Please update your GPU driver by downloading and installing a new version from the URL: "
                "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to "
                "install a PyTorch version that has been compiled with your version of the CUDA driver.")
            body = {"cuda_init": False, "visible_gpus": 0, "torch_cuda": torch_cuda, "error": None}
            return Recording(stdout=f"{marker} {json.dumps(body)}\n",
                             stderr=f"{warn_at}{text} (Triggered internally at /pytorch/c10/cuda/"
                                    "CUDAFunctions.cpp:109.)\n  return torch._C._cuda_getDeviceCount() > 0\n")
        if result == "not_initialized":
            text = spec.message or (
                "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
                "functions before calling NumCudaDevices() that might have already set an error? Error 802: "
                "system not yet initialized")
            body = {"cuda_init": False, "visible_gpus": 0, "torch_cuda": torch_cuda, "error": None}
            return Recording(stdout=f"{marker} {json.dumps(body)}\n",
                             stderr=f"{warn_at}{text} (Triggered internally at /pytorch/c10/cuda/"
                                    "CUDAFunctions.cpp:109.)\n  return torch._C._cuda_getDeviceCount() > 0\n")
        text = spec.message or ("nvidia-container-cli: initialization error: load library failed: "
                                "libnvidia-ml.so.1: cannot open shared object file: no such file or directory")
        return Recording(stderr=hook + text + ": unknown\n", rc=125)

    def probe_matmul(self, visible: int) -> list[dict[str, Any]]:
        """The probe's per-GPU matmul: float32 rounding on a healthy GPU; a profile's bad GPUs differ."""
        bad = set(self.p.container.probe.matmul_wrong_gpus)
        tol = 0.0068984375
        out: list[dict[str, Any]] = []
        for i in range(visible):
            err = 3.0517578125e-05 if i not in bad else 61.8125
            out.append({"gpu": i, "tolerance": tol, "max_abs_err": err, "ok": err <= tol})
        return out

    @staticmethod
    def _cuda_int(cuda: str) -> str:
        # PyTorch reports the driver's CUDA as major*1000 + minor*10 (12.9 -> 12090).
        if not cuda:
            return "0"
        major, _, minor = cuda.partition(".")
        return str(int(major) * 1000 + int(minor or 0) * 10)

    # -- Slurm ------------------------------------------------------------------------
    def scontrol_show_node(self, node: str) -> Recording:
        s = self.p.slurm
        assert s is not None
        cpus = s.sockets * s.cores_per_socket * s.threads_per_core
        gres_type = self.p.gpus.model.split()[-1].lower()
        gpus = self.p.gpus.count
        state = {"idle": "IDLE", "mixed": "MIXED", "allocated": "ALLOCATED", "drained": "IDLE+DRAIN",
                 "draining": "MIXED+DRAIN", "down": "DOWN+NOT_RESPONDING"}[s.state]
        share = 1.0 if s.state == "allocated" else min(1.0, 0.5 * len(s.jobs))
        if s.state in ("idle", "drained", "down"):
            share = 0.0
        cpu_alloc = int(cpus * share)
        mem_alloc = int(s.real_memory_mb * share)
        gpu_alloc = int(gpus * share)
        alloc_tres = (f"cpu={cpu_alloc},mem={mem_alloc}M,gres/gpu={gpu_alloc}" if cpu_alloc else "")
        fields = [
            f"NodeName={node}", "Arch=x86_64", f"CoresPerSocket={s.cores_per_socket}",
            f"CPUAlloc={cpu_alloc}", f"CPUEfctv={cpus}", f"CPUTot={cpus}", f"CPULoad={share * 180:.2f}",
            f"AvailableFeatures={gres_type}", f"ActiveFeatures={gres_type}",
            f"Gres=gpu:{gres_type}:{gpus}", f"NodeAddr={node}", f"NodeHostName={node}",
            f"Version={s.version}", f"OS=Linux {self.kernel} #1 SMP",
            f"RealMemory={s.real_memory_mb}", f"AllocMem={mem_alloc}",
            f"FreeMem={s.real_memory_mb - mem_alloc - 12000}", f"Sockets={s.sockets}", "Boards=1",
            f"State={state}", f"ThreadsPerCore={s.threads_per_core}", "TmpDisk=0", "Weight=1",
            "Owner=N/A", "MCS_label=N/A", f"Partitions={s.partition}",
            "BootTime=2025-09-01T08:00:00", "SlurmdStartTime=2025-09-01T08:02:11",
            f"LastBusyTime={LAB_ISO_TIME}", "ResumeAfterTime=None",
            f"CfgTRES=cpu={cpus},mem={s.real_memory_mb}M,billing={cpus},gres/gpu={gpus}",
            f"AllocTRES={alloc_tres}", "CurrentWatts=0", "AveWatts=0",
        ]
        reason = s.reason or ("Not responding" if s.state == "down" else None)
        if reason:
            fields.append(f"Reason={reason} [root@{LAB_ISO_TIME}]")
        return Recording(stdout=" ".join(fields) + "\n")

    def squeue_running(self) -> Recording:
        s = self.p.slurm
        assert s is not None
        return Recording(stdout="".join(f"{job}\n" for job in s.jobs))

    # -- assembly ----------------------------------------------------------------------
    def _render_shared(self) -> HostImage:
        img = HostImage()
        f = img.files
        F = sources.FILES
        C = sources.COMMANDS
        f[F["kernel_release"]] = f"{self.kernel}\n"
        f[F["proc_modules"]] = self.proc_modules()
        f[F["os_release"]] = self.os_release()
        f[F["etc_environment"]] = self.etc_environment()
        for name, text in (("nccl_conf", self.nccl_conf()), ("apt_auto_upgrades", self.apt_auto_upgrades()),
                           ("dnf_versionlock", self.dnf_versionlock())):
            if text is not None:
                f[F[name]] = text
        if self.module_loaded:
            f[F["proc_driver_version"]] = self.proc_driver_version()
        f.update(self.nvswitch_dirs())
        f.update(self.infiniband_files())

        if self.os.manager == "dpkg":
            img.record(C["dpkg_query"], Recording(stdout=self.dpkg_query()))
        else:
            img.record(C["rpm_query"], Recording(stdout=self.rpm_query()))
        if self.drv is not None and self.drv.dkms:
            img.record(C["dkms_status"], self.dkms_status())
        img.record(C["systemctl_show"], self.systemctl_show())
        if self.p.fabricmanager_version is not None:
            img.record(C["fabricmanager_version"], self.fabricmanager_version())
        img.record(C["lspci_vvv"], Recording(stdout=self.lspci_vvv()))
        if self.p.container.toolkit_version:
            img.record(C["nvidia_ctk_version"], self.nvidia_ctk_version())
        if self.runtime != "none":
            img.record(sources.runtime_version_argv(self.runtime), self.runtime_version())
            img.record(sources.image_inspect_argv(self.runtime, self.image), self.image_inspect())
            img.record(sources.probe_argv(self.runtime, self.image), self.probe())
            self._render_tenants(img)
        self._render_process_maps(img)
        self._render_active_tools(img)
        self._apply_raw(img, host_specific=False, hostname="")
        return img

    # -- active checks (docs/facts.md section 17) ------------------------------------------------
    _ACTIVE_FILES = {"pass": "dcgmi_diag_r2_pass_excerpt.txt",
                     "gpu_memory_fail": "dcgmi_diag_r2_gpu_memory_fail_excerpt.txt",
                     "low_busbw": "all_reduce_perf_h100_2nodes_16ranks.txt", "slow": "ib_write_bw_post_list_8B.txt"}

    def _active_output(self, kind: str) -> str:
        return (Path(__file__).parent / "active_data" / self._ACTIVE_FILES[kind]).read_text(encoding="utf-8")

    def _render_active_tools(self, img: HostImage) -> None:
        """Stand-in dcgmi / all_reduce_perf / ib_write_bw printing recorded real outputs."""
        tools = self.p.active_tools
        if tools.dcgmi != "absent":
            text = self._active_output(tools.dcgmi)
            for level in (1, 2, 3, 4):
                img.record(sources.dcgmi_diag_argv(level), Recording(stdout=text))
        if tools.all_reduce_perf != "absent":
            from k3fleet.targets import load_target
            max_bytes = load_target().active.nccl_max_bytes
            img.record(sources.all_reduce_perf_argv(self.p.gpus.count, max_bytes),
                       Recording(stdout=self._active_output(tools.all_reduce_perf)))
        if tools.ib_write_bw != "absent":
            text = self._active_output(tools.ib_write_bw)
            ib = self.p.infiniband
            ports = {d: ib.ports.get(d) for d in ib.device_names()}
            active = [d for d, spec in ports.items() if spec is None or spec.state == "ACTIVE"]
            for offset, dev in enumerate(active):
                argv = sources.ib_write_bw_argv(dev, sources.IB_WRITE_BW_PORT + offset)
                img.record(argv, Recording(stdout=text))
                img.record([*argv, "127.0.0.1"], Recording(stdout=text))

    # -- other tenants (docs/facts.md section 16) ------------------------------------------------
    def tenant_id(self, name: str) -> str:
        return _hex(f"tenant/{name}")

    def _render_tenants(self, img: HostImage) -> None:
        tenants = self.p.container.tenants
        ids = [self.tenant_id(t.name) for t in tenants]
        img.record(sources.container_ps_argv(self.runtime), Recording(stdout="".join(f"{i}\n" for i in ids)))
        if not tenants:
            return
        out = []
        for t, ident in zip(tenants, ids, strict=True):
            env = {"PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                           "/usr/bin:/sbin:/bin", "NVARCH": "x86_64", "LD_LIBRARY_PATH": t.ld_library_path,
                   "NVIDIA_VISIBLE_DEVICES": "all" if t.gpus else "void"}
            if t.nvidia_require_cuda:
                env["NVIDIA_REQUIRE_CUDA"] = t.nvidia_require_cuda
            if t.cuda_version:
                env["CUDA_VERSION"] = t.cuda_version
            if t.compat_package:
                env["NV_CUDA_COMPAT_PACKAGE"] = t.compat_package
            requests = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                         "Options": {}}] if t.gpus else None
            # The fields docker 28's inspect gives that the collector reads, in its shape.
            out.append({"Id": ident, "Name": f"/{t.name}", "Image": "sha256:" + _hex(f"tenant-image/{t.image}"),
                        "State": {"Status": "running", "Running": True, "Pid": t.pids[0] if t.pids else 4000},
                        "HostConfig": {"Runtime": "runc", "DeviceRequests": requests},
                        "Config": {"Image": t.image, "Env": [f"{k}={v}" for k, v in env.items()]}})
        img.record(sources.container_inspect_argv(self.runtime, ids),
                   Recording(stdout=json.dumps(out, indent=4) + "\n"))

    def _render_process_maps(self, img: HostImage) -> None:
        """/proc/<pid>/cgroup and maps of each GPU process: its container (a tenant's) and its libcuda."""
        owner = {pid: self.tenant_id(t.name) for t in self.p.container.tenants for pid in t.pids}
        version = (self.drv.loaded_version or self.drv.version) if self.drv is not None else None
        for proc in self.p.gpus.processes:
            cid = owner.get(proc.pid)
            scope = f"docker-{cid}.scope" if cid else "session-3.scope"
            slice_ = "system.slice" if cid else "user.slice/user-1000.slice"
            img.files[sources.PROC_PID_FILES["cgroup"] % proc.pid] = f"0::/{slice_}/{scope}\n"
            if not proc.maps_readable:
                continue
            libcuda = proc.libcuda or (f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}" if version else None)
            lines = [f"7f3a10000000-7f3a10200000 r-xp 00000000 103:02 1835 {proc.name}"]
            if proc.cudart:
                lines.append(f"7f3a20000000-7f3a20100000 r-xp 00000000 103:02 2211 "
                             f"/usr/local/cuda/lib64/libcudart.so.{proc.cudart}")
            if libcuda:
                lines.append(f"7f3a30000000-7f3a31000000 r-xp 00000000 103:02 3310 {libcuda}")
            img.files[sources.PROC_PID_FILES["maps"] % proc.pid] = "\n".join(lines) + "\n"

    def host_image(self, hostname: str) -> tuple[HostImage, HostImage]:
        """(shared, host-specific) images of one host; the shared one is the same object for all."""
        img = HostImage()
        img.files[sources.FILES["hostname"]] = f"{hostname}\n"
        if self.drv is not None:
            img.record(sources.COMMANDS["dmesg"], self.dmesg())
            if self.p.dmesg_restricted:
                img.record(sources.COMMANDS["journalctl_kernel"], self.journalctl_kernel(hostname))
            img.record(sources.COMMANDS["nvidia_smi_query"], self.nvidia_smi_query(hostname))
            # -q prints each GPU's UUID, so it is as host-specific as the query.
            img.record(sources.COMMANDS["nvidia_smi_q"], self.nvidia_smi_q(hostname))
        if self.p.slurm is not None:
            img.record(sources.scontrol_show_node_argv(hostname), self.scontrol_show_node(hostname))
            img.record(sources.squeue_running_argv(hostname), self.squeue_running())
        self._apply_raw(img, host_specific=True, hostname=hostname)
        return self._shared, img

    _HOST_SPECIFIC = ("hostname", "dmesg", "journalctl_kernel", "nvidia_smi_query", "nvidia_smi_q",
                      "scontrol_show_node", "squeue_running")

    def _raw_argv(self, name: str, hostname: str) -> list[str]:
        if name in sources.COMMANDS:
            return list(sources.COMMANDS[name])
        runtime = self.runtime
        return {
            "runtime_version": lambda: sources.runtime_version_argv(runtime),
            "image_inspect": lambda: sources.image_inspect_argv(runtime, self.image),
            "probe": lambda: sources.probe_argv(runtime, self.image),
            "scontrol_show_node": lambda: sources.scontrol_show_node_argv(hostname),
            "squeue_running": lambda: sources.squeue_running_argv(hostname),
        }[name]()

    def _apply_raw(self, img: HostImage, host_specific: bool, hostname: str) -> None:
        for name, capture in self.p.raw.items():
            if (name in self._HOST_SPECIFIC) != host_specific:
                continue
            if name in RAW_FILE_SOURCES:
                path = sources.FILES[name]
                if capture is None:
                    img.files.pop(path, None)
                else:
                    assert isinstance(capture, str)
                    img.files[path] = capture
                continue
            assert name in sources.COMMANDS or name in DYNAMIC_COMMANDS
            argv = self._raw_argv(name, hostname)
            if capture is None:
                img.forget(argv)
            elif isinstance(capture, RawCapture):
                img.record(argv, Recording(stdout=capture.stdout, stderr=capture.stderr, rc=capture.rc,
                                           sleep=capture.sleep))
            else:
                img.record(argv, Recording(stdout=capture))
