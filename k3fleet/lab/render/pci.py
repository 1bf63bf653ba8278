"""The PCI and RDMA side of the node: the InfiniBand sysfs tree, the NVSwitch devices and ``lspci -vvv``."""

from __future__ import annotations

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.render.node import Part

NVSWITCH_BDFS = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0",
                 "0000:09:00.0", "0000:0a:00.0", "0000:0b:00.0", "0000:0c:00.0")

IB_STATE_CODES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
IB_PHYS_CODES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}


# The sysfs port counters the node module samples (docs/facts.md section 14).
IB_COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery",
               "excessive_buffer_overrun_errors")


class PciView(Part):
    """What sysfs and lspci show of the HCAs, the NVSwitches and the PCIe switches above the GPUs."""

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
            counts = port.counters if port else {}
            for name in IB_COUNTERS:
                out[f"{d}/counters/{name}"] = f"{counts.get(name, 0)}\n"
        return out

    def nvswitch_dirs(self) -> dict[str, str | None]:
        if not self.node.module_loaded or not self.p.nvswitches:
            return {}
        base = sources.FILES["nvswitch_devices_dir"]
        return {f"{base}/{bdf}": None for bdf in NVSWITCH_BDFS[: self.p.nvswitches]}

    def lspci_vvv(self) -> str:
        # lspci -vvv as root: one block per function, capability lines indented with tabs;
        # ACS control (ACSCtl) on the switch downstream ports above each GPU.
        acs_on = self.p.acs.enabled
        ctl = ("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-" if acs_on
               else "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-")
        blocks = []
        for bus_id in self.node.bus_ids():
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
            if self.node.module_loaded:
                gpu += "\tKernel driver in use: nvidia\n"
            if self.drv is not None:
                gpu += "\tKernel modules: nvidia\n"
            blocks.append(gpu)
        return "\n".join(blocks) + "\n"

