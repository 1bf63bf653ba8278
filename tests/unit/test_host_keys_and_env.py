"""Host-key policy, the play's minimal environment and strict host variables (docs/safety.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3fleet.audit.inventory import as_bool, load_inventory
from k3fleet.audit.runner import (
    PASS_ENV,
    _evidence_dir,
    _outcome,
    _record_host_keys,
    _unchecked_overlay,
    ansible_env,
    host_key_message,
    play_environment,
)
from k3fleet.errors import UsageError
from k3fleet.evidence import RunDir

SSH = Path(__file__).resolve().parents[1] / "fixtures" / "ssh"


def test_changed_key_is_one_line_naming_host_address_file_and_fix() -> None:
    msg = host_key_message("gpu-a03", (SSH / "changed_metalk8s.txt").read_text())
    assert msg is not None and "\n" not in msg
    assert msg.startswith("gpu-a03: host key verification failed")
    assert "10.200.4.136 has CHANGED" in msg
    assert "ssh-keygen -f /home/ballot/.ssh/known_hosts -R 10.200.4.136" in msg
    assert "ssh-keyscan 10.200.4.136 >> /home/ballot/.ssh/known_hosts" in msg


def test_unknown_key_names_the_keyscan_fix() -> None:
    msg = host_key_message("vagrant", (SSH / "unknown_strict.txt").read_text())
    assert msg is not None
    assert "[127.0.0.1]:2222 is not in known_hosts" in msg
    assert "ssh-keyscan [127.0.0.1]:2222 >> ~/.ssh/known_hosts" in msg
    assert "--no-host-key-checking" in msg


def test_plain_verification_failure_and_other_errors() -> None:
    msg = host_key_message("hqs022", (SSH / "failed_plain.txt").read_text())
    assert msg is not None and msg.startswith("hqs022: host key verification failed") and "hqs022 is not" in msg
    assert host_key_message("h", "ssh: connect to host 127.0.0.1 port 1: Connection refused") is None


def test_unreachable_event_carries_the_host_key_message() -> None:
    event = {"event": "runner_on_unreachable", "event_data": {
        "host": "tb-node02", "task": "Read facts",
        "res": {"unreachable": True, "msg": (SSH / "changed_metalk8s.txt").read_text()}}}
    outcome = _outcome(event)
    assert outcome is not None and outcome.status == "unreachable"
    assert outcome.message is not None and outcome.message.startswith("tb-node02: host key verification failed")


def test_ansible_env_checks_host_keys_unless_told_not_to() -> None:
    on = ansible_env()
    assert on["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "StrictHostKeyChecking=yes" in on["ANSIBLE_SSH_ARGS"]
    assert "UserKnownHostsFile" not in on["ANSIBLE_SSH_ARGS"]
    off = ansible_env(host_key_checking=False)
    assert off["ANSIBLE_HOST_KEY_CHECKING"] == "False"
    assert "StrictHostKeyChecking=no" in off["ANSIBLE_SSH_ARGS"]
    assert off["ANSIBLE_SSH_CONTROL_PATH_DIR"] != "~/.ansible/cp"


def test_a_play_that_connects_once_opens_no_master() -> None:
    # The audit: one module call per host, so a ControlPersist master would only cost a process.
    assert "ControlPersist=60s" in ansible_env()["ANSIBLE_SSH_ARGS"]
    for checked in (True, False):
        once = ansible_env(host_key_checking=checked, persist=False)["ANSIBLE_SSH_ARGS"]
        assert "ControlMaster=no" in once and "ControlPersist" not in once
        assert ("StrictHostKeyChecking=yes" if checked else "StrictHostKeyChecking=no") in once


def test_play_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"HF_TOKEN": "hf-1", "NGC_API_KEY": "ngc-1", "OPENAI_API_KEY": "oa-1",
               "AWS_SECRET_ACCESS_KEY": "aws-1", "SOME_PASSWORD": "pw-1", "APT_CONFIG": "/x/apt.conf"}
    for k, v in {**secrets, "HOME": "/root", "ANSIBLE_BECOME_PASS": "bp", "SSH_AUTH_SOCK": "/s"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv(PASS_ENV, raising=False)
    import os

    prepared = {**os.environ, "ANSIBLE_CALLBACK_PLUGINS": "/runner/cb", "ANSIBLE_LIBRARY": "/k3fleet/modules"}
    env = play_environment(prepared, {"ANSIBLE_LIBRARY": "/k3fleet/modules", "PATH": os.environ["PATH"]})
    for name in secrets:
        assert name not in env
    assert env["HOME"] == "/root" and env["SSH_AUTH_SOCK"] == "/s" and env["ANSIBLE_BECOME_PASS"] == "bp"
    assert env["ANSIBLE_CALLBACK_PLUGINS"] == "/runner/cb"
    monkeypatch.setenv(PASS_ENV, "APT_CONFIG, DPKG_ADMINDIR")
    assert play_environment(prepared, {})["APT_CONFIG"] == "/x/apt.conf"


def test_evidence_goes_into_the_nearest_run_dir(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "change", ["k3fleet"])
    nested = RunDir.create(rd.path, "audit", ["k3fleet"], out=rd.path / "audit")
    found = _evidence_dir(rd.path / "ansible-resume-2", "ansible")
    assert found is not None and found[0].path == rd.path and found[1] == "ansible-resume-2"
    found = _evidence_dir(nested.path / "ansible", "ansible")
    assert found is not None and found[0].path == nested.path and found[1] == "ansible"
    found = _evidence_dir(rd, "ansible-3")
    assert found is not None and found == (rd, "ansible-3")
    assert _evidence_dir(None, "ansible") is None


def test_host_key_choice_is_recorded_per_play(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "change", ["k3fleet", "upgrade"])
    _record_host_keys(rd, "ansible", True, {"gpu-02": "k3fleet_host_key_checking: false"})
    _record_host_keys(rd, "ansible-resume-1", False, {})
    policy = json.loads((rd.path / "command.json").read_text())["host_key_checking"]
    assert policy["ansible"] == {"default": "checked",
                                 "unchecked_hosts": {"gpu-02": "k3fleet_host_key_checking: false"}}
    assert policy["ansible-resume-1"]["default"].startswith("unchecked")


def _inventory(tmp_path: Path, text: str, name: str = "hosts.yml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("hostvars", "expected"),
    [
        ("k3fleet_lspci: sometimes", "host gpu-01: k3fleet_lspci = 'sometimes': expected a boolean (true/false)"),
        ("k3fleet_probe: [1]", "host gpu-01: k3fleet_probe = [1]: expected a boolean"),
        ("k3fleet_host_timeout: soon", "k3fleet_host_timeout = 'soon': expected a whole number of seconds above 0"),
        ("k3fleet_command_timeout: -1", "k3fleet_command_timeout = -1: expected a number of seconds above 0"),
        ("k3fleet_env_files: /etc/env", "k3fleet_env_files = '/etc/env': expected a list of strings"),
        ("k3fleet_container_runtime: lxc", "expected one of auto, docker, podman, nerdctl"),
        ("k3fleet_root: 7", "k3fleet_root = 7: expected a string"),
    ],
)
def test_wrong_host_var_types_are_one_line_errors(tmp_path: Path, hostvars: str, expected: str) -> None:
    inv = _inventory(tmp_path, f"all:\n  hosts:\n    gpu-01:\n      {hostvars}\n    gpu-02: {{}}\n")
    with pytest.raises(UsageError) as exc:
        load_inventory(inv)
    assert expected in str(exc.value)
    assert "\n" not in str(exc.value)


def test_host_vars_from_group_vars_and_ini_are_checked(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, "[gpu]\ngpu-01 k3fleet_lspci=yes k3fleet_probe=True\ngpu-02\n", "hosts")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("k3fleet_use_nvml: 'false'\nk3fleet_host_timeout: '120'\n")
    loaded = load_inventory(inv)
    assert loaded.hosts == ["gpu-01", "gpu-02"]
    assert loaded.host_vars["gpu-02"]["k3fleet_use_nvml"] == "false"
    # Ansible caches which vars files a directory has per process: a second inventory next door.
    other = tmp_path / "other"
    (other / "host_vars").mkdir(parents=True)
    (other / "host_vars" / "gpu-02.yml").write_text("k3fleet_lspci: sometimes\n")
    with pytest.raises(UsageError, match="host gpu-02: k3fleet_lspci = 'sometimes'"):
        load_inventory(_inventory(other, "[gpu]\ngpu-01\ngpu-02\n", "hosts"))


def test_templates_are_left_to_ansible(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, "all:\n  hosts:\n    gpu-01:\n      k3fleet_probe: \"{{ probe_on | default(true) }}\"\n")
    assert load_inventory(inv).hosts == ["gpu-01"]


def test_inventory_opt_outs_are_found(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, "all:\n  hosts:\n    gpu-01: {k3fleet_host_key_checking: false}\n"
                               "    gpu-02: {ansible_ssh_host_key_checking: 'no'}\n"
                               "    gpu-03: {ansible_ssh_args: '-o StrictHostKeyChecking=no'}\n"
                               "    gpu-04: {k3fleet_host_key_checking: true}\n")
    outs = load_inventory(inv).host_key_opt_outs
    assert set(outs) == {"gpu-01", "gpu-02", "gpu-03"}
    assert outs["gpu-01"] == "k3fleet_host_key_checking: false"
    overlay = json.loads(_unchecked_overlay(tmp_path, outs).read_text())
    assert set(overlay["all"]["hosts"]) == {"gpu-01", "gpu-02", "gpu-03"}
    assert "StrictHostKeyChecking=no" in overlay["all"]["hosts"]["gpu-01"]["ansible_ssh_args"]


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("yes", True), ("Off", False), (0, False),
                                                  ("sometimes", None), (2, None), (None, None)])
def test_as_bool(value: object, expected: bool | None) -> None:
    assert as_bool(value) is expected
