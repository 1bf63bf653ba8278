"""Ctrl-C and SIGTERM during a play: the first asks ansible-runner to stop cleanly, the second aborts."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


def cancel_on_signals(on_first: Callable[[], None]) -> threading.Event:
    """An event set by the first SIGINT/SIGTERM (after ``on_first`` says what happens next)."""
    cancel = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        on_first()
        cancel.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return cancel
