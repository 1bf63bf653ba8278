"""Parent of the lab's vLLM server.

Run detached by `up` on SPEC.json. It becomes a child subreaper (vLLM starts an engine-core
process; whatever is orphaned below is reaped here), starts the OpenAI server in its own process
group with its output into the start-up log, writes a live view (pid, running, exit code) for `up`
and `status`, and on SIGTERM/SIGINT stops the server's whole group (SIGTERM, a grace, SIGKILL) and
whatever else is left below it. A server that exits on its own is not restarted: the live view
says how it ended and the supervisor stops too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from k3fleet.lab.common import supervise

MODULE = "k3fleet.lab.vllm.supervisor"
LABEL = "vllm supervisor"
STOP_GRACE = 30.0


class Supervisor(supervise.BaseSupervisor):
    label = LABEL

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.argv = [str(a) for a in spec["argv"]]
        self.env = {str(k): str(v) for k, v in spec["env"].items()}
        self.vllm_log = Path(spec["vllm_log"])
        self.child: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None

    def live_view(self) -> dict[str, Any]:
        return {"vllm": {"pid": self.child.pid if self.child else None,
                         "running": self.child is not None and self.exit_code is None, "exit": self.exit_code}}

    def start_children(self) -> None:
        env = {**os.environ, **self.env}
        # The supervisor's PYTHONPATH points at k3fleet's checkout; the vLLM venv needs nothing from it.
        env.pop("PYTHONPATH", None)
        with open(self.vllm_log, "wb") as log:
            # Its own group: the engine core and its helpers are stopped with it in one signal.
            self.child = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, cwd=self.vllm_log.parent, start_new_session=True, close_fds=True)
        self.log(f"started vLLM (pid {self.child.pid})")
        self.write_live()

    def reap(self) -> None:
        for pid, code in supervise.exited_children():
            if self.child is not None and pid == self.child.pid:
                self.exit_code = code
                self.child.returncode = code
                if not self.stopping:
                    self.log(f"vLLM (pid {pid}) exited with {code}")

    def tick(self) -> None:
        self.reap()
        if self.exit_code is not None and not self.stopping:
            self.write_live()
            self.stopping = True

    def stop_children(self) -> None:
        child = self.child
        if child is not None and self.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            while time.monotonic() < deadline and self.exit_code is None:
                self.reap()
                time.sleep(0.1)
        if child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    return supervise.main(argv, module=MODULE, label=LABEL, run=lambda spec: Supervisor(spec).run())


if __name__ == "__main__":
    sys.exit(main())
