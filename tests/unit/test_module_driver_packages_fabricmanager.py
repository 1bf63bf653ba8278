"""k3fleet_driver_info, k3fleet_packages_info, k3fleet_fabricmanager_info as Ansible runs them.

exit_json/fail_json are patched to raise (ansible-core test/units/modules/utils.py style); the
node is a temporary tree of recorded files and commands (fixture sources in tests/fixtures/*/SOURCES.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from nodetree import ExitJson, FailJson, ansible_doc, documentation, fake_command, patch_exits, without_nvml, write_tree

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY
from ansible_collections.k3fleet.gpu.plugins.modules import (
    k3fleet_driver_info,
    k3fleet_fabricmanager_info,
    k3fleet_packages_info,
)
from k3fleet.models.facts import DriverFacts, FabricManagerFacts, PackageFacts

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
MODULES = {
    "k3fleet_driver_info": (k3fleet_driver_info, DriverFacts),
    "k3fleet_packages_info": (k3fleet_packages_info, PackageFacts),
    "k3fleet_fabricmanager_info": (k3fleet_fabricmanager_info, FabricManagerFacts),
}


@pytest.fixture(autouse=True)
def patched_module(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_exits(monkeypatch)
    # Nodes without NVML: "import pynvml" raises ImportError, k3fleet's binding finds no library.
    without_nvml(monkeypatch)


def fixture(area: str, name: str) -> str:
    return (FIXTURES / area / name).read_text(encoding="utf-8")


@pytest.fixture
def hgx_node(tmp_path: Path) -> dict[str, Any]:
    """A node with the 510 driver loaded, its packages held, six NVSwitches and Fabric Manager 450."""
    root = write_tree(tmp_path / "root", {
        "proc/driver/nvidia/version": fixture("driver", "proc_version_proprietary_510.txt"),
        "proc/modules": fixture("driver", "proc_modules_talos.txt"),
        "proc/sys/kernel/osrelease": "5.11.0-36-generic\n",
    })
    devices = root / "proc" / "driver" / "nvidia-nvswitch" / "devices"
    devices.mkdir(parents=True)
    for bdf in fixture("fabricmanager", "nvswitch_devices_ls.txt").split():
        (devices / bdf).mkdir()
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "nvidia-smi", [("*--query-gpu*", fixture("driver", "smi_query_quadro_rtx4000.csv"), "", 0),
                                         ("-q*", fixture("driver", "smi_q_535_interleaved_log.txt"), "", 0)])
    fake_command(bin_dir, "dpkg-query", [("*", fixture("packages", "dpkg_query_ubuntu_510_held.txt"), "", 0)])
    fake_command(bin_dir, "dkms", [("status", fixture("packages", "dkms_status_old_format.txt"), "", 0)])
    fake_command(bin_dir, "systemctl", [("show*", fixture("fabricmanager", "systemctl_show_fm_failed.txt"), "", 0)])
    fake_command(bin_dir, "nv-fabricmanager",
                 [("--version", fixture("fabricmanager", "nv_fabricmanager_version.txt"), "", 0)])
    return {"root": str(root), "path": str(bin_dir)}


def run_module(module: Any, args: dict[str, Any]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(ExitJson) as exc:
        module.main()
    return exc.value.args[0]


# -- results ---------------------------------------------------------------------------------


def test_driver_info_reports_nvidia_smi_gpus(hgx_node: dict[str, Any]) -> None:
    result = run_module(k3fleet_driver_info, hgx_node)
    assert result["changed"] is False
    facts = DriverFacts.model_validate(result[RESULT_KEY])
    assert facts.status == "ok"
    assert facts.source == "nvidia-smi"
    assert (facts.nvml.status, facts.nvml.bindings) == ("library_not_found", None)
    assert facts.kernel_module.version == "510.60.02"
    assert facts.gpu_count == 2
    assert facts.cuda_driver_version == "12.2"


def test_driver_info_reads_fabric_state_from_nvidia_smi_q(hgx_node: dict[str, Any]) -> None:
    # Without pynvml the per-GPU fabric state comes from the full `nvidia-smi -q` (an 8x H100 HGX capture).
    fake_command(Path(hgx_node["path"]), "nvidia-smi", [
        ("*--query-gpu*", fixture("driver", "smi_query_h100x8.csv"), "", 0),
        ("-q", fixture("driver", "smi_q_565_h100x8_fabric_completed.txt"), "", 0)])
    facts = DriverFacts.model_validate(run_module(k3fleet_driver_info, hgx_node)[RESULT_KEY])
    assert (facts.source, facts.gpu_count, facts.cuda_driver_version) == ("nvidia-smi", 8, "12.7")
    assert {(g.fabric_state, g.fabric_status) for g in facts.gpus} == {("completed", "success")}
    assert facts.gpus[7].pci_bus_id == "00000000:DB:00.0"
    # This replay has no `nvidia-smi nvlink -s`: the links are unknown and the reason says so.
    assert facts.reason == "NVLink state unknown: nvidia-smi nvlink -s: exit 127"


def test_driver_info_fabric_state_unknown_is_said(hgx_node: dict[str, Any]) -> None:
    # The 535 capture of the hgx node has no Fabric section and none of the CSV's bus ids.
    facts = DriverFacts.model_validate(run_module(k3fleet_driver_info, hgx_node)[RESULT_KEY])
    assert all(g.fabric_state is None for g in facts.gpus)
    # Memory use and processes come from the same blocks: unknown too, and said, never "idle".
    assert facts.reason == ("GPU fabric state unknown: GPU 0-1: bus id not in nvidia-smi -q; "
                            "GPU memory use and processes unknown: GPU 0-1: bus id not in nvidia-smi -q; "
                            "NVLink state unknown: nvidia-smi nvlink -s: exit 127")
    assert all(g.processes is None and g.memory_used_mib is None for g in facts.gpus)


def test_driver_info_use_nvml_false_is_skipped(hgx_node: dict[str, Any]) -> None:
    result = run_module(k3fleet_driver_info, {**hgx_node, "use_nvml": False})
    assert result[RESULT_KEY]["nvml"]["status"] == "skipped"


def test_driver_info_check_mode_reads_the_same(hgx_node: dict[str, Any]) -> None:
    normal = run_module(k3fleet_driver_info, hgx_node)
    checked = run_module(k3fleet_driver_info, {**hgx_node, "_ansible_check_mode": True})
    assert checked["changed"] is False
    assert checked[RESULT_KEY] == normal[RESULT_KEY]


def test_packages_info(hgx_node: dict[str, Any]) -> None:
    result = run_module(k3fleet_packages_info, hgx_node)
    assert result["changed"] is False
    facts = PackageFacts.model_validate(result[RESULT_KEY])
    assert (facts.status, facts.manager, facts.driver_branch) == ("ok", "dpkg", "510")
    assert facts.dkms_built_for_running_kernel is True
    assert any(p.name == "nvidia-driver-510" and p.held for p in facts.packages)


def test_fabricmanager_info_compares_with_the_loaded_driver(hgx_node: dict[str, Any]) -> None:
    result = run_module(k3fleet_fabricmanager_info, hgx_node)
    assert result["changed"] is False
    facts = FabricManagerFacts.model_validate(result[RESULT_KEY])
    assert (facts.nvswitch_present, facts.nvswitch_count, facts.required) == (True, 6, True)
    assert facts.unit.active == "failed"
    assert (facts.version, facts.driver_version, facts.version_matches_driver) == ("450.102.04", "510.60.02", False)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_missing_root_fails_with_a_clear_message(name: str, tmp_path: Path) -> None:
    module, _ = MODULES[name]
    missing = str(tmp_path / "no-such-root")
    with patch_module_args({"root": missing}), pytest.raises(FailJson) as exc:
        module.main()
    msg = exc.value.args[0]["msg"]
    assert msg.startswith(f"{name}: root {missing!r} is not a directory on ")


def test_collector_bug_becomes_unknown(hgx_node: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(reader: Any, use_nvml: bool = True) -> dict[str, Any]:
        raise KeyError("surprise")

    monkeypatch.setattr(k3fleet_driver_info, "collect_driver", broken)
    facts = run_module(k3fleet_driver_info, hgx_node)[RESULT_KEY]
    assert facts == {"status": "unknown", "reason": "driver collector failed: KeyError: 'surprise'"}


# -- documentation ---------------------------------------------------------------------------


def doc(module: Any, name: str) -> Any:
    return yaml.safe_load(getattr(module, name))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_documented_return_covers_the_model(name: str) -> None:
    module, model = MODULES[name]
    ret = doc(module, "RETURN")[RESULT_KEY]
    assert set(model.model_fields) <= set(ret["contains"]), name
    pending = list(ret["contains"].items())
    while pending:
        key, item = pending.pop()
        assert {"description", "returned", "type", "sample"} <= set(item), f"{name}: {key}"
        pending += [(f"{key}.{sub}", value) for sub, value in item.get("contains", {}).items()]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_attributes_declared(name: str) -> None:
    module, _ = MODULES[name]
    attributes = documentation(module)["attributes"]
    assert attributes["check_mode"]["support"] == "full"
    assert attributes["diff_mode"]["support"] == "none"
    assert attributes["idempotent"]["support"] == "full"


def test_ansible_doc_parses_all_three() -> None:
    docs = ansible_doc(*MODULES)
    for name in MODULES:
        assert docs[name]["doc"]["module"] == name
        assert docs[name]["examples"].strip()
