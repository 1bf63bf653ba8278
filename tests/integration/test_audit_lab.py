"""`k3fleet audit` over the simulated lab fleet through real ansible-playbook (ansible-runner).

The default fleet tells the change-night story (inventories/lab/README.md); these tests hold
the verdict, each host's findings, the plan and the run directory to it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3fleet.evidence import RunDir
from k3fleet.models.facts import HostFacts
from k3fleet.paths import data_dir

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")
REPO = Path(__file__).resolve().parents[2]
TARGETS = REPO / "k3fleet" / "targets"
FIXTURES = REPO / "tests" / "fixtures"


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}


def run_k3fleet(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([K3FLEET, *args], capture_output=True, text=True, env=_env(), cwd=cwd, timeout=timeout,
                          check=False)


def _ids(verdict: dict[str, Any], host: str) -> set[str]:
    return {f["check_id"] for f in verdict["hosts"][host]["findings"]}


def _blocking(verdict: dict[str, Any], host: str) -> list[str]:
    return [f["check_id"] for f in verdict["hosts"][host]["findings"] if f["severity"] in ("error", "critical")]


@pytest.fixture(scope="module")
def lab_audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("audit") / "run"
    proc = run_k3fleet("audit", "--lab", "--json", "--out", str(out))
    return proc, out


@pytest.fixture(scope="module")
def verdict(lab_audit: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    proc, _ = lab_audit
    assert proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_exit_code_and_outcome(lab_audit: tuple[subprocess.CompletedProcess[str], Path],
                               verdict: dict[str, Any]) -> None:
    proc, _ = lab_audit
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert verdict["outcome"] == "rebuild_environment"
    assert "Traceback" not in proc.stderr
    assert verdict["summary"]["hosts"] == 10
    assert verdict["summary"]["unreachable"] == 1


def test_unreachable_host_is_unreachable_not_failed(verdict: dict[str, Any]) -> None:
    host = verdict["hosts"]["gpu-a09"]
    assert host["status"] == "unreachable"
    assert host["findings"] == []
    # Ansible's own words for a host it cannot reach; the ssh detail after them ("Connection refused", or
    # "Broken pipe" when the refused connection races the multiplexer on a busy machine) varies.
    assert "reached over ssh" in (host["reason"] or "").lower(), host["reason"]
    assert "gpu-a09" in verdict["plan"]["unreachable"]


@pytest.mark.parametrize("host", ["gpu-a01", "gpu-a02", "gpu-a05", "gpu-a06", "gpu-a07"])
def test_r575_hosts_fail_the_version_chain(verdict: dict[str, Any], host: str) -> None:
    ids = _ids(verdict, host)
    assert "driver.branch" in ids
    assert "container.probe" in ids  # the cu130 image's requirement error, seen for real in the probe output
    assert verdict["hosts"][host]["driver_version"] == "575.57.08"


def test_r580_host_is_clean(verdict: dict[str, Any]) -> None:
    assert verdict["hosts"]["gpu-a03"]["status"] in ("pass", "warn")
    assert _blocking(verdict, "gpu-a03") == []
    assert "gpu-a03" in verdict["plan"]["done"]


@pytest.mark.parametrize(
    ("host", "check_id"),
    [
        ("gpu-a04", "fabricmanager.version_match"),
        ("gpu-a04", "fabricmanager.active"),
        ("gpu-a05", "rdma.port_state"),
        ("gpu-a06", "rdma.peermem"),
        ("gpu-a07", "nccl.debug"),
        ("gpu-a08", "driver.pending_reboot"),
        ("gpu-a05", "gpu.ecc"),
        ("gpu-a05", "gpu.remapped_rows"),
        ("gpu-a06", "gpu.xid"),
    ],
)
def test_each_fault_is_found_on_its_host(verdict: dict[str, Any], host: str, check_id: str) -> None:
    assert check_id in _ids(verdict, host), verdict["hosts"][host]["findings"]


def test_fault_free_hosts_do_not_carry_other_hosts_faults(verdict: dict[str, Any]) -> None:
    for host in ("gpu-a01", "gpu-a02", "gpu-a03"):
        ids = _ids(verdict, host)
        assert not ids & {"rdma.port_state", "rdma.peermem", "nccl.debug", "fabricmanager.version_match",
                          "driver.pending_reboot", "gpu.ecc", "gpu.remapped_rows", "gpu.xid", "gpu.throttle",
                          "gpu.pcie_link"}, (host, ids)


def test_plan_canary_is_a_healthy_r575_host(verdict: dict[str, Any]) -> None:
    plan = verdict["plan"]
    assert plan["target_version"] == "580.95.05"
    canary = plan["canary"]["host"]
    assert canary in {"gpu-a01", "gpu-a02", "gpu-a07"}, plan["canary"]
    assert _blocking(verdict, canary) == [f for f in _blocking(verdict, canary)
                                          if f in ("driver.branch", "driver.version_min", "container.cuda_runtime",
                                                   "container.probe")]
    waved = [h for wave in plan["waves"] for h in wave]
    assert canary not in waved
    assert len(waved) == len(set(waved))
    assert "gpu-a09" not in waved and "gpu-a03" not in waved
    # The node a model server outside Slurm holds is changed in a wave, never first, and never "idle".
    assert canary != "gpu-a10" and "gpu-a10" in waved
    busy = next(u for u in plan["needs_upgrade"] if u["host"] == "gpu-a10")
    assert busy["idle"] is False
    assert "gpu.in_use" in _ids(verdict, "gpu-a10")


def test_run_directory_holds_the_evidence(lab_audit: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = lab_audit
    rd = RunDir.open(out)
    assert rd.verify_manifest() == []
    for host in [*(f"gpu-a0{i}" for i in range(1, 9)), "gpu-a10"]:
        facts = HostFacts.model_validate(json.loads((out / "facts" / f"{host}.json").read_text()))
        assert facts.host == host
        assert facts.driver.status in ("ok", "unknown")
    assert not (out / "facts" / "gpu-a09.json").exists()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert {e["event"] for e in events} >= {"runner_on_ok", "runner_on_unreachable", "playbook_on_stats"}
    run = json.loads((out / "run.json").read_text())
    assert run["exit_code"] == 1 and run["hosts_with_facts"] == 9
    report = (out / "report.md").read_text()
    assert report.startswith("# k3fleet audit: rebuild the environment")
    assert "gpu-a09" in report and "Change plan" in report
    command = json.loads((out / "command.json").read_text())
    assert command["argv"][1:3] == ["audit", "--lab"]


def test_human_output_and_limit(tmp_path: Path) -> None:
    proc = run_k3fleet("audit", "--lab", "--limit", "gpu-a03", "--all", "--out", str(tmp_path / "run"))
    # The one healthy H200 node passes, but 8 H200s cannot hold the weights: the fleet is too small.
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "gpu-a03" in proc.stdout and "gpu-a01" not in proc.stdout  # --all: passing hosts too
    assert proc.stdout.startswith("verdict: expand_capacity")
    assert "next: add GPU nodes" in proc.stdout
    assert "[1/1] answered 1" in proc.stderr  # progress goes to stderr
    assert "audit.yml: 1 of 1 hosts answered" in proc.stderr and "failed" not in proc.stderr
    verdict = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert list(verdict["hosts"]) == ["gpu-a03"]


def test_health_evidence_joins_the_hosts_verdict(tmp_path: Path) -> None:
    # gpud's states of gpu-a03 (an Xid 74 it saw) enter the audit as the audit's own gpu.xid on that host:
    # the host that passed fails, the tool's words and the file kept in the run.
    states = FIXTURES / "foreign" / "gpud_states_xid74.json"
    proc = run_k3fleet("audit", "--lab", "--limit", "gpu-a03", "--json", "--out", str(tmp_path / "run"),
                       "--health-evidence", f"gpu-a03={states}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    host = json.loads(proc.stdout)["hosts"]["gpu-a03"]
    (f,) = [f for f in host["findings"] if f["check_id"] == "gpu.xid"]
    assert host["status"] == "fail" and f["evidence"]["source"] == "gpud"
    assert "XID 74 (NVLINK Error)" in f["message"]
    stored = tmp_path / "run" / f["evidence"]["file"]
    assert json.loads(stored.read_text()) == json.loads(states.read_text())


@pytest.mark.parametrize(("value", "words"), [
    ("gpu-a03", "give HOST=FILE"),
    ("gpu-zz={fix}/foreign/gpud_states_xid74.json", "gpu-zz is not a host this audit visits"),
    ("gpu-a03={fix}/container/docker_inspect_vllm_v0.23.0.json", "not gpud's /v1/states or /v1/events JSON"),
    ("gpu-a03={fix}/nope.json", "does not exist"),
])
def test_health_evidence_bad_input_writes_nothing(tmp_path: Path, value: str, words: str) -> None:
    proc = run_k3fleet("audit", "--lab", "--limit", "gpu-a03", "--out", str(tmp_path / "run"),
                       "--health-evidence", value.format(fix=FIXTURES))
    assert proc.returncode == 2
    assert words in _one_error_line(proc)
    assert not (tmp_path / "run").exists()


# -- bad input: one clear line, the documented exit code, no traceback ----------------------------


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("k3fleet: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_malformed_inventory(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n  children: [oops\n")
    proc = run_k3fleet("audit", "-i", str(inv), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "cannot be parsed" in _one_error_line(proc)


def test_missing_inventory_and_no_inventory(tmp_path: Path) -> None:
    proc = run_k3fleet("audit", "-i", str(tmp_path / "nope.yml"))
    assert proc.returncode == 2
    assert "does not exist" in _one_error_line(proc)
    proc = run_k3fleet("audit")
    assert proc.returncode == 2
    assert "--lab" in _one_error_line(proc)


def test_target_with_wrong_type(tmp_path: Path) -> None:
    target = yaml.safe_load((TARGETS / "kimi-k3.yaml").read_text())
    target["gpus"]["per_node"] = "eight"
    bad = tmp_path / "bad-target.yaml"
    bad.write_text(yaml.safe_dump(target))
    shutil.copy(TARGETS / "cuda_driver_matrix.yaml", tmp_path)
    proc = run_k3fleet("audit", "--lab", "--target", str(bad), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "gpus.per_node" in line and "eight" in line


def test_bad_option_value_is_usage_error() -> None:
    proc = run_k3fleet("audit", "--lab", "--forks", "many")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_out_dir_not_empty_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious").write_text("keep")
    proc = run_k3fleet("audit", "--lab", "--out", str(out))
    assert proc.returncode == 2
    assert "not empty" in _one_error_line(proc)
    assert (out / "precious").read_text() == "keep"


# -- hosts that answer badly: the others are still audited ------------------------------------------


@pytest.fixture(scope="module")
def bad_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged profiles plus hosts with garbage, truncated, hung and host-timeout outputs."""
    root = tmp_path_factory.mktemp("badfleet")
    shutil.copytree(data_dir("inventories/lab/profiles"), root / "profiles")
    (root / "profiles" / "garbage.yaml").write_text(yaml.safe_dump({
        "extends": "h200-r575",
        "raw": {
            "nvidia_smi_query": {"stdout": "\x00\x01garbage,,,\nnot,a,csv\n", "rc": 0},
            "dpkg_query": {"stdout": "nvidia-driver-575-server\t575.5", "rc": 0},  # truncated mid-line
            "proc_driver_version": "NVRM version: something unexpected\n",
        },
    }))
    (root / "profiles" / "hung-smi.yaml").write_text(yaml.safe_dump({
        "extends": "h200-r580",
        "raw": {"nvidia_smi_query": {"stdout": "", "sleep": 30}},
    }))
    (root / "profiles" / "host-timeout.yaml").write_text(yaml.safe_dump({
        "extends": "h200-r580",
        "raw": {"dpkg_query": {"stdout": "", "sleep": 120}},
    }))
    (root / "fleet.yaml").write_text(yaml.safe_dump({
        "description": "bad answers",
        "hosts": {"good-01": "h200-r580", "garbage-01": "garbage", "hung-01": "hung-smi",
                  "slow-01": "host-timeout"},
    }))
    return root / "fleet.yaml"


