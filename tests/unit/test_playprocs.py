"""Every process of a play is found by its token and stopped (docs/safety.md "A play's processes"): one
that made a session of its own (as ansible-core's workers do), one whose environment was cleared (as
sudo's children are: found through its parent), and one that ignores SIGTERM (killed after the grace).
Processes without the token are never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from k3fleet.audit.playprocs import PLAY_ENV, new_token, play_processes, stop_play

# A worker that leaves our session and ignores SIGTERM, and under it a child with an empty environment.
WORKER = """
import os, signal, subprocess, time
os.setsid()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "300"], env={})
time.sleep(300)
"""


def test_stop_play_finds_and_stops_every_process_of_the_play() -> None:
    token = new_token()
    play = subprocess.Popen([sys.executable, "-c", WORKER], env={**os.environ, PLAY_ENV: token})
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, PLAY_ENV: new_token()})
    try:
        deadline = time.monotonic() + 30
        while len(play_processes(token)) < 2:
            assert time.monotonic() < deadline, play_processes(token)
            time.sleep(0.1)
        found = play_processes(token)
        assert play.pid in found and other.pid not in found
        stopped = stop_play(token, grace=1.0)
        assert set(found) <= set(stopped)
        play.wait(10)
        assert play_processes(token) == []
        assert other.poll() is None, "a process of another play was stopped"
        assert stop_play(token) == []
    finally:
        for p in (play, other):
            if p.poll() is None:
                p.kill()
                p.wait(10)
