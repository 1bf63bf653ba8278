"""The audit's progress lines: one counted line per host, whatever tasks follow its module call."""

from __future__ import annotations

import re

from rich.console import Console

from k3fleet.audit.runner import HostOutcome
from k3fleet.cli.progress import ProgressObserver


def test_each_host_is_counted_once_and_a_later_skip_is_not_shown() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    obs = ProgressObserver(console, total=2)
    obs.host_done(HostOutcome(host="gpu-a01", status="ok"))
    obs.host_done(HostOutcome(host="gpu-a02", status="unreachable", message="ssh: connection refused"))
    # The run_once artifact task, skipped on the command line, reports on the first host again.
    obs.host_done(HostOutcome(host="gpu-a01", status="skipped"))
    obs.host_done(HostOutcome(host="gpu-a01", status="failed", message="publish: boom"))
    lines = console.export_text().splitlines()
    # "answered" is all a play knows; only a host that did not answer gets a line of its own.
    assert re.fullmatch(r"\[1/2\] answered 1(, ETA \d+:\d\d)?", lines[0]), lines  # the ETA is the clock's
    assert lines[1:] == ["[2/2] unreachable gpu-a02 ssh: connection refused", "[2/2] answered 1, unreachable 1",
                         "failed      gpu-a01 publish: boom"]
    assert obs.done == 2 and obs.failed == 1


def test_a_terminal_gets_a_bar_with_counts_and_the_log_is_bounded() -> None:
    from k3fleet.audit.runner import PlayResult

    console = Console(record=True, width=100, force_terminal=True, color_system=None)
    obs = ProgressObserver(console)
    obs.play_started("audit.yml", 50)
    for i in range(50):
        obs.host_done(HostOutcome(host=f"h{i:02d}", status="unreachable" if i % 2 else "ok", message="refused"))
    obs.play_finished(PlayResult(playbook="audit.yml", status="failed", rc=2, wall_s=3.0, cpu_s=0.1))
    text = console.export_text()
    assert "50/50" in text and "answered 25, unreachable 25" in text
    listed = set(re.findall(r"\[\d+/50\] unreachable (h\d+) refused", text))
    assert len(listed) == 20 and "counted, not listed" in text
    assert "audit.yml: 25 of 50 hosts answered in 3.0s" in text and "failed" not in text.splitlines()[-1]


def test_each_play_counts_its_own_hosts() -> None:
    # audit --active full: the audit's play, then a pair round on the pairs' launching nodes.
    from k3fleet.audit.runner import PlayResult

    console = Console(record=True, width=200, force_terminal=False)
    obs = ProgressObserver(console)
    obs.play_started("audit.yml", 3)
    for host in ("gpu-p01", "gpu-p02", "gpu-p03"):
        obs.host_done(HostOutcome(host=host, status="ok"))
    obs.play_finished(PlayResult(playbook="audit.yml", status="successful", rc=0, wall_s=2.0, cpu_s=0.1))
    obs.play_started("active_pairs.yml", 1)
    # The launching node answered in the audit already: in this play it counts again.
    obs.host_done(HostOutcome(host="gpu-p01", status="ok"))
    obs.play_finished(PlayResult(playbook="active_pairs.yml", status="successful", rc=0, wall_s=9.0, cpu_s=0.1))
    text = console.export_text()
    assert "running active_pairs.yml on 1 hosts" in text
    assert "active_pairs.yml: 1 of 1 hosts answered in 9.0s" in text
    assert (obs.done, obs.failed) == (1, 0)
