"""The driver as the node shows it: /proc files, the kernel log, nvidia-smi's query, DKMS, Fabric Manager.

Each output is in the format the real tool prints (tests/fixtures/lab/, tests/fixtures/driver/SOURCES.md).
"""

from __future__ import annotations

from k3fleet.lab.render.node import Part, Recording, gpu_uuid, hex_of, lines_text

# nvidia-smi exit statuses: 9 driver not loaded (nvidia-smi man page); 18 is what it returns
# for NVML_ERROR_LIB_RM_VERSION_MISMATCH (the NVML return code is passed through).
SMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                 "Make sure that the latest NVIDIA driver is installed and running.\n\n")


class DriverView(Part):
    """The kernel module, its files and logs, and the tools that talk to it."""

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
        if self.node.module_loaded:
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
                if self.node.module_loaded and self.p.nvidia_peermem
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
        return lines_text(lines)

    def smi_failure(self) -> Recording | None:
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
        failure = self.smi_failure()
        if failure:
            return failure
        g = self.p.gpus
        assert self.drv is not None
        pm = "Enabled" if g.persistence_mode else "Disabled"
        lines = [f"{i}, {g.model}, {gpu_uuid(hostname, i)}, {self.drv.running_version}, {g.memory_mib}, "
                 f"{pm}, {bus}, {g.compute_cap}" for i, bus in enumerate(self.node.bus_ids())]
        return Recording(stdout=lines_text(lines))

    def fabric_state(self) -> str:
        """The NVLink fabric State nvidia-smi -q prints for this host's GPUs."""
        drv = self.drv
        major = self.p.gpus.compute_cap.split(".", 1)[0]
        if drv is not None and self.p.nvlink_domain is not None and major.isdigit() and int(major) >= 9:
            # An NVL72 tray's GPUs register with the rack's NVLink fabric, whose Fabric Manager runs on the
            # switch trays: Completed without a local NVSwitch (tests/fixtures/driver/SOURCES.md: GB300).
            return "Completed"
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

    def dmesg(self) -> Recording:
        """The kernel log: the module's load line (docs/facts.md section 5) and the profile's Xid lines in
        the driver's format (tests/fixtures/gpu_health/SOURCES.md). Refused as util-linux dmesg refuses
        it under kernel.dmesg_restrict=1."""
        if self.p.dmesg_restricted:
            return Recording(stderr="dmesg: read kernel buffer failed: Operation not permitted\n", rc=1)
        return Recording(stdout=lines_text(self._kernel_lines()))

    def journalctl_kernel(self, hostname: str) -> Recording:
        """journalctl -k -b -o short-iso: the same kernel lines with the journal's prefix."""
        stamp = "2026-11-30T21:04:11+0000"
        return Recording(stdout="".join(f"{stamp} {hostname} kernel: {line.split('] ', 1)[-1]}\n"
                                        for line in self._kernel_lines()))

    def proc_driver_params(self) -> str:
        """/proc/driver/nvidia/params: "Name: value" lines (the form of NVIDIA/aicr's validator test), with
        GrdmaPciTopoCheckOverride when the profile sets it."""
        out = "ModifyDeviceFiles: 1\nEnablePCIeGen3: 0\n"
        if self.p.grdma_topo_override:
            out += "GrdmaPciTopoCheckOverride: 1\n"
        return out

    def journal_boots(self) -> int:
        """Boots the journal lists: the profile's, raised to the oldest boot an Xid line is in."""
        return max(self.p.journal_boots, 1 - min((x.boot for x in self.p.xid), default=0))

    def journalctl_list_boots(self, hostname: str) -> Recording:
        """journalctl --list-boots in systemd 246's layout (systemd/systemd issue 17326): oldest first, one
        day apart, the current boot last."""
        out = ""
        count = self.journal_boots()
        for offset in range(1 - count, 1):
            day = 30 + offset
            span = f"Mon 2026-11-{day:02d} 21:04:02 UTC—Mon 2026-11-{day:02d} 23:59:40 UTC"
            out += f"{offset:>2} {hex_of(f'boot/{hostname}/{offset}', 32)} {span}\n"
        return Recording(stdout=out)

    def journalctl_kernel_boot(self, hostname: str, offset: int) -> Recording:
        """journalctl -k -b OFFSET -o short-iso: that boot's kernel lines (its own Xid lines)."""
        stamp = f"2026-11-{30 + offset:02d}T21:04:11+0000"
        return Recording(stdout="".join(f"{stamp} {hostname} kernel: {line.split('] ', 1)[-1]}\n"
                                        for line in self._kernel_lines(offset)))

    def _kernel_lines(self, boot: int = 0) -> list[str]:
        lines = []
        if self.drv is not None and self.node.module_loaded:
            first = self.proc_driver_version().splitlines()[0].removeprefix("NVRM version: ")
            lines.append(f"[    5.812337] NVRM: loading {first}")
        if boot == 0:
            # IPoIB interfaces losing their carrier (the line Azure's link-flap check greps for).
            for i, dev in enumerate(self.p.infiniband.device_names()):
                port = self.p.infiniband.ports.get(dev)
                for at in (port.carrier_lost_at if port else []):
                    lines.append(f"[{at:12.6f}] ib{i}: lost carrier")
        bus_ids = self.node.bus_ids()
        for x in sorted((x for x in self.p.xid if x.boot == boot), key=lambda x: x.uptime_s):
            _domain, bus, dev_fn = bus_ids[x.gpu].split(":")
            who = f"pid={x.pid}, name={x.name or 'python3'}, " if x.pid is not None else ""
            lines.append(f"[{x.uptime_s:12.6f}] NVRM: Xid (PCI:0000:{bus.lower()}:{dev_fn.split('.')[0]}): {x.code}, "
                         f"{who}{x.text}")
        return lines

    def dkms_status(self) -> Recording:
        assert self.drv is not None
        v = self.drv.version
        if self.os.dkms_slash_format:
            line = f"nvidia/{v}, {self.kernel}, x86_64: installed"
        else:
            line = f"nvidia, {v}, {self.kernel}, x86_64: installed"
        return Recording(stdout=line + "\n")

    def fabricmanager_version(self) -> Recording:
        return Recording(stdout=f"Fabric Manager version is : {self.p.fabricmanager_version}\n")

