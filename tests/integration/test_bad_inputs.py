"""Every bad input of issue 7 that is ours, as a table: exit code, one line, no traceback, no
temporary file left (docs/safety.md "Exit codes").

Runs the real CLI (``k3fleet``) against the simulated lab fleet. Evidence that looks tampered
fails verification (exit 3) before anything reads it; evidence that verifies but holds garbage
is bad input (exit 2).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from k3fleet.audit.runner import HostOutcome
from k3fleet.evidence import RunDir
from tests.diskfull import disk_full_on

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")
PROFILES = Path(__file__).resolve().parents[2] / "inventories" / "lab" / "profiles"


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "250"}


def k3fleet(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([K3FLEET, *args], capture_output=True, text=True, env=_env(), timeout=timeout, check=False)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single error line on stderr (and nothing that looks like a traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("k3fleet: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def no_temp_files(*roots: Path) -> None:
    for root in roots:
        left = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
        assert left == [], left


def fleet(tmp_path: Path, hosts: dict[str, Any], name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"profiles_dir": str(PROFILES), "hosts": hosts}, allow_unicode=True))
    return path


@pytest.fixture(scope="module")
def subreaper() -> Iterator[None]:
    """Processes orphaned by a killed controller come to us, not to a PID 1 that never reaps."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    yield
    libc.prctl(36, 0, 0, 0, 0)


@pytest.fixture(scope="module")
def good_audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("good") / "run"
    proc = k3fleet("audit", "--lab", "--json", "--out", str(out))
    assert proc.returncode == 1, proc.stderr[-2000:]
    return out


