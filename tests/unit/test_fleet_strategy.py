"""The collection's strategy plugin (k3fleet.gpu.linear) under real ansible-playbook runs.

It is Ansible's linear strategy with two changes in how tasks reach the forks (the plugin's
DOCUMENTATION, docs/scale.md "The controller's share"): each host's connection and shell plugins
are loaded once in the controller before the forks, and a task waits for a free fork by
blocking on the workers' exits. What must hold is that every host still runs every task once, in
lockstep, with more hosts than forks, throttled tasks, failing and unreachable hosts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from k3fleet.audit.runner import FLEET_STRATEGY, ansible_env

BIN = Path(sys.executable).parent

_PLAY = """
- name: Lockstep over more hosts than forks
  hosts: all
  gather_facts: false
  tasks:
    - name: First
      ansible.builtin.command: echo first {{ inventory_hostname }}
      changed_when: false
    - name: Throttled
      ansible.builtin.command: echo throttled {{ inventory_hostname }}
      changed_when: false
      throttle: 1
    - name: Fails on one host
      ansible.builtin.command: "{{ 'false' if inventory_hostname == 'h3' else 'true' }}"
      changed_when: false
    - name: Last
      ansible.builtin.command: echo last {{ inventory_hostname }}
      changed_when: false
"""


def _run(tmp_path: Path, strategy: str | None) -> tuple[int, dict[str, dict[str, str]], str]:
    """(exit status, task -> host -> ok / failed / unreachable, the recap) of one run."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts: dict[str, dict[str, object]] = {f"h{i}": dict(local) for i in range(1, 5)}
    # Nothing listens on port 9 of this address: ssh fails at once, the host is unreachable.
    hosts["gone"] = {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh"}
    (tmp_path / "inv.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    (tmp_path / "play.yml").write_text(_PLAY)
    env = {**os.environ, **ansible_env(host_key_checking=False, persist=False),
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")}
    env.pop("ANSIBLE_STRATEGY", None)
    if strategy:
        env["ANSIBLE_STRATEGY"] = strategy
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.json"), "-f", "2",
                           str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    outcomes: dict[str, dict[str, str]] = {}
    task = None
    for line in done.stdout.splitlines():
        if m := re.match(r"TASK \[(.+)\] \*+$", line):
            task = outcomes.setdefault(m.group(1), {})
        elif task is not None and (m := re.match(r"(ok|fatal): \[([^]]+)\]", line)):
            task[m.group(2)] = ("ok" if m.group(1) == "ok" else "unreachable" if "UNREACHABLE!" in line
                                else "failed")
    recap = done.stdout[done.stdout.find("PLAY RECAP"):]
    assert outcomes, done.stderr[-2000:]
    return done.returncode, outcomes, recap


def test_the_strategy_runs_every_host_like_the_builtin_linear(tmp_path: Path) -> None:
    # 4 hosts on 2 forks: every task waits for a free fork; one is throttled to 1.
    for name in ("ours", "builtin"):
        (tmp_path / name).mkdir()
    rc_ours, outcomes, recap_ours = _run(tmp_path / "ours", FLEET_STRATEGY)
    rc_builtin, builtin, recap_builtin = _run(tmp_path / "builtin", None)
    assert rc_ours == rc_builtin != 0
    assert outcomes == builtin
    assert set(outcomes) == {"First", "Throttled", "Fails on one host", "Last"}
    assert outcomes["First"]["gone"] == "unreachable"
    assert outcomes["Fails on one host"]["h3"] == "failed"
    # The failed host stops; the others run the last task, each once.
    assert sorted(outcomes["Last"]) == ["h1", "h2", "h4"]
    assert set(outcomes["Last"].values()) == {"ok"}
    assert recap_ours == recap_builtin


_PRELOAD = r"""
import json, sys
from types import SimpleNamespace
from ansible import constants as C
from ansible_collections.k3fleet.gpu.plugins.strategy.linear import StrategyModule
fake = SimpleNamespace(_preloaded=set())
before = C.config.has_configuration_definition("connection", "ssh")
StrategyModule._preload_plugins(fake, {"ansible_connection": "ssh"}, SimpleNamespace(connection="smart"))
StrategyModule._preload_plugins(fake, {}, SimpleNamespace(connection="smart"))
# A name only templating would tell is left to the worker.
StrategyModule._preload_plugins(fake, {"ansible_connection": "{{ conn }}"}, SimpleNamespace(connection="smart"))
print(json.dumps({"before": before, "ssh": C.config.has_configuration_definition("connection", "ssh"),
                  "sh": C.config.has_configuration_definition("shell", "sh"),
                  "keys": sorted(map(list, fake._preloaded))}))
"""


def test_the_controller_loads_the_connection_and_shell_plugins_once(tmp_path: Path) -> None:
    env = {**os.environ, **ansible_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _PRELOAD], env=env, capture_output=True, text=True, timeout=120,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] is False
    assert seen["ssh"] is True and seen["sh"] is True
    # smart means ssh: one load for both calls; the templated name is remembered, not loaded.
    assert seen["keys"] == [["ssh", "sh"], ["{{ conn }}", "sh"]]
