"""Issue 35, "Exits and leftovers": a refused command exits as documented (bad input 2, a run still being
written 3) with one line, and leaves no run directory behind (docs/safety.md "Exit codes of bad input").

Grouped by command. Each case ran the real CLI in-process (``k3fleet.cli.base.main``); the accept runs
go to a closed loopback port, so nothing waits on a server. The start-up log is
tests/fixtures/decide/startup_kimi_k3_tp8_dp2.log (its source is in that directory's SOURCES.md).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from k3fleet.cli.base import main
from k3fleet.evidence import RunDir

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "decide"
STARTUP_LOG = FIX / "startup_kimi_k3_tp8_dp2.log"


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("k3fleet: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _nothing_under(root: Path) -> None:
    left = [p for p in root.rglob("*")] if root.exists() else []
    assert left == [], left


# -- accept all -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "want"), [
    (["--log", "NOT_A_LOG"], "does not look like a vLLM start-up log"),
    (["--target", "BAD_TARGET"], "not valid YAML"),
    (["--target", "MISSING"], "does not exist"),
    (["--api-key-env", "K3FLEET_TEST_UNSET_KEY_35"], "K3FLEET_TEST_UNSET_KEY_35"),
    (["--load-option", "max_duration_s=Infinity"], "--load-option max_duration_s: Input should be a finite number"),
    (["--load-option", "max_duration_s=1e400"], "--load-option max_duration_s"),
])
def test_accept_all_usage_errors_leave_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              extra: list[str], want: str) -> None:
    (tmp_path / "notalog.txt").write_text("hello world\n")
    (tmp_path / "bad.yaml").write_text("serve: [\n")
    swap = {"NOT_A_LOG": str(tmp_path / "notalog.txt"), "BAD_TARGET": str(tmp_path / "bad.yaml"),
            "MISSING": str(tmp_path / "missing.yaml")}
    runs = tmp_path / "runs"
    rc = main(["accept", "all", "--base-url", _closed_url(), "--model", "m", "--runs-dir", str(runs), "-q",
               *[swap.get(a, a) for a in extra]])
    assert rc == 2
    assert want in _one_line(capsys)
    _nothing_under(runs)


# -- decide -----------------------------------------------------------------------------------------


@pytest.fixture
def accept_run(tmp_path: Path) -> Path:
    """An accept run with the start-up probe (the endpoint is closed: exit 3, the run is kept whole)."""
    out = tmp_path / "acc"
    assert main(["accept", "all", "--base-url", _closed_url(), "--model", "m", "--log", str(STARTUP_LOG),
                 "--skip", "prefix_cache", "--skip", "agent", "--skip", "load", "--out", str(out), "-q"]) == 3
    assert (out / "manifest.json").is_file() and (out / "startup.json").is_file()
    return out


@pytest.mark.parametrize("label", ["bad\nname", "x\x1b[31mred", "[bold]x[/bold]", "-rf", "two words", "nümber",
                                   ".hidden"])
def test_decide_refuses_a_hostile_run_label_before_its_run_exists(
        accept_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str) -> None:
    hostile = tmp_path / "in" / label.replace("/", "%")
    hostile.parent.mkdir()
    accept_run.rename(hostile)
    capsys.readouterr()
    runs = tmp_path / "runs"
    assert main(["decide", "--reviewer", "carol", "--runs-dir", str(runs), str(hostile)]) == 2
    assert "is not a plain directory name" in _one_line(capsys)
    _nothing_under(runs)


def test_decide_refuses_an_out_the_package_cannot_be_named_after(
        accept_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    out = tmp_path / "my decision"
    assert main(["decide", "--reviewer", "carol", "--out", str(out), str(accept_run)]) == 2
    assert "--out 'my decision' is not a plain directory name" in _one_line(capsys)
    assert not out.exists()


def test_a_malformed_startup_json_is_one_line_naming_the_file(
        accept_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((accept_run / "startup.json").read_text())
    data["data"]["vllm_version"] = 5
    data["data"]["tensor_parallel_size"] = {"nested": ["x"]}
    (accept_run / "startup.json").write_text(json.dumps(data))
    (accept_run / "manifest.json").unlink()
    RunDir(accept_run).write_manifest()
    capsys.readouterr()
    for cmd in (["report", str(accept_run), "--format", "md", "--out", str(tmp_path / "r.md")],
                ["decide", "--reviewer", "carol", "--runs-dir", str(tmp_path / "runs"), str(accept_run)]):
        assert main(cmd) == 2
        line = _one_line(capsys)
        assert f"run {accept_run.name}: startup.json: data.vllm_version: Input should be a valid string" in line
    _nothing_under(tmp_path / "runs")
    assert not (tmp_path / "r.md").exists()


# -- merge ------------------------------------------------------------------------------------------


def test_merge_of_a_run_still_being_written_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A claimed audit run with only command.json (its play still running) is incomplete evidence, not a failure."""
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit", "-i", "hosts.yml"], out=tmp_path / "writing")
    (rd.path / "facts").mkdir()
    assert main(["merge", str(rd.path)]) == 3
    assert "the run did not finish" in _one_line(capsys)
