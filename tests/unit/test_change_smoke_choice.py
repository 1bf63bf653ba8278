"""The change night's serving smoke as the controller chooses it (k3fleet.change.smoke, docs/change-night.md
"Serving smoke"): `upgrade --smoke/--no-smoke --launch-file`, the launch file's checks, what the play gets
as k3fleet_smoke, the target's two bounds, the --no-smoke warning and the resume's choice. No Ansible: the
play itself is in tests/system/test_change_smoke.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from empty_night import empty_audit, empty_night
from pydantic import ValidationError

from k3fleet.change import UpgradeOptions
from k3fleet.change.night import change_timeouts, extravars, resumed_timeouts
from k3fleet.change.record import ChangeRecord, HostPlan, SmokeChoice
from k3fleet.change.smoke import SKIPPED, check_one_node, describe, resumed_smoke, smoke_choice, smoke_warnings
from k3fleet.contracts import EXIT_USAGE
from k3fleet.errors import UsageError
from k3fleet.evidence import RunDir
from k3fleet.models.findings import StrategyDecision
from k3fleet.models.target import ChangeSpec
from k3fleet.targets import load_target

LAUNCH = """# the recipe's one-node command, as an operator keeps it
VLLM_USE_DEEP_GEMM=1 vllm serve moonshotai/Kimi-K3 \\
    --tensor-parallel-size 8 \\
    --enable-prefix-caching   # cached prefixes
