"""``nvidia-smi -q``: the header, then one block per GPU in nvidia-smi's key order and nesting."""

from __future__ import annotations

from collections.abc import Callable

from k3fleet.lab.profile import KMD_HEADER_BRANCH, FabricHealthSpec
from k3fleet.lab.render.driver import DriverView
from k3fleet.lab.render.node import LAB_TIMESTAMP, Node, Part, Recording, gpu_uuid


class SmiLog(Part):
    """The full ``nvidia-smi -q`` of one host (its GPU UUIDs make it host-specific)."""

    def __init__(self, node: Node, driver: DriverView) -> None:
        super().__init__(node)
        self.driver = driver

    def nvidia_smi_q(self, hostname: str) -> Recording:
        """Full `nvidia-smi -q`: the header, then one block per GPU in nvidia-smi's key order.

        The blocks carry the sections a collector reads (identity, PCI, memory, compute mode,
        Fabric with its Health, Processes) in the order and nesting of a real 8x H100 HGX capture
        (tests/fixtures/lab/nvidia_smi_q_gpu_h100_565.txt); sections with sensor readings are
        left out rather than invented. R610-and-newer drivers print the KMD header.
        """
        failure = self.driver.smi_failure()
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
        state = self.driver.fabric_state()
        completed = state == "Completed"
        dom = self.p.nvlink_domain
        for index, bus_id in enumerate(self.node.bus_ids()):
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
            out += row("Reserved", f"{g.memory_reserved_mib} MiB", 8)
            out += row("Used", f"{used} MiB", 8)
            out += row("Free", f"{g.memory_mib - g.memory_reserved_mib - used} MiB", 8)
            out += row("Compute Mode", g.compute_mode, 4) + self._memory_error_rows(index, row)
            # A single-node NVSwitch fabric has clique 0 and a zero cluster UUID (the H100 capture); an NVL72
            # tray its rack's domain (the GB300 capture: CliqueId 32766, a non-zero ClusterUUID).
            out += "    Fabric\n" + row("State", state, 8) + row("Status", "Success" if completed else "N/A", 8)
            out += row("CliqueId", (str(dom.clique_id) if dom else "0") if completed else "N/A", 8)
            out += row("ClusterUUID", (dom.cluster_uuid if dom else "00000000-0000-0000-0000-000000000000")
                       if completed else "N/A", 8)
            out += "        Health\n" + self._health_rows(g.fabric_health, index, completed, row)
            out += self._process_rows(index, row) + "\n"
        return Recording(stdout=out)


    def nvidia_smi_q_memory(self, hostname: str) -> Recording:
        """`nvidia-smi -q -d MEMORY`: the header, then per GPU its FB Memory Usage (Total, Reserved, Used,
        Free), as the real R580 H200 prints it (tests/fixtures/gpu_health/h200_r580/health-q-mem.txt; BAR1
        and the confidential-compute section left out)."""
        failure = self.driver.smi_failure()
        if failure:
            return failure
        assert self.drv is not None
        g = self.p.gpus

        def row(label: str, value: str, indent: int = 0) -> str:
            return f"{' ' * indent}{label:<{42 - indent}}: {value}\n"

        out = "\n==============NVSMI LOG==============\n\n" + self._smi_header(self.drv.running_version)
        out += "\n" + row("Attached GPUs", str(g.count))
        for index, bus_id in enumerate(self.node.bus_ids()):
            used = g.used_mib(index)
            out += f"GPU {bus_id}\n    FB Memory Usage\n" + row("Total", f"{g.memory_mib} MiB", 8)
            out += row("Reserved", f"{g.memory_reserved_mib} MiB", 8) + row("Used", f"{used} MiB", 8)
            out += row("Free", f"{g.memory_mib - g.memory_reserved_mib - used} MiB", 8) + "\n"
        return Recording(stdout=out)

    def nvidia_smi_topo(self) -> Recording:
        """`nvidia-smi topo -m` of an HGX board in the layout of NVIDIA/nccl issue 1617's capture: NV<links>
        between GPUs on NVLink (else NODE/SYS), GPU i's own NIC i at PIX, the other NICs of its socket (GPUs
        and NICs split in halves) at NODE and the rest at SYS; the CPU and NUMA affinity of each half; the
        NIC legend naming the HCAs. A profile's ``own_nic_distance`` moves a GPU's own NIC further away."""
        failure = self.driver.smi_failure()
        if failure:
            return failure
        g = self.p.gpus
        nics = self.p.infiniband.device_names()
        links = self.nvlink_links()
        cols = [f"GPU{i}" for i in range(g.count)] + [f"NIC{j}" for j in range(len(nics))]
        half = max(1, (g.count + 1) // 2)

        def side(i: int) -> int:
            return 0 if i < half else 1

        def nic_side(j: int) -> int:
            return 0 if j < max(1, (len(nics) + 1) // 2) else 1

        def gpu_nic(i: int, j: int) -> str:
            if i == j:
                return g.health_of(i).own_nic_distance or "PIX"
            return "NODE" if side(i) == nic_side(j) else "SYS"

        out = "\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        for i in range(g.count):
            cells = [" X " if k == i else (f"NV{links}" if links else ("NODE" if side(i) == side(k) else "SYS"))
                     for k in range(g.count)]
            cells += [gpu_nic(i, j) for j in range(len(nics))]
            cpus = "0-55,112-167" if side(i) == 0 else "56-111,168-223"
            out += f"GPU{i}\t" + "\t".join(cells) + f"\t{cpus}\t{side(i)}\t\tN/A\n"
        for j in range(len(nics)):
            cells = [gpu_nic(i, j) for i in range(g.count)]
            cells += [" X " if k == j else ("NODE" if nic_side(k) == nic_side(j) else "SYS") for k in range(len(nics))]
            out += f"NIC{j}\t" + "\t".join(cells) + "\n"
        out += ("\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect "
                "between NUMA nodes (e.g., QPI/UPI)\n  NODE = Connection traversing PCIe as well as the interconnect "
                "between PCIe Host Bridges within a NUMA node\n  PHB  = Connection traversing PCIe as well as a PCIe "
                "Host Bridge (typically the CPU)\n  PXB  = Connection traversing multiple PCIe bridges (without "
                "traversing the PCIe Host Bridge)\n  PIX  = Connection traversing at most a single PCIe bridge\n"
                "  NV#  = Connection traversing a bonded set of # NVLinks\n")
        if nics:
            out += "\nNIC Legend:\n\n" + "".join(f"  NIC{j}: {name}\n" for j, name in enumerate(nics))
        return Recording(stdout=out)

    def nvlink_links(self) -> int:
        """Links per GPU: the profile's, else 18 on an NVSwitch board or an NVLink rack (H100/H200 NVLink 4,
        GB200 NVLink 5: tests/fixtures/gpu_health/SOURCES.md), else none (a PCIe card, the H200 in a VM)."""
        g = self.p.gpus
        if g.nvlinks is not None:
            return g.nvlinks
        return 18 if self.p.nvswitches or self.p.nvlink_domain is not None else 0

    def _nvlink_or_answer(self) -> Recording | int:
        """The links per GPU, or the whole answer of an `nvidia-smi nvlink` call when there is nothing to list:
        the driver's failure, or no output at all when the GPUs have no NVLink."""
        failure = self.driver.smi_failure()
        if failure:
            return failure
        return self.nvlink_links() or Recording(stdout="")

    def nvidia_smi_nvlink_status(self, hostname: str) -> Recording:
        """`nvidia-smi nvlink -s`: per GPU its links' speed or ``<inactive>``; nothing at all when the GPUs
        have no NVLink (the real H200 in a VM printed nothing, exit 0)."""
        failure_or_links = self._nvlink_or_answer()
        if isinstance(failure_or_links, Recording):
            return failure_or_links
        links = failure_or_links
        # NVLink 5 (Blackwell) links read 53.125 GB/s, NVLink 4 (Hopper) 26.562 GB/s.
        speed = "53.125 GB/s" if self.p.nvlink_domain is not None else "26.562 GB/s"
        out = ""
        for index in range(self.p.gpus.count):
            down = self.p.gpus.health_of(index).nvlink_inactive
            out += f"GPU {index}: {self.p.gpus.model} (UUID: {gpu_uuid(hostname, index)})\n"
            out += "".join(f"         Link {k}: {'<inactive>' if k in down else speed}\n" for k in range(links))
        return Recording(stdout=out)

    def nvidia_smi_nvlink_errors(self, hostname: str) -> Recording:
        """`nvidia-smi nvlink -e`: per GPU each link's Replay, Recovery and CRC Errors (the H100 layout of
        stas00/ml-engineering debug.md), all 0; nothing at all when the GPUs have no NVLink."""
        failure_or_links = self._nvlink_or_answer()
        if isinstance(failure_or_links, Recording):
            return failure_or_links
        links = failure_or_links
        out = ""
        for index in range(self.p.gpus.count):
            out += f"GPU {index}: {self.p.gpus.model} (UUID: {gpu_uuid(hostname, index)})\n"
            out += "\n".join("".join(f"         Link {k}: {name} Errors: 0\n" for name in ("Replay", "Recovery", "CRC"))
                              for k in range(links))
        return Recording(stdout=out)

    def _smi_header(self, version: str) -> str:
        def row(label: str, value: str) -> str:
            return f"{label:<42}: {value}\n"

        cuda = self.node.cuda_of(version)
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

