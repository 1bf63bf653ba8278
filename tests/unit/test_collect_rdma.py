"""RDMA / NCCL collectors against recorded sysfs values, /proc/modules, lspci -vvv and config files.

Sources of every fixture: tests/fixtures/rdma/SOURCES.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nodetree import fixtures, replay_steps

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_rdma import (
    collect_nccl,
    collect_rdma,
    merge_nccl_settings,
    parse_coded_value,
    parse_env_lines,
    parse_lspci_acs,
    parse_proc_modules,
    parse_rate_gbps,
)
from k3fleet.models.facts import NcclFacts, RdmaFacts

FIX, fixture = fixtures("rdma")


def fake_command(bin_dir: Path, name: str, stdout_file: str | None = None, rc: int = 0,
                 sleep: float | None = None) -> None:
    """An executable that replays a fixture; absolute paths because the reader's PATH is only bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    body = ["#!/bin/sh", *replay_steps(FIX / stdout_file if stdout_file else None, None, rc, sleep)]
    path = bin_dir / name
    path.write_text("\n".join(body) + "\n")
    path.chmod(0o755)


def build_sysfs(root: Path, sysfs_fixture: str | None) -> None:
    ib = root / "sys" / "class" / "infiniband"
    if sysfs_fixture is None:
        return
    for rel, value in json.loads(fixture(sysfs_fixture)).items():
        target = ib / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        # sysfs attribute files end with a newline.
        target.write_text(value + "\n")


def make_reader(tmp_path: Path, *, sysfs: str | None = None, modules: str | None = None,
                lspci: str | None = None, lspci_rc: int = 0, lspci_sleep: float | None = None,
                timeout: float = 5.0) -> NodeReader:
    root = tmp_path / "root"
    root.mkdir()
    build_sysfs(root, sysfs)
    if modules is not None:
        (root / "proc").mkdir(parents=True, exist_ok=True)
        (root / "proc" / "modules").write_text(fixture(modules))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if lspci is not None or lspci_sleep or lspci_rc:
        fake_command(bin_dir, "lspci", lspci, rc=lspci_rc, sleep=lspci_sleep)
    return NodeReader(root=str(root), path=str(bin_dir), timeout=timeout)


# -- pure parsers ----------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("4: ACTIVE", (4, "ACTIVE")),
    ("5: LinkUp", (5, "LinkUp")),
    ("1: DOWN\n", (1, "DOWN")),
    ("3: Disabled", (3, "Disabled")),
    ("ACTIVE", (None, None)),      # a truncated read without the code
    ("4:", (None, None)),
    ("", (None, None)),
    (None, (None, None)),
])
def test_parse_coded_value(text: str | None, expected: tuple[int | None, str | None]) -> None:
    assert parse_coded_value(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("400 Gb/sec (4X NDR)", 400.0),
    ("100 Gb/sec (4X EDR)", 100.0),
    ("200 Gb/sec (4X HDR)", 200.0),
    ("2.5 Gb/sec (1X SDR)", 2.5),
    ("Gb/sec", None),
    ("400", None),
    ("", None),
    (None, None),
])
def test_parse_rate_gbps(text: str | None, expected: float | None) -> None:
    assert parse_rate_gbps(text) == expected


@pytest.mark.parametrize("name, loaded, absent", [
    ("proc_modules_peermem_gpud39.txt", {"nvidia_peermem", "ib_core", "nvidia"}, "nv_peer_mem"),
    ("proc_modules_no_peermem_talos.txt", {"nvidia", "nvidia_uvm", "nvidia_drm"}, "nvidia_peermem"),
])
def test_parse_proc_modules(name: str, loaded: set[str], absent: str) -> None:
    names = set(parse_proc_modules(fixture(name)))
    assert loaded <= names
    assert absent not in names


@pytest.mark.parametrize("name, checked, bridges, reason_part", [
    ("lspci_acs_srcvalid_lkml.txt", True, ["00:01.1", "00:01.2"], None),
    ("lspci_acs_disabled_openvmm3461.txt", True, [], None),
    ("lspci_vm_debian12.txt", True, [], None),
    ("lspci_access_denied_rocm519.txt", False, [], "access denied"),
])
def test_parse_lspci_acs(name: str, checked: bool, bridges: list[str], reason_part: str | None) -> None:
    acs = parse_lspci_acs(fixture(name))
    assert acs["acs_checked"] is checked
    assert acs["acs_enabled_bridges"] == bridges
    if reason_part:
        assert reason_part in acs["acs_reason"]
    else:
        assert acs["acs_reason"] is None