"""


def _opts(tmp_path: Path, **kw: Any) -> UpgradeOptions:
    return UpgradeOptions(inventory=tmp_path / "hosts.yml", change_id="CHG-1", operator="alice", **kw)


def _launch(tmp_path: Path, text: str = LAUNCH, name: str = "launch.sh") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the command line ------------------------------------------------------------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from k3fleet.cli.base import main

    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture
def night(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[UpgradeOptions]:
    """``k3fleet upgrade`` with the flow replaced by one that takes the smoke choice from the options it
    was given as the flow does, records it, and ends as an empty night ends (``finish``)."""
    def derive(opts: UpgradeOptions) -> tuple[dict[str, Any], list[str]]:
        choice = smoke_choice(opts)
        return ({"smoke": choice.model_dump(mode="json"), "timeouts": {"smoke_ready": 1800, "smoke_request": 120}},
                smoke_warnings(choice, opts.check))

    return empty_night(monkeypatch, tmp_path, derive)


BASE = ["upgrade", "-i", "hosts.yml", "--change-id", "CHG-1", "--operator", "alice"]


@pytest.mark.parametrize(("extra", "smoke", "launch"), [
    ([], None, None),
    (["--smoke"], True, None),
    (["--no-smoke"], False, None),
    (["--launch-file", "launch.sh"], None, "launch.sh"),
    (["--smoke", "--launch-file", "launch.sh"], True, "launch.sh"),
])
def test_the_flags_reach_the_flow(tmp_path: Path, night: list[UpgradeOptions], capsys: pytest.CaptureFixture[str],
                                  extra: list[str], smoke: bool | None, launch: str | None) -> None:
    _launch(tmp_path)
    rc, out, err = _cli(BASE + extra, capsys)
    assert rc == 0, err
    assert [(o.smoke, o.launch_file) for o in night] == [(smoke, Path(launch) if launch else None)]
    if smoke is False:
        assert "serving smoke: off (--no-smoke)" in out
    else:
        what = f"launch file {tmp_path / 'launch.sh'}" if launch else "the audit's serve command"
        assert f"serving smoke: on, {what}, ready within 1800s, 120s per request" in out
        assert "warning:" not in err


def test_the_result_line_of_a_night_that_planned_no_host() -> None:
    # No timeouts (nothing planned): the line says the choice without bounds; no choice recorded, no line.
    assert describe({"smoke": {"enabled": True}}) == "serving smoke: on, the audit's serve command"
    assert describe({"change_id": "CHG-1"}) is None


def test_no_smoke_warns_and_is_recorded(tmp_path: Path, night: list[UpgradeOptions],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli([*BASE, "--no-smoke"], capsys)
    assert rc == 0, err
    assert f"warning: {SKIPPED}\n" in err
    run = next((Path("runs")).glob("*/run.json"))
    recorded = json.loads(run.read_text())
    assert recorded["smoke"] == {"enabled": False, "launch_file": None, "launch_file_sha256": None}
    assert recorded["warnings"] == [SKIPPED]


def test_no_warning_in_check_which_never_runs_the_smoke(tmp_path: Path, night: list[UpgradeOptions],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli([*BASE, "--no-smoke", "--check"], capsys)
    assert rc == 0, err
    assert "warning:" not in err


def test_json_carries_the_warning(tmp_path: Path, night: list[UpgradeOptions],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _cli([*BASE, "--no-smoke", "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert doc["warnings"] == [SKIPPED] and doc["change"]["smoke"]["enabled"] is False


@pytest.mark.parametrize(("extra", "says"), [
    (["--launch-file", "{tmp}/missing.sh"], "--launch-file {tmp}/missing.sh does not exist"),
    (["--launch-file", "{tmp}"], "is a directory, not a launch command file"),
    (["--no-smoke", "--launch-file", "{tmp}/launch.sh"], "--launch-file is the serving smoke's command and "
                                                          "--no-smoke skips the smoke: drop one"),
])
def test_a_bad_launch_file_is_one_usage_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch, extra: list[str], says: str) -> None:
    """The real flow: refused before the inventory is read (it does not exist here) and before any run
    directory is made."""
    _launch(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, _, err = _cli(BASE + [a.format(tmp=tmp_path) for a in extra], capsys)
    assert rc == EXIT_USAGE, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert says.format(tmp=tmp_path) in err
    assert not (tmp_path / "runs").exists() or [p.name for p in (tmp_path / "runs").iterdir()] == [".k3fleet"]


# -- the launch file -------------------------------------------------------------------------------


def test_a_launch_file_is_recorded_with_its_path_and_sha256(tmp_path: Path) -> None:
    import hashlib

    path = _launch(tmp_path)
    choice = smoke_choice(_opts(tmp_path, launch_file=Path(os.path.relpath(path))))
    assert choice == SmokeChoice(enabled=True, launch_file=str(path.resolve()),
                                 launch_file_sha256=hashlib.sha256(LAUNCH.encode()).hexdigest())


@pytest.mark.parametrize(("text", "says"), [
    ("docker run --gpus all vllm/vllm-openai:kimi-k3 moonshotai/Kimi-K3\n", "is a `docker run` line"),
    ("HF_TOKEN=x /usr/bin/podman run img\n", "is a `/usr/bin/podman run` line"),
    ("# nothing but a comment\n\n", "holds no command"),
    ("VLLM_X=1\n", "holds no command"),
    ("vllm serve 'moonshotai/Kimi-K3\n", "cannot be read as a shell command (No closing quotation)"),
])
def test_a_launch_file_the_smoke_cannot_run_is_refused(tmp_path: Path, text: str, says: str) -> None:
    path = _launch(tmp_path, text)
    with pytest.raises(UsageError, match=r"^--launch-file .*launch\.sh ") as exc:
        smoke_choice(_opts(tmp_path, launch_file=path))
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_a_binary_or_oversize_launch_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "launch.bin"
    binary.write_bytes(b"vllm serve \x00\x01")
    with pytest.raises(UsageError, match="is binary, not a launch command file"):
        smoke_choice(_opts(tmp_path, launch_file=binary))
    latin = tmp_path / "launch.latin1"
    latin.write_bytes(b"vllm serve caf\xe9\n")
    with pytest.raises(UsageError, match=r"is not UTF-8 text \(byte 14\)"):
        smoke_choice(_opts(tmp_path, launch_file=latin))
    monkeypatch.setenv("K3FLEET_MAX_RECORD_BYTES", "16")
    with pytest.raises(UsageError, match="too large for a launch command file"):
        smoke_choice(_opts(tmp_path, launch_file=_launch(tmp_path)))


# -- what the play gets ----------------------------------------------------------------------------


def _record(smoke: SmokeChoice | None, timeouts: dict[str, int]) -> ChangeRecord:
    plan = HostPlan(target_version="580.95.05", target_branch=580, packages=[])
    return ChangeRecord(change_id="CHG-1", operator="alice", target_version="580.95.05", target_branch=580,
                        canary="gpu-a01", hosts={"gpu-a01": plan}, timeouts=timeouts, image="img", smoke=smoke)


@pytest.fixture
def audit_dir(tmp_path: Path) -> Path:
    return empty_audit(tmp_path)


@pytest.mark.parametrize(("smoke", "expected"), [
    (SmokeChoice(enabled=True), {"ready_timeout": 5400, "request_timeout": 120}),
    (SmokeChoice(enabled=True, launch_file="/srv/launch.sh", launch_file_sha256="0" * 64),
     {"ready_timeout": 5400, "request_timeout": 120, "launch_file": "/srv/launch.sh"}),
    (SmokeChoice(enabled=False), None),
    (None, None),
])
def test_the_play_gets_the_smoke_as_one_extra_var(tmp_path: Path, audit_dir: Path, smoke: SmokeChoice | None,
                                                  expected: dict[str, Any] | None) -> None:
    timeouts = change_timeouts(load_target(None), _opts(tmp_path))
    rd = RunDir.create(tmp_path, "change", ["k3fleet", "upgrade"], out=tmp_path / "night")
    ev = extravars(_record(smoke, timeouts), rd, ["gpu-a01"], [1], audit_dir=audit_dir)
    assert ev["k3fleet_smoke"] == expected
    # The role's other bounds are not the smoke's.
    assert set(ev["k3fleet_timeouts"]) == {"drain", "reboot", "fabricmanager_settle", "command"}


def test_the_bounds_come_from_the_target_and_a_slot_waits_for_a_smoke(tmp_path: Path) -> None:
    target = load_target(None)
    # The ready bound is the measured Kimi K3 load (5,385 s, docs/facts.md section 20) rounded up.
    assert (target.change.smoke_ready_timeout_s, target.change.smoke_request_timeout_s) == (5400, 120)
    on = change_timeouts(target, _opts(tmp_path))
    off = change_timeouts(target, _opts(tmp_path), smoke=False)
    assert (on["smoke_ready"], on["smoke_request"]) == (5400, 120)
    assert on["slot_wait"] - off["slot_wait"] == 5400 + 2 * 120


def test_a_resume_that_turns_the_smoke_on_waits_longer_for_a_slot(tmp_path: Path) -> None:
    target = load_target(None)
    on = change_timeouts(target, _opts(tmp_path))
    off = change_timeouts(target, _opts(tmp_path), smoke=False)
    # The night ran --no-smoke; its resume runs the smoke: each host's change now includes one.
    assert resumed_timeouts(off, target, smoke=True) == on
    assert resumed_timeouts(on, target, smoke=False) == off
    # A night recorded before the smoke existed gets the target's bounds.
    old = {k: v for k, v in off.items() if not k.startswith("smoke_")}
    assert resumed_timeouts(old, target, smoke=True) == on
    # A night that planned no host recorded no timeouts: nothing to wait for.
    assert resumed_timeouts({}, target, smoke=True) == {"smoke_ready": 5400, "smoke_request": 120,
                                                        "rollback_kit": 1200}


def _strategy(name: str) -> StrategyDecision:
    return StrategyDecision(strategy=name, setting="auto", derived=True, reason="from the hosts' GPU memory",
                            rdma_required=name.startswith("multi_node"), tensor_parallel_size=8)


@pytest.mark.parametrize("name", ["multi_node_tp_dp", "multi_node_tp_pp", "multi_node_dep"])
def test_a_strategy_over_nodes_needs_a_one_node_launch_file(tmp_path: Path, name: str) -> None:
    on = SmokeChoice(enabled=True)
    # A real night: refused in one line before any node is touched.
    with pytest.raises(UsageError, match=rf"strategy {name} spans nodes.*--launch-file.*or --no-smoke") as exc:
        check_one_node(on, _strategy(name), check=False)
    assert "\n" not in str(exc.value)
    # --check never runs the smoke: the same reason as a warning.
    (warning,) = check_one_node(on, _strategy(name), check=True)
    assert warning.startswith("the night would be refused: the audit's serving strategy")
    # A launch file, no smoke, or no strategy in the verdict: nothing to say.
    launch = tmp_path / "launch.sh"
    launch.write_text("vllm serve /models/smoke --tensor-parallel-size 8\n")
    assert check_one_node(smoke_choice(_opts(tmp_path, launch_file=launch)), _strategy(name), check=False) == []
    assert check_one_node(SmokeChoice(enabled=False), _strategy(name), check=False) == []
    assert check_one_node(on, None, check=False) == []


def test_a_one_node_strategy_smokes_the_audits_serve_command() -> None:
    assert check_one_node(SmokeChoice(enabled=True), _strategy("single_node_tp"), check=False) == []


@pytest.mark.parametrize("field", ["smoke_ready_timeout_s", "smoke_request_timeout_s"])
@pytest.mark.parametrize("value", [0, -1])
def test_the_target_refuses_a_bound_that_is_not_positive(field: str, value: int) -> None:
    with pytest.raises(ValidationError, match=f"{field}\n  Input should be greater than 0"):
        ChangeSpec(**{field: value})


# -- the resume -------------------------------------------------------------------------------------


def test_a_resume_keeps_the_nights_choice_unless_told(tmp_path: Path) -> None:
    path = _launch(tmp_path)
    started = smoke_choice(_opts(tmp_path, launch_file=path))
    assert resumed_smoke(_opts(tmp_path), started) == started
    assert resumed_smoke(_opts(tmp_path), SmokeChoice(enabled=False)) == SmokeChoice(enabled=False)
    # A night recorded before the choice was ran without the controller's smoke.
    assert resumed_smoke(_opts(tmp_path), None) == SmokeChoice(enabled=False)
    assert resumed_smoke(_opts(tmp_path, smoke=True), None) == SmokeChoice(enabled=True)
    assert resumed_smoke(_opts(tmp_path, smoke=False), started) == SmokeChoice(enabled=False)
    other = _launch(tmp_path, "vllm serve moonshotai/Kimi-K3\n", "other.sh")
    assert resumed_smoke(_opts(tmp_path, launch_file=other), started).launch_file == str(other.resolve())
    assert smoke_warnings(resumed_smoke(_opts(tmp_path, smoke=False), started), check=False) == [SKIPPED]


def test_a_resume_refuses_a_launch_file_changed_since_the_night_started(tmp_path: Path) -> None:
    path = _launch(tmp_path)
    started = smoke_choice(_opts(tmp_path, launch_file=path))
    path.write_text(LAUNCH.replace("8", "4"))
    with pytest.raises(UsageError, match="changed since the night started") as exc:
        resumed_smoke(_opts(tmp_path), started)
    assert f"give --launch-file {path.resolve()} again" in str(exc.value)
    # Given again, it is taken as it is now.
    assert resumed_smoke(_opts(tmp_path, launch_file=path), started).launch_file_sha256 != \
        started.launch_file_sha256
    path.unlink()
    with pytest.raises(UsageError, match="does not exist"):
        resumed_smoke(_opts(tmp_path), started)
