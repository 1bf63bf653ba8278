"""k3fleet_rdma_info, k3fleet_container_info and k3fleet_scheduler_info as Ansible runs them.

exit_json / fail_json are patched to raise (the ansible-core unit-test habit), so each test
asserts on the exact result a playbook would register. Fixture sources: tests/fixtures/*/SOURCES.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from nodetree import ExitJson, FailJson, documentation, exe

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY
from ansible_collections.k3fleet.gpu.plugins.modules import (
    k3fleet_container_info,
    k3fleet_rdma_info,
    k3fleet_scheduler_info,
)
from k3fleet.models.facts import ContainerFacts, NcclFacts, RdmaFacts, SchedulerFacts

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
MODULES = {"k3fleet_rdma_info": k3fleet_rdma_info, "k3fleet_container_info": k3fleet_container_info,
           "k3fleet_scheduler_info": k3fleet_scheduler_info}


pytestmark = pytest.mark.usefixtures("patched_exits")


def run_module(module: Any, args: dict[str, Any]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(ExitJson) as exc:
        module.main()
    return exc.value.args[0]


def fail_module(module: Any, args: dict[str, Any]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(FailJson) as exc:
        module.main()
    return exc.value.args[0]


def rdma_node(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    for rel, value in json.loads((FIX / "rdma" / "sysfs_roce_nccl1866.json").read_text()).items():
        target = root / "sys" / "class" / "infiniband" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value + "\n")
    (root / "proc").mkdir()
    shutil.copy(FIX / "rdma" / "proc_modules_peermem_gpud39.txt", root / "proc" / "modules")
    (root / "etc" / "default").mkdir(parents=True)
    shutil.copy(FIX / "rdma" / "nccl_conf_horovod.txt", root / "etc" / "nccl.conf")
    shutil.copy(FIX / "rdma" / "vllm_environment_file.txt", root / "etc" / "default" / "vllm")
    bin_dir = tmp_path / "bin"
    exe(bin_dir / "lspci", f"/bin/cat '{FIX / 'rdma' / 'lspci_acs_srcvalid_lkml.txt'}'")
    return root, bin_dir


# -- k3fleet_rdma_info -------------------------------------------------------------


def test_rdma_info_reports_ports_acs_and_nccl(tmp_path: Path) -> None:
    root, bin_dir = rdma_node(tmp_path)
    result = run_module(k3fleet_rdma_info, {"root": str(root), "path": str(bin_dir),
                                            "env_files": ["/etc/default/vllm", "-/etc/default/absent"]})
    assert result["changed"] is False
    facts = result[RESULT_KEY]
    rdma = RdmaFacts.model_validate(facts["rdma"])
    nccl = NcclFacts.model_validate(facts["nccl"])
    assert rdma.status == "ok" and rdma.active_ports == 2
    assert rdma.acs_enabled_bridges == ["00:01.1", "00:01.2"]
    assert rdma.nvidia_peermem_loaded is True
    assert nccl.status == "ok"
    assert nccl.settings["NCCL_SOCKET_IFNAME"].source == "/etc/default/vllm"
    assert nccl.settings["NCCL_DEBUG"].value == "INFO"
    assert [c["argv"] for c in facts["commands"]] == [["lspci", "-vvv"]]


def test_rdma_info_in_check_mode_without_lspci(tmp_path: Path) -> None:
    root, bin_dir = rdma_node(tmp_path)
    result = run_module(k3fleet_rdma_info, {"root": str(root), "path": str(bin_dir), "lspci": False,
                                            "_ansible_check_mode": True})
    assert result["changed"] is False
    assert result[RESULT_KEY]["rdma"]["acs_checked"] is False
    assert result[RESULT_KEY]["commands"] == []


def test_rdma_info_rejects_relative_env_files(tmp_path: Path) -> None:
    root, bin_dir = rdma_node(tmp_path)
    failed = fail_module(k3fleet_rdma_info, {"root": str(root), "path": str(bin_dir), "env_files": ["vllm.env"]})
    assert "env_files must be absolute" in failed["msg"] and "'vllm.env'" in failed["msg"]


# -- k3fleet_container_info ----------------------------------------------------------


def container_bin(tmp_path: Path, run_stderr: str | None = None) -> Path:
    bin_dir = tmp_path / "bin"
    cf = FIX / "container"
    run = f"/bin/cat '{cf / run_stderr}' >&2; exit 125" if run_stderr else "exit 0"
    exe(bin_dir / "docker", f"""case "$1" in
  --version) /bin/cat '{cf / "docker_version.txt"}';;
  image) /bin/cat '{cf / "docker_inspect_vllm_v0.23.0.json"}';;
  run) {run};;
  *) exit 99;;
