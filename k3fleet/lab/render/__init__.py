"""Render a lab profile into the files and command outputs a real node would show.

Every output is written in the format the real tool prints (see the notes at each renderer
and tests/fixtures/lab/ for the captures they follow). File paths and argv come from
k3fleet_sources, so the lab answers exactly the questions a collector asks. A profile's
``raw`` captures replace the rendered text of the same source name.

One renderer a side of the node, each reading the same :class:`Node`:

    driver.py     /proc files, the kernel log, nvidia-smi's query, DKMS, Fabric Manager
    smi.py        nvidia-smi -q
    packages.py   dpkg-query / rpm, versionlock and unattended-upgrades settings
    system.py     os-release, environment files, systemd units
    pci.py        InfiniBand sysfs, NVSwitch devices, lspci -vvv
    imex.py       IMEX's config, node list, channel devices and nvidia-imex-ctl -N (NVL72 trays)
    container.py  toolkit and runtime versions, image inspect, tenants, GPU process maps
    probe.py      the serving image's GPU probe
    scheduler.py  scontrol / squeue
    active.py     dcgmi, all_reduce_perf, ib_write_bw

:class:`ProfileRenderer` assembles them into :class:`HostImage` s.
"""

from __future__ import annotations

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.profile import DYNAMIC_COMMANDS, RAW_FILE_SOURCES, Profile, RawCapture
from k3fleet.lab.render.active import ActiveView
from k3fleet.lab.render.container import ContainerView
from k3fleet.lab.render.driver import DriverView
from k3fleet.lab.render.imex import ImexView
from k3fleet.lab.render.node import LAB_ISO_TIME, LAB_TIMESTAMP, HostImage, Node, Recording, gpu_uuid
from k3fleet.lab.render.packages import PackageView
from k3fleet.lab.render.pci import PciView
from k3fleet.lab.render.probe import ProbeView
from k3fleet.lab.render.scheduler import SchedulerView
from k3fleet.lab.render.smi import SmiLog
from k3fleet.lab.render.system import SystemView

__all__ = ["LAB_ISO_TIME", "LAB_TIMESTAMP", "HostImage", "ProfileRenderer", "Recording", "gpu_uuid"]

# Sources whose output names the host (or its GPUs' UUIDs): rendered per host, never shared.
_HOST_SPECIFIC = ("hostname", "dmesg", "journalctl_kernel", "journalctl_boots", "nvidia_smi_query", "nvidia_smi_q",
                  "nvidia_smi_nvlink_status", "nvidia_smi_nvlink_errors", "nvidia_smi_q_memory",
                  "nvidia_smi_topo",
                  "scontrol_show_node", "squeue_running")