def test_parse_lspci_acs_records_every_acs_device() -> None:
    devices = parse_lspci_acs(fixture("lspci_acs_disabled_openvmm3461.txt"))["acs_devices"]
    assert devices == [{"bdf": "00:00.0", "src_valid": False}]


def test_parse_lspci_acs_truncated_acsctl_is_not_clean() -> None:
    text = fixture("lspci_acs_srcvalid_lkml.txt")
    cut = text[: text.rindex("ACSCtl:") + len("ACSCtl:\tSrcVal")]
    acs = parse_lspci_acs(cut)
    assert acs["acs_checked"] is False
    assert "00:01.2" in acs["acs_reason"]
    assert acs["acs_enabled_bridges"] == ["00:01.1"]


@pytest.mark.parametrize("text", ["", "lspci: Unable to load libkmod resources: error -2\n"])
def test_parse_lspci_acs_without_devices_is_unchecked(text: str) -> None:
    acs = parse_lspci_acs(text)
    assert acs["acs_checked"] is False
    assert "no PCI devices" in acs["acs_reason"]


# -- collect_rdma --------------------------------------------------------------


def test_collect_rdma_roce_ports(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, sysfs="sysfs_roce_nccl1866.json", modules="proc_modules_peermem_gpud39.txt",
                         lspci="lspci_acs_srcvalid_lkml.txt")
    rdma = collect_rdma(reader)
    RdmaFacts.model_validate(rdma)
    assert rdma["status"] == "ok"
    assert [d["name"] for d in rdma["devices"]] == ["mlx5_0", "mlx5_1"]
    port = rdma["devices"][0]["ports"][0]
    assert port == {"port": 1, "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp", "phys_state_code": 5,
                    "rate": "100 Gb/sec (4X EDR)", "rate_gbps": 100.0, "link_layer": "Ethernet"}
    assert rdma["active_ports"] == 2
    assert rdma["nvidia_peermem_loaded"] is True
    assert rdma["acs_checked"] is True
    assert rdma["acs_enabled_bridges"] == ["00:01.1", "00:01.2"]


def test_collect_rdma_counts_only_active_ports(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, sysfs="sysfs_ib_ndr_one_down.json", modules="proc_modules_no_peermem_talos.txt",
                         lspci="lspci_acs_disabled_openvmm3461.txt")
    rdma = collect_rdma(reader)
    RdmaFacts.model_validate(rdma)
    assert rdma["active_ports"] == 1
    down = rdma["devices"][1]["ports"][0]
    assert (down["state"], down["state_code"], down["rate_gbps"]) == ("DOWN", 1, 200.0)
    assert rdma["devices"][0]["ports"][0]["rate_gbps"] == 400.0
    assert rdma["nvidia_peermem_loaded"] is False
    assert rdma["acs_checked"] is True and rdma["acs_enabled_bridges"] == []


def test_collect_rdma_without_infiniband_is_absent_but_keeps_acs_and_peermem(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, modules="proc_modules_no_peermem_talos.txt", lspci="lspci_vm_debian12.txt")
    rdma = collect_rdma(reader)
    facts = RdmaFacts.model_validate(rdma)
    assert facts.status == "absent"
    assert "/sys/class/infiniband" in rdma["reason"]
    assert rdma["devices"] == [] and rdma["active_ports"] == 0
    assert rdma["nvidia_peermem_loaded"] is False
    assert rdma["acs_checked"] is True


def test_collect_rdma_empty_class_dir_is_absent(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, lspci="lspci_vm_debian12.txt")
    (Path(reader.root) / "sys" / "class" / "infiniband").mkdir(parents=True)
    rdma = collect_rdma(reader)
    assert rdma["status"] == "absent"
    assert "empty" in rdma["reason"]


