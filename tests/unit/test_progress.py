"""The audit's progress lines: one counted line per host, whatever tasks follow its module call."""

from __future__ import annotations

from rich.console import Console

from k3fleet.cli.progress import ProgressObserver
from k3fleet.runner import HostOutcome


def test_each_host_is_counted_once_and_a_later_skip_is_not_shown() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    obs = ProgressObserver(console, total=2)
    obs.host_done(HostOutcome(host="gpu-a01", status="ok"))
    obs.host_done(HostOutcome(host="gpu-a02", status="unreachable", message="ssh: connection refused"))
    # The run_once artifact task, skipped on the command line, reports on the first host again.
    obs.host_done(HostOutcome(host="gpu-a01", status="skipped"))
    obs.host_done(HostOutcome(host="gpu-a01", status="failed", message="publish: boom"))
    lines = console.export_text().splitlines()
    assert lines == ["[1/2] ok          gpu-a01", "[2/2] unreachable gpu-a02 ssh: connection refused",
                     "failed      gpu-a01 publish: boom"]
    assert obs.done == 2
