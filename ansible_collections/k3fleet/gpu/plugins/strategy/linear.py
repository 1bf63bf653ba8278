# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)

from __future__ import annotations

DOCUMENTATION = r"""
name: linear
short_description: Ansible's linear strategy that sleeps while every fork is busy
description:
  - Runs a play exactly as C(ansible.builtin.linear) does (lockstep per host batch, up to the fork limit
    at a time); it is that plugin with one change in how a task waits for a free fork.
  - When every fork is busy, C(ansible.builtin.linear) polls its worker processes in a loop that sleeps
    0.1 ms per pass over the forks, so the controller's main process stays busy for as long as the
    hosts take. This strategy blocks instead, until one of the workers exits (C(multiprocessing)'s
    process sentinels), then hands the task to Ansible's own queueing, which finds that free fork at
    once.
  - A task with C(throttle) is queued by Ansible's own loop unchanged (the throttle is templated there).
  - The k3fleet audit plays use it (docs/scale.md, "The controller's share").
version_added: "0.1.0"
author:
  - k3fleet contributors
"""

from multiprocessing.connection import wait
from typing import Any

from ansible import constants as C
from ansible.plugins.loader import connection_loader, shell_loader
from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule

# A blocked wait wakes at least this often to look at the task queue manager's state (a run being
# stopped) and at workers that were never started.
WAKE_S = 0.5


class StrategyModule(LinearStrategyModule):
    def __init__(self, tqm: Any) -> None:
        super().__init__(tqm)
        self._preloaded: set[tuple[object, object]] = set()

    def _queue_task(self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any) -> None:
        self._preload_plugins(task_vars, play_context)
        if not task.throttle:
            self._wait_for_free_fork()
        super()._queue_task(host, task, task_vars, play_context)

    def _preload_plugins(self, task_vars: dict[str, Any], play_context: Any) -> None:
        """Load the host's connection and shell plugins here, once, before the worker forks.

        A worker loads its connection plugin and that plugin's shell, and reads each one's
        configuration from its YAML documentation, unless the process it forked from already did:
        in a plain run every host's worker parses the same documentation again (about half of a
        worker's CPU over SSH; docs/scale.md). Loaded here, the forks inherit the result.
        Only a name known before templating is loaded; anything else is left to the worker.
        """
        conn = task_vars.get("ansible_connection") or play_context.connection or C.DEFAULT_TRANSPORT
        if conn == "smart":
            conn = "ssh"
        shell = task_vars.get("ansible_shell_type") or "sh"
        key = (conn, shell)
        if key in self._preloaded:
            return
        self._preloaded.add(key)
        if not all(isinstance(name, str) and "{" not in name for name in key):
            return
        try:
            connection_loader.get(conn, class_only=True)
            shell_loader.get(shell, class_only=True)
        except Exception:  # pylint: disable=broad-except
            # The worker loads it again and reports what is wrong, as it would without this.
            pass

    def _wait_for_free_fork(self) -> None:
        """Return once a fork is free (or the run is ending); block on the workers' exits meanwhile."""
        while not self._tqm._terminated:
            sentinels: list[int] = []
            for worker in self._workers:
                if worker is None:
                    return
                try:
                    if not worker.is_alive():
                        return
                    sentinels.append(worker.sentinel)
                except ValueError:
                    # A closed process object: Ansible's loop replaces it.
                    return
            if not sentinels:
                return
            wait(sentinels, timeout=WAKE_S)
