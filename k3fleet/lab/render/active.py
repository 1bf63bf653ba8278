"""Active checks (docs/facts.md section 17): stand-in dcgmi, all_reduce_perf and ib_write_bw that
print recorded real outputs (k3fleet/lab/active_data/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.render.node import HostImage, Part, Recording
from k3fleet.targets import load_target

_ACTIVE_DATA = Path(__file__).resolve().parent.parent / "active_data"
_ACTIVE_FILES = {"pass": "dcgmi_diag_r2_pass_excerpt.txt",
                 "gpu_memory_fail": "dcgmi_diag_r2_gpu_memory_fail_excerpt.txt",
                 "low_busbw": "all_reduce_perf_h100_2nodes_16ranks.txt", "slow": "ib_write_bw_post_list_8B.txt"}


def _active_output(kind: str) -> str:
    return (_ACTIVE_DATA / _ACTIVE_FILES[kind]).read_text(encoding="utf-8")


class ActiveView(Part):
    """The recordings of the active tools a profile installs."""

    def render(self, img: HostImage) -> None:
        tools = self.p.active_tools
        if tools.dcgmi != "absent":
            text = _active_output(tools.dcgmi)
            for level in (1, 2, 3, 4):
                img.record(sources.dcgmi_diag_argv(level), Recording(stdout=text))
        if tools.all_reduce_perf != "absent":
            max_bytes = load_target().active.nccl_max_bytes
            img.record(sources.all_reduce_perf_argv(self.p.gpus.count, max_bytes),
                       Recording(stdout=_active_output(tools.all_reduce_perf)))
        if tools.ib_write_bw != "absent":
            text = _active_output(tools.ib_write_bw)
            ib = self.p.infiniband
            ports = {d: ib.ports.get(d) for d in ib.device_names()}
            active = [d for d, spec in ports.items() if spec is None or spec.state == "ACTIVE"]
            for offset, dev in enumerate(active):
                argv = sources.ib_write_bw_argv(dev, sources.IB_WRITE_BW_PORT + offset)
                img.record(argv, Recording(stdout=text))
                img.record([*argv, "127.0.0.1"], Recording(stdout=text))