class ProfileRenderer:
    """Renders one profile; host-independent output is computed once and shared by every host."""

    def __init__(self, profile: Profile, image: str) -> None:
        self.node = Node(profile, image)
        self.driver = DriverView(self.node)
        self.smi = SmiLog(self.node, self.driver)
        self.packages = PackageView(self.node)
        self.system = SystemView(self.node)
        self.pci = PciView(self.node)
        self.container = ContainerView(self.node)
        self.probe = ProbeView(self.node)
        self.scheduler = SchedulerView(self.node)
        self.active = ActiveView(self.node)
        self.imex = ImexView(self.node)
        self._shared = self._render_shared()

    def host_image(self, hostname: str) -> tuple[HostImage, HostImage]:
        """(shared, host-specific) images of one host; the shared one is the same object for all."""
        p = self.node.p
        img = HostImage()
        img.files[sources.FILES["hostname"]] = f"{hostname}\n"
        if self.node.drv is not None:
            img.record(sources.COMMANDS["dmesg"], self.driver.dmesg())
            if p.dmesg_restricted:
                img.record(sources.COMMANDS["journalctl_kernel"], self.driver.journalctl_kernel(hostname))
            img.record(sources.COMMANDS["journalctl_boots"], self.driver.journalctl_list_boots(hostname))
            for offset in range(1 - self.driver.journal_boots(), 0)[-sources.XID_HISTORY_BOOTS:]:
                img.record(sources.journalctl_kernel_boot_argv(offset),
                           self.driver.journalctl_kernel_boot(hostname, offset))
            img.record(sources.COMMANDS["nvidia_smi_query"], self.driver.nvidia_smi_query(hostname))
            # -q prints each GPU's UUID, so it is as host-specific as the query.
            img.record(sources.COMMANDS["nvidia_smi_q"], self.smi.nvidia_smi_q(hostname))
            img.record(sources.COMMANDS["nvidia_smi_nvlink_status"], self.smi.nvidia_smi_nvlink_status(hostname))
            img.record(sources.COMMANDS["nvidia_smi_q_memory"], self.smi.nvidia_smi_q_memory(hostname))
            img.record(sources.COMMANDS["nvidia_smi_nvlink_errors"], self.smi.nvidia_smi_nvlink_errors(hostname))
            img.record(sources.COMMANDS["nvidia_smi_topo"], self.smi.nvidia_smi_topo())
        if p.slurm is not None:
            img.record(sources.scontrol_show_node_argv(hostname), self.scheduler.scontrol_show_node(hostname))
            img.record(sources.squeue_running_argv(hostname), self.scheduler.squeue_running())
            # The drain's own question (k3fleet_slurm_node), so `upgrade --check` plans a lab host's drain.
            img.record(sources.squeue_active_argv(hostname), self.scheduler.squeue_running())
        self._apply_raw(img, host_specific=True, hostname=hostname)
        return self._shared, img

    def _render_shared(self) -> HostImage:
        node = self.node
        img = HostImage()
        self._shared_files(img.files)
        C = sources.COMMANDS
        if node.os.manager == "dpkg":
            img.record(C["dpkg_query"], Recording(stdout=self.packages.dpkg_query()))
        else:
            img.record(C["rpm_query"], Recording(stdout=self.packages.rpm_query()))
        if node.drv is not None and node.drv.dkms:
            img.record(C["dkms_status"], self.driver.dkms_status())
        img.record(C["systemctl_show"], self.system.systemctl_show())
        if node.p.fabricmanager_version is not None:
            img.record(C["fabricmanager_version"], self.driver.fabricmanager_version())
        img.record(C["lspci_vvv"], Recording(stdout=self.pci.lspci_vvv()))
        if node.p.container.toolkit_version:
            img.record(C["nvidia_ctk_version"], self.container.nvidia_ctk_version())
        if node.runtime != "none":
            img.record(sources.runtime_version_argv(node.runtime), self.container.runtime_version())
            img.record(sources.image_inspect_argv(node.runtime, node.image), self.container.image_inspect())
            img.record(sources.probe_argv(node.runtime, node.image), self.probe.probe())
            self.container.render_tenants(img)
        self.container.render_process_maps(img)
        self.active.render(img)
        self.imex.render(img)
        self._apply_raw(img, host_specific=False, hostname="")
        return img

    def _shared_files(self, f: dict[str, str | None]) -> None:
        F = sources.FILES
        f[F["kernel_release"]] = f"{self.node.kernel}\n"
        f[F["proc_modules"]] = self.driver.proc_modules()
        f[F["os_release"]] = self.system.os_release()
        f[F["etc_environment"]] = self.system.etc_environment()
        for name, text in (("nccl_conf", self.system.nccl_conf()),
                           ("apt_auto_upgrades", self.packages.apt_auto_upgrades()),
                           ("dnf_versionlock", self.packages.dnf_versionlock())):
            if text is not None:
                f[F[name]] = text
        if self.node.module_loaded:
            f[F["proc_driver_version"]] = self.driver.proc_driver_version()
            f[F["proc_driver_params"]] = self.driver.proc_driver_params()
        f.update(self.pci.nvswitch_dirs())
        f.update(self.pci.infiniband_files())

    def _raw_argv(self, name: str, hostname: str) -> list[str]:
        if name in sources.COMMANDS:
            return list(sources.COMMANDS[name])
        runtime, image = self.node.runtime, self.node.image
        return {
            "runtime_version": lambda: sources.runtime_version_argv(runtime),
            "image_inspect": lambda: sources.image_inspect_argv(runtime, image),
            "probe": lambda: sources.probe_argv(runtime, image),
            "scontrol_show_node": lambda: sources.scontrol_show_node_argv(hostname),
            "squeue_running": lambda: sources.squeue_running_argv(hostname),
        }[name]()

    def _apply_raw(self, img: HostImage, host_specific: bool, hostname: str) -> None:
        for name, capture in self.node.p.raw.items():
            if (name in _HOST_SPECIFIC) != host_specific:
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
