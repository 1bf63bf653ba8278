"""Active checks (docs/facts.md section 17): stand-in dcgmi, all_reduce_perf, ib_write_bw and mpirun
that print recorded real outputs (k3fleet/lab/active_data/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.mpirun import pair_link_argv, pair_recording_argv
from k3fleet.lab.render.node import HostImage, Part, Recording
from k3fleet.targets import load_target

_ACTIVE_DATA = Path(__file__).resolve().parent.parent / "active_data"
_ACTIVE_FILES = {"pass": "dcgmi_diag_r2_pass_excerpt.json",
                 "gpu_memory_fail": "dcgmi_diag_r2_gpu_memory_fail_excerpt.json",
                 "low_busbw": "all_reduce_perf_h100_2nodes_16ranks.txt", "slow": "ib_write_bw_post_list_8B.txt",
                 # The NCCL pair test's two-node runs (the stand-in mpirun prints one of them).
                 "pair_good": "all_reduce_perf_h100_2nodes_16ranks.txt",
                 "pair_low": "all_reduce_perf_h100_2nodes_16ranks_low_excerpt.txt"}


# NCCL_DEBUG=INFO lines the stand-ins print before a run (the audit sets NCCL_DEBUG=INFO): the channels of
# an NVSwitch node over P2P, and a pair over IB.
_NCCL_INFO = {"all_reduce_perf": "nccl_info_p2p_direct_pointer_nccl892.txt",
              "pair": "nccl_info_ib_hca_nccltests228.txt"}


def _active_output(kind: str) -> str:
    return (_ACTIVE_DATA / _ACTIVE_FILES[kind]).read_text(encoding="utf-8")


def _nccl_info(kind: str) -> str:
    return (_ACTIVE_DATA / _NCCL_INFO[kind]).read_text(encoding="utf-8")


class ActiveView(Part):
    """The recordings of the active tools a profile installs."""

    def render(self, img: HostImage) -> None:
        tools = self.p.active_tools
        if tools.dcgmi != "absent":
            text = _active_output(tools.dcgmi)
            for level in (1, 2, 3, 4):
                img.record(sources.dcgmi_diag_argv(level, self.p.gpus.count), Recording(stdout=text))
        if tools.all_reduce_perf != "absent":
            max_bytes = load_target().active.nccl_max_bytes
            img.record(sources.all_reduce_perf_argv(self.p.gpus.count, max_bytes),
                       Recording(stdout=_nccl_info("all_reduce_perf") + _active_output(tools.all_reduce_perf)))
        if tools.mpirun != "absent":
            # What the stand-in mpirun answers with (k3fleet.lab.replay.mpirun_script), under fixed keys.
            for link in ("good", "low"):
                img.record(pair_recording_argv(link),
                           Recording(stdout=_nccl_info("pair") + _active_output(f"pair_{link}")))
            if tools.mpirun == "low":
                img.record(pair_link_argv("low"), Recording())
        if tools.ib_write_bw != "absent":
            text = _active_output(tools.ib_write_bw)
            ib = self.p.infiniband
            ports = {d: ib.ports.get(d) for d in ib.device_names()}
            active = [d for d, spec in ports.items() if spec is None or spec.state == "ACTIVE"]
            for offset, dev in enumerate(active):
                argv = sources.ib_write_bw_argv(dev, sources.IB_WRITE_BW_PORT + offset)
                img.record(argv, Recording(stdout=text))
                img.record([*argv, "127.0.0.1"], Recording(stdout=text))