esac""")
    exe(bin_dir / "nvidia-ctk", f"/bin/cat '{cf / 'nvidia_ctk_version_ctk50.txt'}'")
    return bin_dir


def test_container_info_reads_the_image(tmp_path: Path) -> None:
    bin_dir = container_bin(tmp_path)
    result = run_module(k3fleet_container_info, {"path": str(bin_dir), "root": str(tmp_path),
                                                 "image": "vllm/vllm-openai:v0.23.0"})
    assert result["changed"] is False
    facts = ContainerFacts.model_validate(result[RESULT_KEY]["container"])
    assert facts.status == "ok" and facts.runtime is not None and facts.runtime.name == "docker"
    assert facts.toolkit_version == "1.12.0"
    assert facts.image is not None and (facts.image.cuda_version, facts.image.vllm_version) == ("13.0.2", "0.23.0")
    assert facts.probe.ran is False
    assert ["docker", "image", "inspect", "vllm/vllm-openai:v0.23.0"] in [c["argv"] for c in
                                                                        result[RESULT_KEY]["commands"]]


def test_container_info_probe_runs_in_check_mode(tmp_path: Path) -> None:
    bin_dir = container_bin(tmp_path, run_stderr="probe_requirement_error_dashdot1226.stderr")
    result = run_module(k3fleet_container_info, {"path": str(bin_dir), "root": str(tmp_path), "probe": True,
                                                 "image": "vllm/vllm-openai:v0.23.0", "_ansible_check_mode": True})
    probe = result[RESULT_KEY]["container"]["probe"]
    assert result["changed"] is False
    assert (probe["ran"], probe["ok"], probe["failure"]) == (True, False, "requirement_error")


@pytest.mark.parametrize("args, part", [
    ({"image": "vllm/vllm-openai:kimi-k3 --privileged"}, "one image reference"),
    ({"image": ""}, "one image reference"),
    ({"image": "vllm/vllm-openai:v0.23.0", "runtime": "crio"}, "runtime"),
    ({}, "missing required arguments: image"),
])
def test_container_info_rejects_bad_options(tmp_path: Path, args: dict[str, Any], part: str) -> None:
    bin_dir = container_bin(tmp_path)
    failed = fail_module(k3fleet_container_info, {"path": str(bin_dir), "root": str(tmp_path), **args})
    assert part in failed["msg"]


# -- k3fleet_scheduler_info ------------------------------------------------------------


def scheduler_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    sf = FIX / "scheduler"
    exe(bin_dir / "scontrol", f"/bin/cat '{sf / 'scontrol_gpu02_idle_drain_slurm2205.txt'}'")
    exe(bin_dir / "squeue", f"/bin/cat '{sf / 'squeue_gpu02_none_slurm2205.txt'}'")
    return bin_dir


def test_scheduler_info_reports_the_drain(tmp_path: Path) -> None:
    bin_dir = scheduler_bin(tmp_path)
    result = run_module(k3fleet_scheduler_info, {"path": str(bin_dir), "root": str(tmp_path), "node": "gpu02"})
    assert result["changed"] is False
    facts = SchedulerFacts.model_validate(result[RESULT_KEY]["scheduler"])
    assert (facts.kind, facts.state, facts.jobs_running) == ("slurm", "drained", 0)
    assert facts.reason is not None and facts.reason.startswith("k3fleet CHG-1042")


def test_scheduler_info_without_slurm(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    result = run_module(k3fleet_scheduler_info, {"path": str(tmp_path / "bin"), "root": str(tmp_path)})
    assert result[RESULT_KEY]["scheduler"]["status"] == "absent"
    assert result[RESULT_KEY]["scheduler"]["kind"] == "none"


def test_scheduler_info_rejects_a_node_list(tmp_path: Path) -> None:
    bin_dir = scheduler_bin(tmp_path)
    failed = fail_module(k3fleet_scheduler_info, {"path": str(bin_dir), "root": str(tmp_path),
                                                  "node": "gpu01,gpu02"})
    assert "one Slurm NodeName" in failed["msg"] and "gpu01,gpu02" in failed["msg"]


# -- documentation --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODULES))
def test_documentation_matches_argument_spec(name: str) -> None:
    module = MODULES[name]
    doc = documentation(module)
    yaml.safe_load(module.EXAMPLES)
    returned = yaml.safe_load(module.RETURN)
    assert doc["attributes"]["check_mode"]["support"] == "full"

    def walk(node: dict[str, Any], path: str) -> None:
        # A dict described by "contains" gets its samples from its leaves.
        for key, value in node.items():
            for field in ("description", "returned", "type", "contains" if "contains" in value else "sample"):
                assert field in value, f"{path}{key} lacks {field}"
            if "contains" in value:
                walk(value["contains"], f"{path}{key}.")

    walk(returned, "")


def test_module_runs_through_ansible_with_its_module_utils(tmp_path: Path) -> None:
    # A real AnsiballZ run from the collection tree: proves the module_utils it imports by collection
    # path ship with the module.
    bin_dir = scheduler_bin(tmp_path)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO),
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "k3fleet.gpu.k3fleet_scheduler_info",
         "-a", json.dumps({"node": "gpu02", "path": str(bin_dir), "root": str(tmp_path)})],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Ad-hoc output is "localhost | SUCCESS => {json}".
    head, _, body = proc.stdout.partition(" => ")
    assert head.strip() == "localhost | SUCCESS", proc.stdout
    host = json.loads(body)
    assert host["changed"] is False
    assert host[RESULT_KEY]["scheduler"]["state"] == "drained"