def _copy_run(src: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(src, dest)
    return dest


# -- the audit itself ------------------------------------------------------------------------------


def test_all_unreachable_fleet_is_incomplete_not_expand_capacity(tmp_path: Path) -> None:
    spec = fleet(tmp_path, {"gpu-u01": "h200-unreachable", "gpu-u02": "h200-unreachable"})
    proc = k3fleet("audit", "--lab", "-i", str(spec), "--json", "--out", str(tmp_path / "run"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["outcome"] == "incomplete"
    assert verdict["checks_failed"] is False
    assert verdict["reasons"][0].startswith("no host was measured (2 unreachable")
    assert "fleet.capacity" not in {f["check_id"] for f in verdict["fleet_findings"]}
    plan = k3fleet("plan", "--run", str(tmp_path / "run"))
    assert plan.returncode == 3
    assert "measured no host" in one_line_error(plan)
    no_temp_files(tmp_path)


def test_out_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("keep me")
    proc = k3fleet("audit", "--lab", "--out", str(target))
    assert proc.returncode == 2
    assert "exists and is not a directory" in one_line_error(proc)
    assert target.read_text() == "keep me"


def test_out_in_use_by_another_run(tmp_path: Path, good_audit: Path) -> None:
    proc = k3fleet("audit", "--lab", "--out", str(good_audit))
    assert proc.returncode == 2
    assert "not empty" in one_line_error(proc)


def test_lab_raw_capture_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "smi.txt").write_bytes("Driver Version: 575.57.08 \xb5s\n".encode("latin-1"))
    spec = fleet(tmp_path, {"gpu-a01": {"profile": "h200-r575", "set": {"raw_file": {"nvidia_smi_q": "smi.txt"}}}})
    proc = k3fleet("audit", "--lab", "-i", str(spec), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert "raw_file.nvidia_smi_q" in line and "is not UTF-8 text (byte 0xb5 at offset 26)" in line
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("verdict.json"))


@pytest.mark.parametrize(
    ("hostvars", "expected"),
    [({"k3fleet_lspci": "sometimes"}, "host gpu-01: k3fleet_lspci = 'sometimes': expected a boolean (true/false)"),
     ({"k3fleet_host_timeout": "soon"}, "host gpu-01: k3fleet_host_timeout = 'soon': expected a whole number"),
     # Issue 35: Ansible's own connection variables that cannot work are bad input, not failing hosts.
     ({"ansible_port": "abc"}, "host gpu-01: ansible_port = 'abc': expected a TCP port (1-65535)"),
     ({"ansible_port": 70000}, "host gpu-01: ansible_port = 70000: expected a TCP port (1-65535)"),
     ({"ansible_connection": "nosuchplugin"},
      "host gpu-01: ansible_connection = 'nosuchplugin': expected a connection plugin Ansible has")],
)
def test_host_vars_of_the_wrong_type(tmp_path: Path, hostvars: dict[str, Any], expected: str) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-01": {"ansible_host": "127.0.0.1", **hostvars}}}}))
    proc = k3fleet("audit", "-i", str(inv), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert expected in one_line_error(proc)
    assert not (tmp_path / "run").exists()


def test_full_disk_while_writing_evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC when the verdict is written: exit 3, one line, the old file untouched, no temp file."""
    from k3fleet.cli import main

    disk_full_on(monkeypatch, ".verdict.json.")
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    rc = main(["audit", "--lab", "-q", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 3
    assert f"cannot write {tmp_path / 'run' / 'verdict.json'}: No space left on device" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "verdict.json").exists()
    no_temp_files(tmp_path)


# -- plan and verify on runs that cannot be trusted -----------------------------------------------


def _rewrite(run: Path, rel: str, data: bytes, *, manifest: bool) -> None:
    (run / rel).write_bytes(data)
    if manifest:
        RunDir(run).write_manifest()


@pytest.mark.parametrize(
    ("content", "manifest", "rc", "expected"),
    [
        (b"[1, 2, 3]", True, 2, "holds a JSON list, expected an object"),
        (b'{"outcome": 7, "plan": []}', True, 2, "is not a k3fleet verdict"),
        (b"\x89PNG\r\n\x1a\n\x00\xff", True, 2, "is not UTF-8 text"),
        (b'{"outcome": "go_live"}', False, 3, "does not match its manifest: 1 changed: verdict.json"),
    ],
)
def test_plan_on_bad_verdicts(tmp_path: Path, good_audit: Path, content: bytes, manifest: bool, rc: int,
                              expected: str) -> None:
    run = _copy_run(good_audit, tmp_path / "run")
    _rewrite(run, "verdict.json", content, manifest=manifest)
    proc = k3fleet("plan", "--run", str(run))
    assert proc.returncode == rc
    assert expected in one_line_error(proc)


def test_plan_on_a_change_run_and_a_non_run(tmp_path: Path, good_audit: Path) -> None:
    proc = k3fleet("plan", "--run", str(tmp_path))
    assert proc.returncode == 2 and "not a k3fleet run directory" in one_line_error(proc)
    run = _copy_run(good_audit, tmp_path / "run")
    command = json.loads((run / "command.json").read_text())
    _rewrite(run, "command.json", json.dumps({**command, "kind": "change"}).encode(), manifest=True)
    proc = k3fleet("plan", "--run", str(run))
    assert proc.returncode == 2 and "is a 'change' run, not an audit" in one_line_error(proc)


def test_verify_lists_each_difference(tmp_path: Path, good_audit: Path) -> None:
    assert k3fleet("verify", str(good_audit)).returncode == 0
    run = _copy_run(good_audit, tmp_path / "run")
    (run / "report.md").write_text("edited")
    (run / "facts" / "gpu-a01.json").unlink()
    (run / "notes.txt").write_text("added")
    proc = k3fleet("verify", str(run))
    assert proc.returncode == 3
    assert proc.stdout.splitlines() == ["facts/gpu-a01.json: missing", "report.md: changed",
                                        "notes.txt: not in the manifest"]
    assert "Traceback" not in proc.stderr
    data = json.loads(k3fleet("verify", "--json", str(run)).stdout)
    assert (data["ok"], data["missing"], data["changed"], data["extra"]) == (
        False, ["facts/gpu-a01.json"], ["report.md"], ["notes.txt"])
    proc = k3fleet("verify", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "is not a directory" in one_line_error(proc)


def _slow_audit(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    """An audit whose only host hangs in nvidia-smi: stopped while its play runs."""
    spec = fleet(tmp_path, {"gpu-s01": {"profile": "h200-r575",
                                        "set": {"raw": {"nvidia_smi_q": {"stdout": "", "sleep": 25}}}}},
                 f"{name}.yaml")
    out = tmp_path / name
    proc = subprocess.Popen([K3FLEET, "audit", "--lab", "-i", str(spec), "--out", str(out), "--command-timeout",
                             "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        if "running audit.yml" in line:
            break
        assert time.monotonic() < deadline
    time.sleep(3)  # the play is in its one long task now
    return proc, out


def test_plan_on_an_interrupted_audit(tmp_path: Path, subreaper: None) -> None:
    proc, out = _slow_audit(tmp_path, "interrupted")
    proc.send_signal(signal.SIGINT)
    _stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 3, rest[-2000:]
    assert "Traceback" not in rest
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    plan = k3fleet("plan", "--run", str(out))
    assert plan.returncode == 3
    assert "was interrupted" in one_line_error(plan)
    no_temp_files(tmp_path)


def test_plan_on_a_killed_audit(tmp_path: Path, subreaper: None) -> None:
    proc, out = _slow_audit(tmp_path, "killed")
    proc.kill()
    proc.communicate(timeout=60)
    left = list(Path("/tmp").glob(f"k3fleet-runner-{proc.pid}-*"))
    plan = k3fleet("plan", "--run", str(out))
    assert plan.returncode == 3
    assert "no manifest.json: the run did not finish" in one_line_error(plan)
    verify = k3fleet("verify", str(out))
    assert verify.returncode == 3
    # The killed controller's private data directory is swept by the next play.
    assert left, "the killed controller left no private data directory (the test did not kill a running play)"
    k3fleet("audit", "--lab", "-q", "-i", str(fleet(tmp_path, {"gpu-n01": "h200-r580"}, "next.yaml")),
            "--out", str(tmp_path / "next"))
    assert not any(p.exists() for p in left)
    while True:  # reap what the kill orphaned
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


# -- node text on the terminal -----------------------------------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m"


def test_terminal_escapes_from_nodes_are_stripped(tmp_path: Path) -> None:
    spec = fleet(tmp_path, {
        "gpu-e01": {"profile": "h200-r575", "set": {"gpus": {"model": f"NVIDIA H200{ESCAPES}"}}},
        "gpu-e02": {"profile": "h200-r575",
                    "set": {"slurm": {"state": "drained", "reason": f"bmc {ESCAPES}check"}}},
    })
    proc = k3fleet("audit", "--lab", "-i", str(spec), "--out", str(tmp_path / "run"))
    assert proc.returncode in (1, 3), proc.stderr[-2000:]
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\x1b" not in proc.stderr
    assert "NVIDIA H200" in proc.stdout
    report = (tmp_path / "run" / "report.md").read_text()
    assert "bmc" in report and "\x1b" not in report and "\x07" not in report


def test_progress_strips_escapes_and_markup() -> None:
    from k3fleet.cli.progress import ProgressObserver

    console = Console(record=True, width=300, force_terminal=False)
    obs = ProgressObserver(console, total=1)
    obs.host_done(HostOutcome(host=f"gpu-01{ESCAPES}", status="unreachable",
                              message=f"ssh: [bold]x[/] {ESCAPES}refused"))
    text = console.export_text()
    assert "\x1b" not in text and "\x07" not in text
    assert "[bold]x[/]" in text and "refused" in text
