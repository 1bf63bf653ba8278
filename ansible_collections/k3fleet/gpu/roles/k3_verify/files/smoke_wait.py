# -*- coding: utf-8 -*-
# Run on the node by k3_verify's serving smoke (`python3 -c <this file> RUNTIME NAME URL TIMEOUT POLL`):
# stdlib only, the node's own Python 3 (a file of the role, not a module: Ansible's url helpers are not there).
"""Wait for the smoke's server: GET URL until it answers 200, the container stops, or TIMEOUT seconds.

Prints one JSON object: ``ready`` (bool), ``state`` (the container's status, with its exit code once it
has stopped), ``waited_s``, ``last`` (the last answer or error of URL) and ``timed_out``. Always exits 0:
the role judges the result and says why.
"""

from __future__ import absolute_import, division, print_function

import json
import subprocess
import sys
import time
from urllib.error import HTTPError
from urllib.request import urlopen

__metaclass__ = type

# States a container passes through on its way to running (podman: created, configured, initialized;
# docker: created, restarting): not yet a verdict.
STARTING = ("created", "configured", "initialized", "restarting")
# A process that ended: podman says "stopped" until its cleanup has run, then "exited" (docker:
# "exited", "dead"). One word for the operator, whichever moment inspect caught.
ENDED = ("stopped", "exited")


def container_state(runtime, name):
    """``(alive, description)`` from ``RUNTIME inspect NAME`` (docker, podman and nerdctl alike): alive
    while it runs or is still starting."""
    proc = subprocess.Popen([runtime, "inspect", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return False, "gone (%s)" % (err.decode("utf-8", "replace").strip()[-200:] or "inspect failed")
    try:
        state = json.loads(out.decode("utf-8", "replace"))[0]["State"]
    except (ValueError, IndexError, KeyError, TypeError):
        return False, "unreadable (%s inspect printed no State)" % runtime
    status = str(state.get("Status") or "unknown")
    if status == "running" or status in STARTING:
        return True, status
    if status in ENDED:
        status = "exited"
    return False, "%s (exit code %s)" % (status, state.get("ExitCode"))


def probe(url, timeout):
    """``(ready, what the URL answered)``."""
    try:
        resp = urlopen(url, timeout=timeout)
        try:
            code = resp.getcode()
        finally:
            resp.close()
    except HTTPError as exc:
        return False, "HTTP %d" % exc.code
    except Exception as exc:  # pylint: disable=broad-except
        return False, "%s: %s" % (type(exc).__name__, getattr(exc, "reason", None) or exc)
    return code == 200, "HTTP %d" % code


def wait(runtime, name, url, timeout, poll, clock=time.time, sleep=time.sleep):
    start = clock()
    last = "no answer yet"
    while True:
        running, state = container_state(runtime, name)
        if state == "running":
            ready, last = probe(url, max(1.0, poll))
            if ready:
                return {"ready": True, "state": state, "waited_s": round(clock() - start, 1), "last": last,
                        "timed_out": False}
        waited = clock() - start
        if not running or waited >= timeout:
            return {"ready": False, "state": state, "waited_s": round(waited, 1), "last": last,
                    "timed_out": running}
        sleep(poll)


def main(argv):
    runtime, name, url, timeout, poll = argv[0], argv[1], argv[2], float(argv[3]), float(argv[4])
    print(json.dumps(wait(runtime, name, url, timeout, poll)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
