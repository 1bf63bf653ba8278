"""Secret canaries: distinct values planted in every place a secret can come from, then every
file under every run directory (whatever Ansible or ansible-runner wrote included) and what the
commands printed are searched for each of them (docs/safety.md "Redaction").

Places: the controller's environment (HF_TOKEN, NGC_API_KEY, OPENAI_API_KEY,
AWS_SECRET_ACCESS_KEY, SOME_PASSWORD, ANSIBLE_BECOME_PASS, K3FLEET_API_TOKEN), a command-line
option, a YAML inventory (first key under ``vars:``, a quoted value with spaces, a URL with
user-info), an INI inventory (host line and ``:vars``), ``group_vars/`` and ``host_vars/`` files,
and node output of each kind through lab profiles: a serving process command line with
``--api-key``, an ``x-api-key`` header in a container error, URL user-info in a tool's error, a
password in a Slurm drain reason, a token in /etc/nccl.conf.

Commands: ``audit`` (YAML and INI inventories), ``upgrade --check`` (a good night, and a failing
one whose rescue runs the rollback tasks), ``rollback --check`` of that night; all through the
command line, the package transactions against a private apt state over the stand-in driver
repository (no root). A checked night writes no journal, so the rollback command refuses it
(exit 2) before it writes a run directory: its output is searched; a rollback run directory of
a real night is covered by the system tests' nights (tests/system/test_change_night.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

# The apt sandbox and the Slurm stand-in come from tests/integration/conftest.py.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("change_tools")]

BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")

# One distinct value per place; none is a real credential.
CANARY: dict[str, str] = {
    "env_hf": "hfcanary0001Zq",
    "env_ngc": "ngccanary0002Zq",
    "env_openai": "oaicanary0003Zq",
    "env_aws": "awscanary0004Zq",
    "env_password": "pwcanary0005Zq",
    "env_become": "becomecanary0006Zq",
    "env_k3fleet": "k3fcanary0007Zq",
    "cli_operator": "opcanary0008Zq",
    "yaml_vars_first": "yamlfirst0009Zq",
    "yaml_quoted_spaces": "yamlquoted0010Zq",
    "yaml_url_userinfo": "yamlurl0011Zq",
    "group_vars": "groupvars0012Zq",
    "host_vars": "hostvars0013Zq",
    "ini_host_line": "inihost0014Zq",
    "ini_vars": "inivars0015Zq",
    "node_cmdline_api_key": "cmdlinekey0016Zq",
    "node_x_api_key": "xapikey0017Zq",
    "node_url_userinfo": "nodeurl0018Zq",
    "node_slurm_password": "slurmpw0019Zq",
    "node_nccl_token": "nccltoken0020Zq",
}


def _lab_hosts(tmp: Path) -> dict[str, dict[str, Any]]:
    """Lab hosts whose node output carries the node canaries."""
    from k3fleet.lab.fleet import generate_fleet, load_fleet
    from k3fleet.lab.profile import FleetSpec, LabHost, validate_profile

    base = load_fleet(None)
    r575 = base.host("gpu-a01")
    profile = r575.profile.model_dump(mode="json", exclude_none=True)
    profile["gpus"]["processes"] = [{
        "pid": 4242, "used_mib": 1024,
        "name": f"python3 -m vllm.entrypoints.openai.api_server --api-key {CANARY['node_cmdline_api_key']}"}]
    profile["nccl_conf"] = {"NCCL_IB_HCA": "mlx5_0", "NCCL_PLUGIN_TOKEN": CANARY["node_nccl_token"]}
    profile["slurm"] = {"state": "drained", "reason": f"BMC password {CANARY['node_slurm_password']}"}
    profile["raw"] = {
        "probe": {"stderr": f"docker: Error response from daemon: pull access denied, request had header "
                            f"x-api-key: {CANARY['node_x_api_key']}\n", "rc": 125},
        "dkms_status": {"stderr": f"Error! Could not fetch https://build:{CANARY['node_url_userinfo']}@mirror.invalid"
                                  "/nvidia.tar.gz\n", "rc": 1},
    }
    leaky = validate_profile(profile, "canary profile")
    spec = FleetSpec(hosts=(LabHost("gpu-a01", "h200-r575", r575.profile), LabHost("gpu-c01", "canary", leaky),
                            base.host("gpu-a03")))
    inv = generate_fleet(spec, tmp / "lab")
    hosts: dict[str, dict[str, Any]] = yaml.safe_load(inv.read_text())["all"]["children"]["lab"]["hosts"]
    return hosts


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, apt_sandbox: Callable[[Path, Path], dict[str, str]],
         slurm_standin: Callable[..., None]) -> dict[str, Any]:
    from k3fleet.lab.standin import build_repo

    tmp = tmp_path_factory.mktemp("canary")
    try:
        # A private apt/dpkg state with R575 installed and held, over the stand-in repository.
        apt_env = apt_sandbox(tmp / "apt", build_repo(tmp / "repo"))
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        pytest.skip(f"the stand-in apt repository could not be built here: {exc}")
    hosts = _lab_hosts(tmp)
    slurm_standin(hosts["gpu-a01"], tmp / "bin")

    # YAML inventory: a secret as the first key under vars:, a quoted value with spaces, URL user-info.
    yinv = tmp / "yaml-inv"
    (yinv / "group_vars").mkdir(parents=True)
    (yinv / "host_vars").mkdir()
    vars_block = (f"      ansible_become_pass: {CANARY['yaml_vars_first']}\n"
                  f"      k3fleet_bmc_secret: \"two words {CANARY['yaml_quoted_spaces']}\"\n"
                  f"      proxy_url: https://svc:{CANARY['yaml_url_userinfo']}@proxy.invalid:3128\n")
    (yinv / "hosts.yml").write_text("all:\n  children:\n    lab:\n    " + "  vars:\n" + vars_block
                                    + "      hosts:\n" + "".join(
                                        f"        {h}: {yaml.safe_dump(v, default_flow_style=True).strip()}\n"
                                        for h, v in hosts.items()))
    (yinv / "group_vars" / "lab.yml").write_text(f"---\nvault_api_token: '{CANARY['group_vars']}'\n")
    (yinv / "host_vars" / "gpu-a01.yml").write_text(f"ansible_ssh_pass: {CANARY['host_vars']}\n")

    # INI inventory of the same hosts.
    ini = tmp / "ini-inv" / "hosts"
    ini.parent.mkdir()
    lines = ["[lab]"]
    for h, v in hosts.items():
        extra = f' ansible_password="x {CANARY["ini_host_line"]}"' if h == "gpu-c01" else ""
        lines.append(h + " " + " ".join(f"{k}={v2}" for k, v2 in v.items()) + extra)
    lines += ["", "[lab:vars]", f"some_password = {CANARY['ini_vars']}", ""]
    ini.write_text("\n".join(lines))

    env = {**os.environ, **apt_env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "250",
           "K3FLEET_PASS_ENV": "APT_CONFIG,DPKG_ADMINDIR",
           "HF_TOKEN": CANARY["env_hf"], "NGC_API_KEY": CANARY["env_ngc"], "OPENAI_API_KEY": CANARY["env_openai"],
           "AWS_SECRET_ACCESS_KEY": CANARY["env_aws"], "SOME_PASSWORD": CANARY["env_password"],
           "ANSIBLE_BECOME_PASS": CANARY["env_become"], "K3FLEET_API_TOKEN": CANARY["env_k3fleet"]}
    operator = f"alice token={CANARY['cli_operator']}"
    out = tmp / "runs"
    state = ["--runs-dir", str(tmp / "state")]
    commands = {
        "audit-yaml": ["audit", "-i", str(yinv / "hosts.yml"), "--out", str(out / "audit-yaml")],
        "audit-ini": ["audit", "-i", str(ini), "--json", "--out", str(out / "audit-ini")],
        "check": ["upgrade", "-i", str(yinv / "hosts.yml"), "--change-id", "CHG-C1", "--operator", operator,
                  "--canary", "gpu-a01", "--check", *state, "--out", str(out / "check")],
        # 580.65.06 is not in the stand-in repository: the transaction fails, the rescue rolls back (simulated).
        "check-fail": ["upgrade", "-i", str(yinv / "hosts.yml"), "--change-id", "CHG-C2", "--operator", operator,
                       "--canary", "gpu-a01", "--check", "--target-version", "580.65.06",
                       *state, "--out", str(out / "check-fail")],
        "rollback": ["rollback", "-i", str(yinv / "hosts.yml"), "--check", "--operator", operator,
                     "--run", str(out / "check-fail"), *state, "--out", str(out / "rollback")],
    }
    done = {}
    for name, args in commands.items():
        done[name] = subprocess.run([K3FLEET, *args], capture_output=True, text=True, env=env, timeout=900,
                                    check=False)
    return {"out": out, "done": done}


def test_every_command_ran_and_left_evidence(runs: dict[str, Any]) -> None:
    done = runs["done"]
    for name, proc in done.items():
        assert "Traceback" not in proc.stderr, (name, proc.stderr[-3000:])
    assert done["audit-yaml"].returncode == 1, done["audit-yaml"].stderr[-2000:]
    assert done["audit-ini"].returncode == 1, done["audit-ini"].stderr[-2000:]
    assert done["check"].returncode == 0, done["check"].stderr[-2000:]
    assert done["check-fail"].returncode == 1, done["check-fail"].stderr[-2000:]
    assert done["rollback"].returncode == 2, done["rollback"].stderr[-2000:]
    assert "has no journal.jsonl: nothing was changed in it" in done["rollback"].stderr
    out: Path = runs["out"]
    for name in ("audit-yaml", "audit-ini", "check", "check-fail"):
        assert (out / name / "manifest.json").is_file(), name
    # The canaries did reach the nodes' facts path: the redaction, not their absence, keeps them out.
    facts = (out / "audit-yaml" / "facts" / "gpu-c01.json").read_text()
    assert "NCCL_PLUGIN_TOKEN" in facts and "--api-key ***" in facts and "x-api-key: ***" in facts
    assert "https://build:***@mirror.invalid" in facts
    verdict = (out / "audit-yaml" / "verdict.json").read_text()
    assert "BMC password ***" in verdict
    inputs = (out / "audit-yaml" / "inputs" / "inventory.yml").read_text()
    assert 'ansible_become_pass: "***"' in inputs and "proxy_url: https://svc:***@proxy.invalid" in inputs
    assert "vault_api_token" in (out / "audit-yaml" / "inputs" / "group_vars" / "lab.yml").read_text()
    assert "some_password = ***" in (out / "audit-ini" / "inputs" / "inventory").read_text()


def test_no_canary_anywhere_in_any_run_directory(runs: dict[str, Any]) -> None:
    out: Path = runs["out"]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 40, files
    leaks = []
    for p in files:
        data = p.read_bytes()
        for where, value in CANARY.items():
            if value.encode() in data:
                leaks.append(f"{p.relative_to(out)}: {where}")
    assert leaks == []


def test_no_canary_on_the_terminal(runs: dict[str, Any]) -> None:
    leaks = [f"{name} {stream}: {where}" for name, proc in runs["done"].items()
             for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr))
             for where, value in CANARY.items() if value in text]
    assert leaks == []


def test_private_data_directories_are_gone(runs: dict[str, Any]) -> None:
    import tempfile

    mine = [p for p in Path(tempfile.gettempdir()).glob("k3fleet-runner-*")
            if any(v.encode() in f.read_bytes() for f in p.rglob("*") if f.is_file() for v in CANARY.values())]
    assert mine == []
