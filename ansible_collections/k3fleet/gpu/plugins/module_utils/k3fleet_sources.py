# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes.
"""Every file a collector reads and every command it runs, named in one place.

Collectors take their paths and argv from here; the simulated lab fleet takes the
same names to know which files to write and which command lines to replay, so a
lab host answers exactly the questions a real node is asked. A profile may carry
raw captured text for any source below, keyed by its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The host facts' schema version, defined here once: k3fleet_host stamps it on every node's facts and the
# controller's k3fleet.models.facts reads it from here. 1.1: GPU health (ECC, remapped rows, retired
# pages, clock events, PCIe link), the kernel log's Xid events and platform kind "unknown"; later the
# optional sections active and imex. Every new field is optional, so 1.0 facts validate with them unset
# (read as unknown, never as a pass). The major version changes on any incompatible change.
FACTS_SCHEMA_VERSION = "1.1"

# name -> absolute node path (read through NodeReader.resolve: /proc and /sys may be moved)
FILES = {
    "proc_driver_version": "/proc/driver/nvidia/version",
    # The loaded module's parameters, "Name: value" per line (RegistryDwords with the NVreg_RegistryDwords
    # string): GrdmaPciTopoCheckOverride there lets GB200 with PCIe NICs use dma-buf GPUDirect RDMA before
    # R595 (NVIDIA/aicr; docs/facts.md section 6).
    "proc_driver_params": "/proc/driver/nvidia/params",
    # Jetson (L4T) boards: the L4T release, and the SoC in the device tree (docs/facts.md section 10).
    "nv_tegra_release": "/etc/nv_tegra_release",
    "device_tree_compatible": "/proc/device-tree/compatible",
    "proc_modules": "/proc/modules",
    "kernel_release": "/proc/sys/kernel/osrelease",
    "nvswitch_devices_dir": "/proc/driver/nvidia-nvswitch/devices",
    "os_release": "/etc/os-release",
    "hostname": "/etc/hostname",
    "nccl_conf": "/etc/nccl.conf",
    "etc_environment": "/etc/environment",
    "apt_auto_upgrades": "/etc/apt/apt.conf.d/20auto-upgrades",
    "dnf_versionlock": "/etc/dnf/plugins/versionlock.list",
    "infiniband_dir": "/sys/class/infiniband",
    # IMEX on multi-node NVLink racks (GB200/GB300 NVL72; docs/facts.md section 15): its config file, whose
    # IMEX_NODE_CONFIG_FILE names the node list (default below), and the channel device nodes.
    "imex_config": "/etc/nvidia-imex/config.cfg",
    "imex_nodes_config": "/etc/nvidia-imex/nodes_config.cfg",
    "imex_channels_dir": "/dev/nvidia-caps-imex-channels",
}

# /etc/hostname holds one name: the most of it any collector reads.
HOSTNAME_LIMIT = 1024

# name -> argv (fixed command lines)
COMMANDS = {
    "nvidia_smi_query": [
        "nvidia-smi",
        "--query-gpu=index,name,uuid,driver_version,memory.total,persistence_mode,pci.bus_id,compute_cap",
        "--format=csv,noheader,nounits",
    ],
    # The header of `-q` carries "CUDA Version" ("CUDA UMD Version" from R610: the driver's maximum,
    # docs/facts.md sections 2 and 12); the per-GPU blocks of the full output carry the NVLink
    # "Fabric" state, status and health, "FB Memory Usage" and the running "Processes".
    "nvidia_smi_q": ["nvidia-smi", "-q"],
    # Used and Reserved memory, asked only of GPUs whose NVML answered the v1 memory call alone (it counts
    # the driver's reserved memory as used: docs/facts.md section 14).
    "nvidia_smi_q_memory": ["nvidia-smi", "-q", "-d", "MEMORY"],
    # Each GPU's NVLink links, up or inactive, where NVML did not answer; nothing at all on GPUs without
    # NVLink (docs/facts.md section 14).
    "nvidia_smi_nvlink_status": ["nvidia-smi", "nvlink", "-s"],
    # The PCIe distance between every GPU and NIC, and each GPU's CPU and NUMA affinity (docs/facts.md
    # section 6): a GPU whose nearest NIC is across the socket (SYS) halves its GPUDirect bandwidth.
    "nvidia_smi_topo": ["nvidia-smi", "topo", "-m"],
    # Each link's Replay, Recovery and CRC error counters, sampled at the start and the end of the visit
    # where NVML did not answer (docs/facts.md section 14).
    "nvidia_smi_nvlink_errors": ["nvidia-smi", "nvlink", "-e"],
    # The kernel log since boot, for the driver's "NVRM: Xid" lines (docs/facts.md section 14): dmesg
    # first; where kernel.dmesg_restrict refuses it, the journal's kernel messages of this boot.
    "dmesg": ["dmesg"],
    "journalctl_kernel": ["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short-iso"],
    # The journal's boots, for the Xid lines of earlier boots (a bounded few: XID_HISTORY_BOOTS): "-1 <boot id>
    # <first>—<last>" per boot (docs/facts.md section 14). A volatile journal lists only the current boot.
    "journalctl_boots": ["journalctl", "--list-boots", "--no-pager", "-q"],
    "dpkg_query": ["dpkg-query", "-W", "-f=${binary:Package}\\t${Version}\\t${db:Status-Abbrev}\\n"],
    "rpm_query": ["rpm", "-qa", "--qf", "%{NAME}\\t%{VERSION}-%{RELEASE}\\t%{ARCH}\\n"],
    "dkms_status": ["dkms", "status"],
    "systemctl_show": [
        "systemctl", "show", "--no-pager",
        "-p", "Id,LoadState,ActiveState,SubState,UnitFileState",
        "nvidia-fabricmanager.service", "nvidia-persistenced.service",
        "unattended-upgrades.service", "dnf-automatic.timer", "nvidia-imex.service",
    ],
    "fabricmanager_version": ["nv-fabricmanager", "--version"],
    "lspci_vvv": ["lspci", "-vvv"],
    "nvidia_ctk_version": ["nvidia-ctk", "--version"],
    # The IMEX domain as the local daemon's command service reports it: every node of the node list with
    # its state, the connectivity table and the domain state (docs/facts.md section 15). Run only where
    # nvidia-imex-ctl is installed.
    "imex_ctl_nodes": ["nvidia-imex-ctl", "-N"],
}

CONTAINER_RUNTIMES = ("docker", "podman", "nerdctl")

# Per-process files of the GPUs' compute processes (docs/facts.md section 16): the cgroup names the
# container a process runs in, the memory map the libcuda (and its directory: a compat/ one is the
# forward-compatibility package) it loaded. Templates over the pid NVML reports.
PROC_PID_FILES = {
    "cgroup": "/proc/%d/cgroup",
    "maps": "/proc/%d/maps",
}

# The probe prints one line "K3FLEET_PROBE {json}" when the image's Python can import torch.
PROBE_MARKER = "K3FLEET_PROBE"
# Once CUDA initialises it runs a real kernel on every visible GPU: a 256x256 float32 matmul (TF32 off)
# compared with the CPU's result of the same inputs; "matmul" lists per GPU the largest absolute
# difference, the tolerance and whether it held, or the error the kernel raised
# (docs/facts.md section 8: is_available() alone passes GPUs that then fail real kernels).
PROBE_SCRIPT = (
    "import json,sys\n"
    "out={'cuda_init':False,'visible_gpus':0,'torch_cuda':None,'error':None,'matmul':None}\n"
    "try:\n"
    " import torch\n"
    " out['torch_cuda']=torch.version.cuda\n"
    " out['cuda_init']=bool(torch.cuda.is_available())\n"
    " out['visible_gpus']=torch.cuda.device_count() if out['cuda_init'] else 0\n"
    " if out['cuda_init']:\n"
    "  torch.backends.cuda.matmul.allow_tf32=False\n"
    "  g=torch.Generator().manual_seed(20)\n"
    "  a=torch.rand(256,256,generator=g);b=torch.rand(256,256,generator=g);ref=a@b\n"
    "  tol=1e-4*float(ref.abs().max())\n"
    "  out['matmul']=[]\n"
    "  for i in range(out['visible_gpus']):\n"
    "   r={'gpu':i,'tolerance':tol}\n"
    "   try:\n"
    "    d=torch.device('cuda',i);got=(a.to(d)@b.to(d)).cpu();torch.cuda.synchronize(d)\n"
    "    r['max_abs_err']=float((got-ref).abs().max());r['ok']=r['max_abs_err']<=tol\n"
    "   except Exception as e:\n"
    "    r['ok']=False;r['error']='%s: %s'%(type(e).__name__,e)\n"
    "   out['matmul'].append(r)\n"
    "except Exception as e:\n"
    " out['error']='%s: %s'%(type(e).__name__,e)\n"
    "print('" + "K3FLEET_PROBE" + " '+json.dumps(out))\n"
)


# Earlier boots whose kernel log the audit reads for Xid lines: the same Xid across two boots escalates to
# hardware inspection (gpud's rule, docs/facts.md section 14); three bound the work on a node with a long journal.
XID_HISTORY_BOOTS = 3


def journalctl_kernel_boot_argv(offset: int) -> list[str]:
    """The kernel messages of one earlier boot (offset -1, -2, ...)."""
    return ["journalctl", "-k", "-b", str(int(offset)), "--no-pager", "-q", "-o", "short-iso"]


def runtime_version_argv(runtime: str) -> list[str]:
    return [runtime, "--version"]


def image_inspect_argv(runtime: str, image: str) -> list[str]:
    return [runtime, "image", "inspect", image]


# The probe container's name: a probe that times out is removed by it (the runtime client's
# death does not stop the container), and two probes never hold a node's GPUs at once.
PROBE_CONTAINER = "k3fleet-probe"


def probe_argv(runtime: str, image: str) -> list[str]:
    """Run the serving image with every GPU, no network, and ask CUDA to initialise."""
    # podman reaches GPUs through CDI; docker and nerdctl through --gpus.
    gpu = ["--device", "nvidia.com/gpu=all"] if runtime == "podman" else ["--gpus", "all"]
    return [runtime, "run", "--rm", "--network", "none"] + gpu + [
        "--name", PROBE_CONTAINER, "--entrypoint", "python3", image, "-c", PROBE_SCRIPT]


def container_ps_argv(runtime: str) -> list[str]:
    """The full ids of the running containers, one a line (docker, podman and nerdctl alike)."""
    return [runtime, "ps", "--quiet", "--no-trunc"]


# One inspect for every running container: a node's tenants cost one command, not one each.
MAX_INSPECTED_CONTAINERS = 200


def container_inspect_argv(runtime: str, ids: Iterable[str]) -> list[str]:
    return [runtime, "container", "inspect"] + list(ids)[:MAX_INSPECTED_CONTAINERS]


# Active checks (docs/facts.md section 17): only with audit --active.
def dcgmi_diag_argv(level: int, gpus: int | None = None) -> list[str]:
    """``dcgmi diag -r N -j``, with ``--expectedNumEntities gpu:G`` when the node's GPU count is known (a GPU
    DCGM does not see then fails the run; NVIDIA/DCGM's own dcgmi tests use the ``gpu:N`` form)."""
    argv = ["dcgmi", "diag", "-r", str(level), "-j"]
    if gpus:
        argv += ["--expectedNumEntities", "gpu:%d" % int(gpus)]
    return argv