def test_collect_rdma_truncated_port_files_are_unknown(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, sysfs="sysfs_roce_nccl1866.json", lspci="lspci_vm_debian12.txt")
    for dev in ("mlx5_0", "mlx5_1"):
        state = Path(reader.root) / "sys/class/infiniband" / dev / "ports/1/state"
        state.write_text(state.read_text()[:1])  # "4", cut before ": ACTIVE"
    rdma = collect_rdma(reader)
    RdmaFacts.model_validate(rdma)
    assert rdma["status"] == "unknown"
    assert "no port state could be read" in rdma["reason"]
    assert rdma["active_ports"] == 0


def test_collect_rdma_missing_proc_modules_is_unknown_peermem(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, sysfs="sysfs_roce_nccl1866.json", lspci="lspci_vm_debian12.txt")
    rdma = collect_rdma(reader)
    assert rdma["nvidia_peermem_loaded"] is None
    assert "/proc/modules" in rdma["peermem_reason"]


@pytest.mark.parametrize("kwargs, reason_part", [
    ({"lspci": None}, "lspci: command not found"),
    ({"lspci": None, "lspci_sleep": 3, "timeout": 0.3}, "timed out"),
    ({"lspci": None, "lspci_rc": 1}, "exit 1"),
    ({"lspci": "lspci_access_denied_rocm519.txt"}, "run it as root"),
])
def test_collect_rdma_acs_unchecked_reasons(tmp_path: Path, kwargs: dict, reason_part: str) -> None:
    reader = make_reader(tmp_path, sysfs="sysfs_roce_nccl1866.json", **kwargs)
    rdma = collect_rdma(reader)
    RdmaFacts.model_validate(rdma)
    assert rdma["acs_checked"] is False
    assert reason_part in rdma["acs_reason"]
    assert rdma["status"] == "ok"


def test_collect_rdma_lspci_disabled(tmp_path: Path) -> None:
    reader = make_reader(tmp_path, sysfs="sysfs_roce_nccl1866.json", lspci="lspci_acs_srcvalid_lkml.txt")
    rdma = collect_rdma(reader, lspci=False)
    assert rdma["acs_checked"] is False
    assert "not requested" in rdma["acs_reason"]
    assert reader.commands == []


# -- NCCL ------------------------------------------------------------------------


def test_parse_env_lines_dotenv_forms() -> None:
    pairs, bad = parse_env_lines(fixture("vllm_environment_file.txt"))
    assert bad == 0
    assert pairs == [
        ("NCCL_MNNVL_ENABLE", "1"),
        ("NCCL_CUMEM_ENABLE", "1"),
        ("NCCL_NVLS_ENABLE", "1"),
        ("NCCL_DMABUF_ENABLE", "0"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "0"),
    ]


