"""A night others can watch and an operator steers, on the real testbed (docs/change-night.md "Pauses",
"Watching a night", "Validated for the scheduler").

Two guests, canary tb-node03 then one wave (tb-node04), started as an operator starts it, not on a
terminal, with `--pause-after canary` and `--textfile`: the canary is changed, verified, marked validated
in Slurm (its Comment, beside the comment an admin left) and given back; the wave host is not drained
while the night is paused (no snapshot line, its node in service) until `k3fleet upgrade --continue`;
the textfile follows the night (read back with prometheus-client's parser) and ends with both hosts
returned. Then `k3fleet rollback` puts both back on R575 and takes the marker off, the admin's comment kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from nightkit import LAUNCHER, NEW, OLD, loaded, packages, put_on_575, smoke_launch, wait_for
from prometheus_client.parser import text_string_to_metric_families

from k3fleet.change import RollbackOptions, run_rollback
from k3fleet.change.journal import read_journal
from k3fleet.lab import testbed

pytestmark = pytest.mark.system

HOSTS = ["tb-node03", "tb-node04"]
ACCEPT = ["rdma.*", "container.*"]
ADMIN = "rack 7: cable checked"
def _comment(tb: testbed.TestbedState, node: str) -> str:
    out = subprocess.run(["scontrol", "show", "node", node, "--oneliner"], env=testbed.slurm_env(tb),
                         capture_output=True, text=True, check=True).stdout
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_slurm import status_from_scontrol

    return status_from_scontrol(out, node).get("comment") or ""


def _gauges(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "change_id")))] = s.value
    return out


def test_a_paused_night_with_a_textfile_and_a_validated_marker(testbed_state: testbed.TestbedState,
                                                               tmp_path: Path) -> None:
    tb = testbed_state
    data = yaml.safe_load(tb.inventory.read_text())
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    put_on_575(tb, HOSTS)
    before = {h: packages(tb, h) for h in HOSTS}
    nodes = {h: tb.host(h).slurm_node for h in HOSTS}
    subprocess.run(["scontrol", "update", f"nodename={nodes['tb-node03']}", f"comment={ADMIN}"],
                   env=testbed.slurm_env(tb), check=True)
    runs, prom = tmp_path / "runs", tmp_path / "k3fleet.prom"
    out = runs / "night"
    launcher = tmp_path / "k3fleet_cli.py"
    launcher.write_text(LAUNCHER)
    k3fleet = [sys.executable, str(launcher)]
    proc = subprocess.Popen(
        [*k3fleet, "upgrade", "-i", str(inventory), "--change-id", "CHG-WATCH", "--operator", "erin", "--canary",
         "tb-node03", "--waves", "--limit", ",".join(HOSTS), "--out", str(out), "--runs-dir", str(runs),
         "--launch-file", str(smoke_launch(tmp_path)), "--pause-after", "canary", "--pause-timeout", "900",
         "--textfile", str(prom), *[x for a in ACCEPT for x in ("--accept-finding", a)]],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ))
    journal = out / "journal.jsonl"
    try:
        def canary_back() -> bool:
            assert proc.poll() is None, f"the night ended ({proc.returncode}) before its pause"
            return journal.exists() and any(e.host == "tb-node03" and e.stage == "returned"
                                            for e in read_journal(journal).entries)

        wait_for(canary_back, 900, "the canary back in service")
        # The canary is marked validated for Slurm, the admin's comment kept after it.
        assert _comment(tb, nodes["tb-node03"]) == f"k3fleet.io/validated={NEW} (CHG-WATCH) | {ADMIN}"
        # Paused: the wave host is not taken out of service while nobody continues.
        time.sleep(20)
        assert not any(e.host == "tb-node04" for e in read_journal(journal).entries if e.stage == "snapshot")
        assert not testbed.node_state(tb, nodes["tb-node04"]).drained
        g = _gauges(prom)
        assert g[("k3fleet_change_hosts", (("stage", "returned"),))] == 1
        assert g[("k3fleet_change_hosts", (("stage", "not_started"),))] == 1
        assert g[("k3fleet_change_wave", ())] == 0 and g[("k3fleet_change_waves", ())] == 2
        cont = subprocess.run([*k3fleet, "upgrade", "--continue", str(out), "--change-id", "CHG-WATCH", "--operator",
                               "carol", "--runs-dir", str(runs)], capture_output=True, text=True, check=False)
        assert cont.returncode == 0, cont.stderr
        _stdout, stderr = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(60)
    assert proc.returncode == 0, stderr[-3000:]
    assert "paused after the canary tb-node03 returned to service" in stderr
    g = _gauges(prom)
    assert g[("k3fleet_change_hosts", (("stage", "returned"),))] == 2
    assert g[("k3fleet_change_wave", ())] == 1 and g[("k3fleet_change_failure_budget_left", ())] == 0
    for h in HOSTS:
        assert loaded(tb, h) == NEW
    assert _comment(tb, nodes["tb-node04"]).startswith(f"k3fleet.io/validated={NEW} (CHG-WATCH)")

    rolled = run_rollback(RollbackOptions(inventory=inventory, run=out, runs_dir=runs), ["k3fleet", "rollback"])
    assert rolled.exit_code == 0, (rolled.message, rolled.hosts)
    for h in HOSTS:
        assert packages(tb, h) == before[h] and loaded(tb, h) == OLD
    assert _comment(tb, nodes["tb-node03"]) == ADMIN
    assert _comment(tb, nodes["tb-node04"]) == ""
    subprocess.run(["scontrol", "update", f"nodename={nodes['tb-node03']}", "comment="], env=testbed.slurm_env(tb),
                   check=False)
