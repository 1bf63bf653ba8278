"""`k3fleet triage` against real captured outputs of each kind (tests/fixtures/triage/SOURCES.md and
the collectors' own fixtures, used by path), judged by the audit's parsers and rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from k3fleet.cli import app
from k3fleet.errors import UsageError
from k3fleet.triage import COVERS, FOREIGN, KINDS, sniff, triage
from k3fleet.triage import adapters as ad

FIX = Path(__file__).resolve().parents[1] / "fixtures"
T = FIX / "triage"

# file -> (kind, finding ids that must be reported (exactly), exit code)
CASES: dict[str, tuple[str, set[str], int]] = {
    "triage/nvidia_smi_h100x8_565.txt": ("nvidia_smi", {"driver.branch", "container.cuda_runtime"}, 1),
    # 7719 of 8192 MiB in use; "Off" in the Volatile Uncorr. ECC column (ECC disabled) is unknown, not zero.
    "triage/nvidia_smi_p4_550.txt": ("nvidia_smi", {"driver.branch", "container.cuda_runtime", "gpu.count",
                                                    "gpu.persistence_mode", "gpu.in_use", "gpu.ecc"}, 1),
    # R610's header: CUDA 13.3 runs the CUDA 13.0 image; the capture is cut after two of eight GPUs.
    "triage/nvidia_smi_b200_610_kmd.txt": ("nvidia_smi", {"gpu.count"}, 1),
    "driver/smi_q_565_h100x8_fabric_completed.txt": ("nvidia_smi_q", {"driver.branch", "container.cuda_runtime"}, 1),
    "driver/nvidia_smi_mismatch.txt": ("nvidia_smi_failure", {"driver.pending_reboot"}, 1),
    "driver/proc_version_proprietary_580.txt": ("proc_driver_version", set(), 0),
    "driver/proc_version_proprietary_550.txt": ("proc_driver_version", {"driver.branch", "container.cuda_runtime"}, 1),
    "triage/fm_journal_nothing_to_do.txt": ("fabricmanager_status", {"fabricmanager.active"}, 1),
    "triage/fm_journal_started.txt": ("fabricmanager_status", set(), 0),
    "triage/fm_status_active.txt": ("fabricmanager_status", set(), 0),
    "fabricmanager/systemctl_show_fm_failed.txt": ("fabricmanager_status", {"fabricmanager.active"}, 1),
    "triage/ibstat_roce_one_down.txt": ("ibstat", {"rdma.port_state", "rdma.rail_count"}, 1),
    "triage/ibstat_ethernet_100.txt": ("ibstat", {"rdma.rail_count"}, 1),
    "triage/ibv_devinfo_ib_active.txt": ("ibv_devinfo", {"rdma.rail_count"}, 1),
    "triage/ibv_devinfo_port_down.txt": ("ibv_devinfo", {"rdma.rail_count"}, 1),
    "container/docker_inspect_vllm_v0.23.0.json": ("docker_inspect", {"container.image_present",
                                                                      "container.vllm_version"}, 1),
    "container/probe_requirement_error_dashdot1226.stderr": ("container_error", {"container.probe"}, 1),
    "container/probe_driver_too_old_pytorch162531.stderr": ("container_error", {"container.probe"}, 1),
    "vllm_startup/oom_load_model.log": ("vllm_startup", {"accept.startup.load_oom"}, 1),
    "vllm_startup/nccl_unhandled_system_error.log": ("vllm_startup", {"accept.startup.nccl"}, 1),
    "vllm_startup/ready_tool_choice.log": ("vllm_startup", set(), 0),
    "metrics/vllm_design_cache_config_info.prom": ("metrics", {"accept.metrics.prefix_caching_off"}, 1),
    "metrics/vllm_v0_qwen25coder_old_names.prom": ("metrics", {"accept.metrics.old_server"}, 0),
    "metrics/not_metrics_html_404.txt": ("", set(), 2),
    # -- versions on no data-center branch (docs/facts.md section 10)
    "driver/proc_version_open_aarch64.txt": ("proc_driver_version", {"driver.platform"}, 1),
    "driver/proc_version_open_aarch64_540_jetpack6.txt": ("proc_driver_version", {"driver.platform"}, 1),
    # -- GPU memory in use, from the plain table and from -q (one GPU of the 8 the target wants)
    "driver/smi_summary_580_h200_busy.txt": ("nvidia_smi", {"gpu.count", "gpu.in_use"}, 1),
    "driver/smi_q_580_h200_busy_100gib.txt": ("nvidia_smi_q", {"gpu.count", "gpu.in_use"}, 1),
    # -- other tools' health output, under the audit's check ids (docs/facts.md section 14)
    "foreign/gpud_states_xid74.json": ("gpud_states", {"gpu.xid"}, 1),
    "foreign/gpud_events_xid.json": ("gpud_events", {"gpu.xid"}, 1),
    "foreign/dcgm_health_pcie_dbe_inforom.json": ("dcgm_health", {"gpu.pcie_replay", "gpu.ecc", "external.health"},
                                                  1),
    "foreign/dcgm_health_healthy.json": ("dcgm_health", set(), 0),
    # -- GPU health (docs/facts.md section 14)
    "gpu_health/smi_q_580_h200_ecc_remap_pending.txt": ("nvidia_smi_q", {"gpu.count", "gpu.ecc",
                                                                         "gpu.remapped_rows"}, 1),
    "gpu_health/smi_q_580_h200_power_brake_x8.txt": ("nvidia_smi_q", {"gpu.count", "gpu.throttle",
                                                                      "gpu.pcie_link"}, 1),
    # The RTX 4090 at idle: PCIe Gen 1 of 4 (power saving, a warning), ECC disabled (unknown), busy GPUs.
    "driver/smi_q_535_rtx4090x8_fabric_na.txt": ("nvidia_smi_q", {"driver.branch", "container.cuda_runtime",
                                                                  "gpu.in_use", "gpu.ecc", "gpu.pcie_link"}, 1),
    "gpu_health/xid79_line_nvsentinel155.txt": ("kernel_log", {"gpu.xid"}, 1),
    "gpu_health/dmesg_fallen_off_bus_no_xid_nvsentinel155.txt": ("kernel_log", {"gpu.xid"}, 1),
    "gpu_health/xid94_line_gpud1174.txt": ("kernel_log", {"gpu.xid"}, 1),
    "gpu_health/xid63_line_ml_engineering.txt": ("kernel_log", {"gpu.xid"}, 1),
    # Xid 13 (the application's) apart from Xid 109, a context-switch timeout the catalogue resolves with a
    # GPU reset: that one fails the node.
    "gpu_health/dmesg_ctime_xid13_109_gpud46.txt": ("kernel_log", {"gpu.xid", "gpu.xid_application"}, 1),
    # Xid 45 (cleanup after another fault): a warning finding, never silence.
    "gpu_health/journal_xid45_ogkm1150.txt": ("kernel_log", {"gpu.xid"}, 0),
    # -- Fabric Manager's refusal names both versions, with or without a journal prefix
    "triage/fm_journal_version_mismatch.txt": ("fabricmanager_status", {"fabricmanager.active",
                                                                        "fabricmanager.version_match"}, 1),
    "triage/fm_error_unprefixed_siderolabs.txt": ("fabricmanager_status", {"fabricmanager.active",
                                                                           "fabricmanager.version_match"}, 1),
    "triage/fm_error_unprefixed_two_lines.txt": ("fabricmanager_status", {"fabricmanager.active",
                                                                          "fabricmanager.version_match"}, 1),
    "triage/fm_status_doesnt_match_akash.txt": ("fabricmanager_status", {"fabricmanager.active",
                                                                         "fabricmanager.version_match"}, 1),
    # -- /metrics excerpts as pasted
    "metrics/vllm_v0_qwen25coder_help_type_only.prom": ("metrics", {"accept.metrics.old_server"}, 0),
    "metrics/vllm_v0_qwen25coder_cut_mid_line.prom": ("metrics", {"accept.metrics.old_server"}, 0),
    # -- captured chat completions, judged by the agent probe's classifier
    "tool_calls/k2_call_text_in_content.json": ("chat_completion", {"accept.agent.empty_tool_calls"}, 1),
    "tool_calls/k2_call_text_in_content_sdk_repr.txt": ("chat_completion", {"accept.agent.empty_tool_calls"}, 1),
    "tool_calls/k2_thinking_call_in_reasoning.json": ("chat_completion", {"accept.agent.empty_tool_calls"}, 1),
    "tool_calls/call_as_json_content_synthetic.json": ("chat_completion", {"accept.agent.empty_tool_calls"}, 1),
    "tool_calls/k2_malformed_arguments.json": ("chat_completion", {"accept.agent.invalid_arguments"}, 1),
    "tool_calls/openai_format_valid_call.json": ("chat_completion", set(), 0),
    # Each form of a captured response: JSON, an SSE stream, the SDK's printed object (above), a body cut mid-JSON.
    "tool_calls/vllm17161_tool_call_text_in_content.json": (
        "chat_completion", {"accept.agent.tool_call_text_in_content"}, 1),
    "tool_calls/vllm_mlx107_stream_call_text_in_content.sse": (
        "chat_completion", {"accept.agent.tool_call_text_in_content"}, 1),
    "tool_calls/opengatellm289_groq_stream_call_cut.sse": ("chat_completion", {"accept.agent.malformed_response"}, 1),
    "tool_calls/omniroute12721_k3_call_narrated.json": ("chat_completion", {"accept.agent.marker_in_content"}, 1),
    "tool_calls/k2_call_text_in_content_cut.json": ("chat_completion", {"accept.agent.malformed_response"}, 1),
}

# Classes of input the audit must never pass in silence: each gives at least one finding.
NEVER_SILENT = [rel for rel in CASES if rel.startswith(("gpu_health/", "tool_calls/k2", "tool_calls/call_"))
                or rel in ("driver/proc_version_open_aarch64.txt",
                           "driver/proc_version_open_aarch64_540_jetpack6.txt",
                           "driver/smi_summary_580_h200_busy.txt",
                           "metrics/vllm_v0_qwen25coder_help_type_only.prom",
                           "metrics/vllm_v0_qwen25coder_cut_mid_line.prom",
                           "triage/fm_error_unprefixed_siderolabs.txt")]


@pytest.mark.parametrize("rel", NEVER_SILENT)
def test_no_misjudged_class_passes_in_silence(rel: str) -> None:
    r = triage([FIX / rel])
    assert r.findings, rel


def test_jetson_540_is_named_a_tegra_driver_not_r540() -> None:
    r = triage([FIX / "driver/proc_version_open_aarch64_540_jetpack6.txt"])
    (f,) = r.findings
    assert "Tegra driver" in f.message and "R540" not in f.message


def test_cut_metrics_line_is_dropped_and_said() -> None:
    r = triage([FIX / "metrics/vllm_v0_qwen25coder_cut_mid_line.prom"])
    cut = next(f for f in r.findings if f.check_id == "accept.metrics.cut_line")
    assert "Qwen/Qwen2.5-Co" in cut.message


def test_fm_refusal_names_both_versions() -> None:
    r = triage([FIX / "triage/fm_error_unprefixed_siderolabs.txt"])
    f = next(f for f in r.findings if f.check_id == "fabricmanager.version_match")
    assert "525.85.12" in f.message and "530.41.03" in f.message


def test_xid_names_the_code_and_its_meaning() -> None:
    r = triage([FIX / "gpu_health/xid79_line_nvsentinel155.txt"])
    (f,) = r.findings
    assert "Xid 79 (GPU has fallen off the bus) on PCI:0000:44:00" in f.message


def test_stdin_is_read_with_the_same_rules(tmp_path: Path) -> None:
    text = (FIX / "gpu_health/xid79_line_nvsentinel155.txt").read_text()
    res = CliRunner().invoke(app, ["triage", "-", "--json", "--runs-dir", str(tmp_path)], input=text)
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert [f["check_id"] for f in data["findings"]] == ["gpu.xid"]
    assert data["files"][0]["name"] == "stdin"
    import io
    import sys

    from k3fleet.cli import main

    monkey = pytest.MonkeyPatch()
    monkey.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    try:
        assert main(["triage", "-", "--runs-dir", str(tmp_path)]) == 2
    finally:
        monkey.undo()


@pytest.mark.parametrize("rel", sorted(CASES))
def test_each_kind_of_real_capture(rel: str) -> None:
    kind, ids, code = CASES[rel]
    path = FIX / rel
    if code == 2:
        assert sniff(path.read_text(errors="replace")) is None
        with pytest.raises(UsageError, match="cannot tell what"):
            triage([path])
        return
    assert sniff(path.read_text(errors="replace")) == kind
    r = triage([path], host="gpu-x01")
    got = {f.check_id for f in r.findings if f.severity != "info"}
    assert got == ids, [(f.check_id, f.message) for f in r.findings]
    assert r.exit_code == code
    assert all(f.host == "gpu-x01" and f.evidence["file"].startswith("inputs/01-") for f in r.findings)
    # Only rules whose facts the capture holds speak: nothing is judged from text that was not given.
    # Another tool's verdict is taken in as that tool gave it, under the audit's ids.
    audit_ids = {f.check_id for f in r.findings if not f.check_id.startswith("accept.")}
    if kind not in FOREIGN:
        assert audit_ids <= COVERS.get(kind, frozenset())


def test_every_kind_has_a_real_capture() -> None:
    assert {kind for kind, _, code in CASES.values() if code != 2} == set(KINDS) - {"fabricmanager_version"}


def test_smi_table_through_the_collectors_bus_id_and_versions() -> None:
    drv = ad.driver_from_smi_table((T / "nvidia_smi_h100x8_565.txt").read_text())
    assert (drv["driver_version"], drv["cuda_driver_version"], drv["gpu_count"]) == ("565.57.01", "12.7", 8)
    first = drv["gpus"][0]
    assert first == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "persistence_mode": True,
                     "pci_bus_id": "00000000:18:00.0", "memory_total_mib": 81559, "memory_used_mib": 1,
                     "ecc": {"mode": None, "volatile_uncorrected": 0, "aggregate_uncorrected": None, "reason": None},
                     "processes": []}
    busy = ad.driver_from_smi_table((FIX / "driver" / "smi_summary_580_h200_busy.txt").read_text())["gpus"][0]
    # The process row's memory is cut by the table ("10301..."): unknown, the process is still listed.
    assert (busy["memory_used_mib"], busy["processes"]) == (103019, [
        {"pid": 443, "type": "C", "name": "python3", "used_memory_mib": None}])
    kmd = ad.driver_from_smi_table((T / "nvidia_smi_b200_610_kmd.txt").read_text())
    assert (kmd["driver_version"], kmd["cuda_driver_version"]) == ("610.43.02", "13.3")
    assert [g["memory_total_mib"] for g in kmd["gpus"]] == [183359, 183359]


def test_smi_q_gpu_blocks_and_fabric_state_match_the_table_of_the_same_node() -> None:
    q = ad.driver_from_smi_q((FIX / "driver" / "smi_q_565_h100x8_fabric_completed.txt").read_text())
    table = ad.driver_from_smi_table((T / "nvidia_smi_h100x8_565.txt").read_text())
    assert [g["pci_bus_id"] for g in q["gpus"]] == [g["pci_bus_id"] for g in table["gpus"]]
    assert {g["fabric_state"] for g in q["gpus"]} == {"completed"}
    assert q["gpus"][0]["memory_total_mib"] == 81559 and q["gpus"][0]["persistence_mode"] is True


def test_ibstat_and_ibv_devinfo_become_sysfs_ports() -> None:
    devs = ad.rdma_from_ibstat((T / "ibstat_roce_one_down.txt").read_text())
    ports = {d["name"]: d["ports"][0] for d in devs}
    assert (ports["mlx5_0"]["state_code"], ports["mlx5_0"]["phys_state"], ports["mlx5_0"]["rate_gbps"],
            ports["mlx5_0"]["link_layer"]) == (4, "LinkUp", 200.0, "Ethernet")
    assert (ports["mlx5_10"]["state"], ports["mlx5_10"]["phys_state_code"]) == ("DOWN", 3)
    ib = ad.rdma_from_ibv_devinfo((T / "ibv_devinfo_ib_active.txt").read_text())
    port = ib[0]["ports"][0]
    # The plain listing has no physical state: an ACTIVE logical state implies LinkUp.
    assert (ib[0]["name"], port["state_code"], port["phys_state_code"], port["link_layer"]) == (
        "mlx5_3", 4, 5, "InfiniBand")
    down = ad.rdma_from_ibv_devinfo((T / "ibv_devinfo_port_down.txt").read_text())[0]["ports"][0]
    assert (down["state_code"], down["phys_state_code"]) == (1, None)


def test_captures_of_one_node_are_judged_together() -> None:
    """The driver from one capture and the image from another: the chain check compares them."""
    r = triage([T / "nvidia_smi_h100x8_565.txt", FIX / "container" / "docker_inspect_cuda12_opticks.json",
                FIX / "driver" / "proc_version_proprietary_580.txt"], host="gpu-x01")
    # /proc says the loaded module is 580.173.02: it wins over the table's older version (as in the audit).
    assert r.to_json()["driver_version"] == "580.173.02"
    ids = {f.check_id for f in r.findings}
    assert "driver.branch" not in ids
    assert r.kinds == ["docker_inspect", "nvidia_smi", "proc_driver_version"]


def test_docker_inspect_alone_does_not_judge_the_host_driver() -> None:
    r = triage([FIX / "container" / "docker_inspect_vllm_v0.23.0.json"])
    assert "container.cuda_runtime" not in {f.check_id for f in r.findings}


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"\x00\x01ELF binary", "is binary"),
    (b"hello world\n", "cannot tell what"),
    (b"NVRM version: something odd\n", "read as /proc/driver/nvidia/version but"),
    (b"CA 'mlx5_0'\n\tCA type: MT4129\n", None),
])
def test_bad_captures_are_one_line_usage_errors(tmp_path: Path, content: bytes, message: str | None) -> None:
    p = tmp_path / "capture.txt"
    p.write_bytes(content)
    if message is None:
        # A CA block without ports is a device with no port: judged, not refused.
        r = triage([p])
        assert {f.check_id for f in r.findings} == {"rdma.rail_count"}
        return
    with pytest.raises(UsageError, match=message):
        triage([p])


def test_cli_writes_a_verified_operator_supplied_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["triage", str(T / "nvidia_smi_p4_550.txt"), str(T / "fm_status_active.txt"),
                                   "--host", "gpu-x02", "--out", str(out), "--json"])
    assert res.exit_code == 1, res.output
    data = json.loads((out / "triage.json").read_text())
    assert data["operator_supplied"] is True and data["host"] == "gpu-x02"
    assert [f["kind"] for f in data["files"]] == ["nvidia_smi", "fabricmanager_status"]
    assert (out / "inputs" / "01-nvidia_smi_p4_550.txt").read_text() == (T / "nvidia_smi_p4_550.txt").read_text()
    command = json.loads((out / "command.json").read_text())
    assert command["kind"] == "triage" and command["operator_supplied"] is True
    from k3fleet.evidence import verify_run

    assert verify_run(out).ok


def test_cli_bad_input_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from k3fleet.cli import main

    assert main(["triage", str(tmp_path / "missing.txt"), "--runs-dir", str(tmp_path / "r")]) == 2
    assert "missing.txt does not exist" in capsys.readouterr().err
    assert main(["triage", str(T / "ibstat_ethernet_100.txt"), "--kind", "bogus"]) == 2
    assert "--kind 'bogus'" in capsys.readouterr().err
    assert main(["triage", str(T / "ibstat_ethernet_100.txt"), "--kind", "nvidia_smi",
                 "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "read as plain `nvidia-smi` table but" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


# The recorded `docker inspect` of vllm/vllm-openai:v0.23.0 (tests/fixtures/container/SOURCES.md) with one
# field changed to a type Docker's API never gives it.
_WRONG_TYPES = [
    (lambda d: d.update(Config="string"), "field Config is a string (\"string\"), expected an object"),
    (lambda d: d["Config"].update(Env=5), "field Config.Env is a number (5), expected a list"),
    (lambda d: d.update(Mounts={}), "field Mounts is an object ({...}), expected a list"),
    (lambda d: d.update(Id=12345), "field Id is a number (12345), expected a string"),
    (lambda d: d.update(RepoTags=[7]), "field RepoTags holds a number (7), expected strings only"),
    (lambda d: d["Config"].update(Env=["A=1", 2]), "field Config.Env holds a number (2), expected strings only"),
    (lambda d: d["Config"].update(Labels={"maintainer": 3}), "field Config.Labels.maintainer is a number"),
]


@pytest.mark.parametrize(("change", "expected"), _WRONG_TYPES, ids=[w[1].split(" is ")[0].split(" holds ")[0]
                                                                     for w in _WRONG_TYPES])
def test_docker_inspect_with_a_field_of_the_wrong_type_is_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object, expected: str) -> None:
    """A pasted inspect with a field of the wrong type passed triage with exit 0 (the field read as absent):
    it is bad input, one line naming the field, exit 2, no run directory."""
    from k3fleet.cli import main

    data = json.loads((FIX / "container" / "docker_inspect_vllm_v0.23.0.json").read_text())
    change(data[0])  # type: ignore[operator]
    paste = tmp_path / "inspect.json"
    paste.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["triage", str(paste), "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "read as `docker inspect` / `podman inspect` (image or container) but " + expected in err, err
    assert not (tmp_path / "r").exists()


def test_captured_response_findings_name_their_layer_and_fix() -> None:
    res = triage([FIX / "tool_calls" / "vllm_mlx107_stream_call_text_in_content.sse"])
    (f,) = [f for f in res.findings if f.check_id == "accept.agent.tool_call_text_in_content"]
    assert f.layer == "parser" and "fix: start the server with --enable-auto-tool-choice" in f.message
    assert res.chat is not None and res.chat["form"] == "sse" and res.chat["tool_calls"] == 0
    cut = triage([FIX / "tool_calls" / "k2_call_text_in_content_cut.json"])
    assert cut.chat == {"form": "json", "cut": True, "defects": ["malformed_response"]}
    assert cut.findings[0].layer == "gateway" and "cut mid-JSON" in cut.findings[0].message
    stream = triage([FIX / "tool_calls" / "opengatellm289_groq_stream_call_cut.sse"])
    assert stream.chat is not None and stream.chat["tool_calls"] == 1
    assert "without data: [DONE]" in stream.chat["stream_problems"][0]
