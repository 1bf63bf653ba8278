"""Ctrl-C, SIGTERM and SIGHUP during a play: the first asks the play to stop (the runner then stops
every process of it, k3fleet.audit.playprocs) and the command writes what it has; the second aborts.

SIGTERM is what ``kill``, a CI job's timeout and systemd send; SIGHUP what a closed SSH session or
terminal sends: each gets what Ctrl-C gets. The event remembers which signal came first, so the
journal can say why a night stopped (docs/change-night.md "Interrupted").
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Cancel(threading.Event):
    """Set by the first stop signal; ``signal_name`` says which (None: not by a signal)."""

    signal_name: str | None = None


def signal_name(cancel: threading.Event | None) -> str | None:
    return getattr(cancel, "signal_name", None) if cancel is not None else None


def cancel_on_signals(on_first: Callable[[], None]) -> Cancel:
    """An event set by the first SIGINT/SIGTERM/SIGHUP (after ``on_first`` says what happens next)."""
    cancel = Cancel()

    def handler(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.signal_name = signal.Signals(signum).name
        cancel.set()
        # After SIGHUP the terminal may be gone: saying so must not stop the stopping.
        with contextlib.suppress(OSError, ValueError):
            on_first()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    return cancel