def test_parse_env_lines_pam_env_quotes() -> None:
    pairs, bad = parse_env_lines(fixture("etc_environment_ubuntu.txt"))
    assert bad == 0
    assert dict(pairs)["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"
    assert dict(pairs)["PATH"].startswith("/usr/local/sbin:")


def test_parse_env_lines_counts_truncated_lines() -> None:
    text = fixture("nccl_conf_azhpc.txt")
    cut = text[: text.index("NCCL_SOCKET_IFNAME") + len("NCCL_SOCK")]
    pairs, bad = parse_env_lines(cut)
    assert bad == 1
    assert [k for k, _ in pairs] == ["NCCL_IB_PCI_RELAXED_ORDERING", "CUDA_DEVICE_ORDER", "NCCL_TOPO_FILE"]


def test_merge_keeps_only_nccl_keys_and_the_shadowed_values() -> None:
    conf, _ = parse_env_lines(fixture("nccl_conf_horovod.txt"))
    unit, _ = parse_env_lines(fixture("vllm_environment_file.txt"))
    settings = merge_nccl_settings([("/etc/nccl.conf", conf), ("/etc/default/vllm", unit)])
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" not in settings
    assert settings["NCCL_SOCKET_IFNAME"] == {
        "value": "eth0", "source": "/etc/default/vllm",
        "shadowed": [{"value": "^docker0", "source": "/etc/nccl.conf"}]}
    assert settings["NCCL_DEBUG"] == {"value": "INFO", "source": "/etc/nccl.conf"}


def _nccl_root(tmp_path: Path, conf: str | None, environment: str | None, unit: str | None) -> NodeReader:
    root = tmp_path / "root"
    (root / "etc" / "default").mkdir(parents=True)
    if conf:
        (root / "etc" / "nccl.conf").write_text(fixture(conf))
    if environment:
        (root / "etc" / "environment").write_text(fixture(environment))
    if unit:
        (root / "etc" / "default" / "vllm").write_text(fixture(unit))
    return NodeReader(root=str(root), path=str(tmp_path), timeout=5)


def test_collect_nccl_precedence(tmp_path: Path) -> None:
    reader = _nccl_root(tmp_path, "nccl_conf_horovod.txt", "etc_environment_ubuntu.txt", "vllm_environment_file.txt")
    environ = {"NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "eth0", "HOME": "/root", "PATH": "/usr/bin"}
    nccl = collect_nccl(reader, env_files=["/etc/default/vllm"], environ=environ)
    facts = NcclFacts.model_validate(nccl)
    assert facts.status == "ok" and facts.nccl_conf_present is True
    s = nccl["settings"]
    assert (s["NCCL_DEBUG"]["value"], s["NCCL_DEBUG"]["source"]) == ("WARN", "env")
    assert s["NCCL_DEBUG"]["shadowed"] == [{"value": "INFO", "source": "/etc/nccl.conf"}]
    assert (s["NCCL_SOCKET_IFNAME"]["value"], s["NCCL_SOCKET_IFNAME"]["source"]) == ("eth0", "/etc/default/vllm")
    assert (s["NCCL_IB_HCA"]["value"], s["NCCL_IB_HCA"]["source"]) == ("mlx5_0:1,mlx5_1:1", "/etc/environment")
    assert (s["NCCL_DMABUF_ENABLE"]["value"], s["NCCL_DMABUF_ENABLE"]["source"]) == ("0", "/etc/default/vllm")
    assert s["GLOO_SOCKET_IFNAME"]["source"] == "env"
    assert "HOME" not in s and "PATH" not in s


def test_collect_nccl_later_env_file_wins(tmp_path: Path) -> None:
    reader = _nccl_root(tmp_path, None, None, "vllm_environment_file.txt")
    (Path(reader.root) / "etc" / "default" / "override").write_text(fixture("nccl_conf_azhpc.txt"))
    nccl = collect_nccl(reader, env_files=["/etc/default/vllm", "/etc/default/override"], environ={})
    assert nccl["settings"]["NCCL_SOCKET_IFNAME"]["source"] == "/etc/default/override"
    assert "CUDA_DEVICE_ORDER" not in nccl["settings"]
    assert nccl["nccl_conf_present"] is False


def test_collect_nccl_missing_env_file_is_unknown_but_keeps_settings(tmp_path: Path) -> None:
    reader = _nccl_root(tmp_path, "nccl_conf_azhpc.txt", None, None)
    nccl = collect_nccl(reader, env_files=["/etc/default/vllm"], environ={})
    facts = NcclFacts.model_validate(nccl)
    assert facts.status == "unknown"
    assert "/etc/default/vllm" in nccl["reason"]
    assert nccl["settings"]["NCCL_TOPO_FILE"]["value"] == "/opt/microsoft/ndv4-topo.xml"


def test_collect_nccl_optional_env_file_may_be_missing(tmp_path: Path) -> None:
    reader = _nccl_root(tmp_path, "nccl_conf_azhpc.txt", None, None)
    nccl = collect_nccl(reader, env_files=["-/etc/default/vllm"], environ={})
    assert nccl["status"] == "ok"
    assert nccl["settings"]["NCCL_IB_PCI_RELAXED_ORDERING"] == {"value": "1", "source": "/etc/nccl.conf"}


def test_collect_nccl_reports_unparsed_lines(tmp_path: Path) -> None:
    reader = _nccl_root(tmp_path, None, None, None)
    text = fixture("nccl_conf_horovod.txt")
    (Path(reader.root) / "etc" / "nccl.conf").write_text(text + text[:9])  # a cut-off "NCCL_DEBU"
    nccl = collect_nccl(reader, environ={})
    assert nccl["unparsed_lines"] == {"/etc/nccl.conf": 1}
    assert nccl["settings"]["NCCL_DEBUG"]["value"] == "INFO"