def _audit_bad(fleet: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run([K3FLEET, "audit", "--lab", "-i", str(fleet), "--json", "--out", str(out), *extra],
                          capture_output=True, text=True, env=_env(), timeout=300, check=False)
    assert "Traceback" not in proc.stderr
    return proc, json.loads(proc.stdout)


def test_garbage_and_hung_commands_become_unknown_facts(bad_fleet: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc, verdict = _audit_bad(bad_fleet, out, "--limit", "good-01,garbage-01,hung-01", "--command-timeout", "2")
    assert proc.returncode == 1
    hosts = verdict["hosts"]
    assert hosts["good-01"]["status"] in ("pass", "warn")
    garbage = hosts["garbage-01"]
    assert garbage["status"] == "fail"
    assert any(f["kind"] == "unknown" for f in garbage["findings"])
    facts = json.loads((out / "facts" / "garbage-01.json").read_text())
    assert facts["driver"]["kernel_module"]["version"] is None
    hung = json.loads((out / "facts" / "hung-01.json").read_text())
    timed_out = [c for c in hung["commands"] if c["error"] == "timeout"]
    assert timed_out and timed_out[0]["argv"][0] == "nvidia-smi"
    assert hosts["hung-01"]["status"] != "unreachable"


def test_host_over_its_time_budget_returns_partial_facts(bad_fleet: Path, tmp_path: Path) -> None:
    # dpkg-query on slow-01 sleeps 120 s, longer than the host's budget (80% of --host-timeout): the
    # module stops it, skips what is left, and returns what it has before Ansible's task timeout.
    out = tmp_path / "run"
    proc, verdict = _audit_bad(bad_fleet, out, "--limit", "good-01,slow-01",
                               "--command-timeout", "300", "--host-timeout", "12")
    assert proc.returncode == 1
    assert verdict["hosts"]["good-01"]["status"] in ("pass", "warn")
    slow = verdict["hosts"]["slow-01"]
    assert slow["status"] == "fail"
    assert "packages.held" in {f["check_id"] for f in slow["findings"] if f["kind"] == "unknown"}
    facts = json.loads((out / "facts" / "slow-01.json").read_text())
    errors = {c["argv"][0]: c["error"] for c in facts["commands"] if c["error"]}
    assert errors.get("dpkg-query") == "timeout"
    assert "budget" in errors.values()
    # Within the host's budget (80% of 12 s), far below the 120 s the hung command wanted. The margin
    # to Ansible's task timeout absorbs interpreter start-up on a loaded two-core controller.
    assert facts["duration_s"] < 12


def test_change_commands_refuse_simulated_hosts(tmp_path: Path) -> None:
    # A lab host runs over the local connection: a change on it would run apt on this machine.
    inv = run_k3fleet("lab", "generate", str(tmp_path / "lab"))
    assert inv.returncode == 0, inv.stderr
    inventory = inv.stdout.strip()
    # upgrade names the lab fleet and points at the rehearsal (--check); rollback names the hosts.
    for args, words in ((["upgrade", "-i", inventory, "--change-id", "CHG-1", "--operator", "alice"],
                         "is the simulated lab fleet: a change there would run apt on this machine"),
                        (["rollback", "-i", inventory, "--limit", "gpu-a01"], "simulated lab hosts")):
        proc = run_k3fleet(*args, "--runs-dir", str(tmp_path / "runs"))
        assert proc.returncode == 2, (args, proc.stderr)
        assert words in _one_error_line(proc)


# -- what an expert reads: fabric health, a Jetson, R610's header, a self-contradicting target -----------


@pytest.fixture(scope="module")
def truth_audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    root = tmp_path_factory.mktemp("truthfleet")
    shutil.copytree(data_dir("inventories/lab/profiles"), root / "profiles")
    (root / "fleet.yaml").write_text(yaml.safe_dump({"hosts": {
        "gpu-b01": "b200-r580-fabric-unhealthy", "gpu-b02": "b200-r580", "gpu-j01": "jetson-orin-l4t35",
        "gpu-k01": "h200-r610-kmd", "gpu-u01": "h200-r575-busy", "gpu-r01": "h200-r575"}}))
    proc = run_k3fleet("audit", "--lab", "-i", str(root / "fleet.yaml"), "--json", "--out", str(root / "run"))
    assert proc.stdout, proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


def test_truth_fleet_fabric_health_fails_the_gpu_naming_the_field(
        truth_audit: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, verdict = truth_audit
    (f,) = [f for f in verdict["hosts"]["gpu-b01"]["findings"] if f["check_id"] == "gpu.fabric_health"]
    assert f["message"] == "NVLink fabric health fails on GPU 3: Summary Unhealthy, Route Unhealthy True"
    assert verdict["hosts"]["gpu-b01"]["status"] == "fail"
    assert "gpu.fabric_health" not in _ids(verdict, "gpu-b02")


def test_truth_fleet_jetson_is_an_unsupported_platform(
        truth_audit: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, verdict = truth_audit
    findings = verdict["hosts"]["gpu-j01"]["findings"]
    (f,) = [f for f in findings if f["check_id"] == "driver.platform"]
    assert "unsupported platform, unknown branch" in f["message"] and "L4T 35.3.1" in f["message"]
    assert not any("R35" in x["message"] for x in findings)
    assert "gpu-j01" not in {u["host"] for u in verdict["plan"]["needs_upgrade"]}
    assert "gpu-j01" in {b["host"] for b in verdict["plan"]["blocked"]}


def test_truth_fleet_reads_the_kmd_header(
        truth_audit: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, verdict = truth_audit
    assert verdict["hosts"]["gpu-k01"]["driver_version"] == "610.43.02"
    assert "gpu-k01" in verdict["plan"]["done"]
    assert "driver.branch" not in _ids(verdict, "gpu-k01")


def test_truth_fleet_busy_host_is_not_the_canary(
        truth_audit: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    _, verdict = truth_audit
    assert "gpu.in_use" in _ids(verdict, "gpu-u01")
    assert verdict["plan"]["canary"]["host"] == "gpu-r01"


def test_self_contradicting_target_is_refused_before_the_audit(tmp_path: Path) -> None:
    target = yaml.safe_load((TARGETS / "kimi-k3.yaml").read_text())
    target["gpus"]["strategy"] = "multi_node_dep"
    target["serve"]["flags"] = ["--tensor-parallel-size", "8", *target["serve"]["flags"]]
    bad = tmp_path / "dep-target.yaml"
    bad.write_text(yaml.safe_dump(target))
    proc = run_k3fleet("audit", "--lab", "--target", str(bad), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert ": serve.flags: --tensor-parallel-size 8 does not match strategy multi_node_dep" in line
    assert not (tmp_path / "run").exists()


def test_reports_carry_the_heat_map_every_fix_and_the_plan(
        lab_audit: tuple[subprocess.CompletedProcess[str], Path], verdict: dict[str, Any], tmp_path: Path) -> None:
    from html import escape

    from k3fleet.report.escapes import safe_markdown

    _, run = lab_audit
    pages = {}
    for fmt in ("html", "md"):
        dest = tmp_path / f"audit.{fmt}"
        proc = run_k3fleet("report", str(run), "--format", fmt, "--out", str(dest))
        assert proc.returncode == 0, proc.stderr
        pages[fmt] = dest.read_text()
    html, md = pages["html"], pages["md"]
    fixes = {f["fix"] for h in verdict["hosts"].values() for f in h["findings"] if f["fix"]}
    fixes |= {f["fix"] for f in verdict["fleet_findings"] if f["fix"]}
    assert fixes
    for fix in fixes:
        assert escape(fix) in html, fix
        assert safe_markdown(fix, cell=True) in md, fix
    # The heat map: one row per host, one column per check group, the unreachable host's cells skipped.
    assert 'id="heatmap"' in html
    for host in verdict["hosts"]:
        assert f'<tr data-host="{host}" data-status-h=' in html
    assert 'data-host="gpu-a09" data-status-h="unreachable"' in html and 'data-g-driver="skipped"' in html
    # Fleet warnings are warnings, not passes; the plan and its package transactions are in both.
    assert 'data-check="fleet.driver_drift"' in html and "*warn* (warning) | `fleet.driver_drift`" in md
    canary = verdict["plan"]["canary"]["host"]
    assert f"Canary: {canary} (" in md and escape(f"Canary: {canary} (") in html
    assert "| hosts | package transaction |" in md and 'id="transactions"' in html
    assert "nvidia-driver-580" in md
    # The unreachable host is one row, not one per check; the GPU view shows the ECC fault.
    assert md.count("gpu-a09") < 5
    assert 'id="gpu-grid"' in html and "uncorrectable ECC" in html


def test_terminal_summary_of_a_thousand_hosts_fits_one_screen(
        lab_audit: tuple[subprocess.CompletedProcess[str], Path], verdict: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab's ten stories, each on 100 hosts (real facts, renamed), judged and printed at COLUMNS=100."""
    import math
    from types import SimpleNamespace

    from rich.cells import cell_len

    from k3fleet.cli.base import SafeConsole
    from k3fleet.report import terminal
    from k3fleet.targets import load_target
    from k3fleet.verdict.fleet import evaluate_fleet

    _, run = lab_audit
    facts: dict[str, HostFacts] = {}
    unreachable: dict[str, str] = {}
    for i in range(1000):
        base = f"gpu-a{i % 10 + 1:02d}"
        name = f"gpu-{i + 1:04d}"
        if verdict["hosts"][base]["status"] == "unreachable":
            unreachable[name] = verdict["hosts"][base]["reason"]
            continue
        data = json.loads((run / "facts" / f"{base}.json").read_text())
        facts[name] = HostFacts.model_validate({**data, "host": name})
    big = evaluate_fleet(facts, load_target(None), unreachable=unreachable)
    for columns in (80, 100):
        monkeypatch.setenv("COLUMNS", str(columns))
        console = SafeConsole(record=True, soft_wrap=True, force_terminal=False)
        assert console.width == columns
        terminal.print_audit(console, SimpleNamespace(verdict=big, exit_code=big.exit_code,
                                                      run_dir=SimpleNamespace(path=Path("runs/R"))))
        text = console.export_text()
        # Lines as the terminal shows them (a longer line wraps); no reason or id cut with an ellipsis.
        shown = sum(max(1, math.ceil(cell_len(line) / columns)) for line in text.splitlines())
        assert shown <= 40 and "\u2026" not in text, (columns, shown, text)
        # The unreachable hosts' row is never behind "more row(s)", nor a blocked host unnamed.
        table = text.split("Hosts that need attention", 1)[1]
        assert "unreachable" in table.split("\n")[3], table
        blocked = {b.host for b in big.plan.blocked}
        more = next((line for line in table.splitlines() if "more row(s)" in line), "")
        listed = set(re.findall(r"gpu-\d{4}", table))
        assert not more or all(h in listed for h in ("gpu-0005", "gpu-0006", "gpu-0008") if h in blocked), table
    assert text.startswith(f"verdict: {big.outcome} (exit 1)")
    assert "1000 hosts: 100 ok, 0 warn, 800 failing, 100 unreachable" in text
    assert "  700 driver.branch" in text and "fabricmanager.version_match" in text  # never cut
    assert "next: k3fleet plan --run runs/R" in text and "--all lists every host" in text
    assert "Hosts that need attention" in text and "gpu-0003" not in text  # passing hosts are counted, not listed
    # The grid reads row by row: most hosts first, ties by check id, so every run prints the same.
    grid = text.split("failing checks (hosts):\n", 1)[1].split("warnings (hosts):", 1)[0]
    cells = [(-int(n), cid) for n, cid in re.findall(r"(\d+) ([a-z_]+\.[a-z_.]+)", grid)]
    assert len(cells) > 5 and cells == sorted(cells), grid


def test_plan_all_lists_every_host_and_the_cut_plan_says_how(lab_audit: tuple[subprocess.CompletedProcess[str],
                                                                              Path]) -> None:
    """`plan` cuts host lists at 12 names and says `--all` lists them (it pointed back at itself);
    `plan --all` prints every blocked host with its reasons."""
    _, run = lab_audit
    cut = run_k3fleet("plan", "--run", str(run))
    whole = run_k3fleet("plan", "--run", str(run), "--all")
    assert cut.returncode == whole.returncode == 0, cut.stderr + whole.stderr
    verdict = json.loads((run / "verdict.json").read_text())
    for b in verdict["plan"]["blocked"]:
        line = next(ln for ln in whole.stdout.splitlines() if ln.strip().startswith(f"Blocked {b['host']}:"))
        assert "; ".join(b["reasons"])[:40] in " ".join(whole.stdout.split()), line
    assert "k3fleet plan --run RUN)" not in cut.stdout
    bad = run_k3fleet("plan", "--run", str(run), "--all", "--bogus")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("argv", [["checks"], ["accept", "prefix-lint", "CAPTURES"],
                                  ["triage", "SMI", "FM", "--host", "gpu-x01", "--out", "OUT"]])
def test_ids_are_never_cut_at_80_columns(argv: list[str], tmp_path: Path) -> None:
    """At COLUMNS=80 no check id is cut with an ellipsis: a cut id cannot be looked up."""
    captures = tmp_path / "captures.jsonl"
    system = "You are the fleet assistant. Current time: {}. Follow the runbook."
    captures.write_text("".join(json.dumps({"model": "m", "messages": [
        {"role": "system", "content": system.format(t)}, {"role": "user", "content": "hi"}]}) + "\n"
        for t in ("2026-12-04T15:30:00Z", "2026-12-04T15:31:07Z")))
    fix = REPO / "tests" / "fixtures" / "triage"
    subst = {"CAPTURES": str(captures), "SMI": str(fix / "nvidia_smi_p4_550.txt"),
             "FM": str(fix / "fm_journal_nothing_to_do.txt"), "OUT": str(tmp_path / "t")}
    env = {**_env(), "COLUMNS": "80"}
    proc = subprocess.run([K3FLEET, *(subst.get(a, a) for a in argv)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "\u2026" not in proc.stdout, proc.stdout
    ids = set(re.findall(r"\b(?:[a-z_]+\.){1,3}[a-z_0-9]+\b", proc.stdout))
    if argv[0] == "accept":
        assert "accept.prefix_lint.timestamp_in_system" in ids, proc.stdout
    if argv[0] == "triage":
        assert {"driver.branch", "gpu.persistence_mode"} <= ids, proc.stdout