def all_reduce_perf_argv(gpus: int, max_bytes: int | str) -> list[str]:
    """nccl-tests within the node: every GPU in one process, 8 B to ``max_bytes`` doubling."""
    return ["all_reduce_perf", "-b", "8", "-e", str(max_bytes), "-f", "2", "-g", str(gpus)]


# The launcher's placeholders: the pair's hosts as ``a:G,b:G`` and the ranks (2G, one per GPU).
PAIR_LAUNCHER_FIELDS = ("hosts", "ranks", "gpus")


def nccl_pair_argv(launcher: Sequence[object], addresses: Sequence[str], gpus: int, max_bytes: int | str) -> list[str]:
    """nccl-tests across two nodes: the target's launcher (mpirun) with its ``{hosts}``, ``{ranks}``
    and ``{gpus}`` filled in, then one all_reduce_perf rank per GPU (``-g 1``)."""
    values = {"hosts": ",".join("%s:%d" % (a, gpus) for a in addresses), "ranks": str(len(addresses) * gpus),
              "gpus": str(gpus)}
    argv = [str(part).format(**values) for part in launcher]
    return argv + ["all_reduce_perf", "-b", "8", "-e", str(max_bytes), "-f", "2", "-g", "1"]


# First TCP port of the loopback ib_write_bw pairs (perftest's default is 18515); one per rail.
IB_WRITE_BW_PORT = 18515


def ib_write_bw_argv(device: str, port: int) -> list[str]:
    """The server side of a loopback ib_write_bw on one device; the client adds 127.0.0.1."""
    return ["ib_write_bw", "-d", device, "-p", str(port), "-F", "--report_gbits", "-D", "5"]


def scontrol_show_node_argv(node: str) -> list[str]:
    return ["scontrol", "show", "node", node, "--oneliner"]


def squeue_running_argv(node: str) -> list[str]:
    return ["squeue", "--noheader", "--nodelist", node, "--states", "RUNNING", "--format", "%A"]


def squeue_active_argv(node: str) -> list[str]:
    """The drain's question (k3fleet_slurm_node): the jobs a drain waits for. COMPLETING too: a cancelled
    or ended job may still be killing processes that hold the GPUs."""
    return ["squeue", "--noheader", "--nodelist", node, "--states", "RUNNING,COMPLETING", "--format", "%A"]
