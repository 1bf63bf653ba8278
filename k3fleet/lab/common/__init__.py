"""What the real testbed (k3fleet.lab.testbed) and the SSH lab fleet (k3fleet.lab.sshfleet) share.

Both bring up root-owned pieces from a work directory, run every long-lived process below one
detached supervisor, and must tear everything down again after a crash or a SIGKILL. The parts
that are the same logic in both live here, once:

- ``errors``: LabError, the base of every harness's own error (one line, exit 3);
- ``proc``: commands (C locale, one-line failures), root and tool checks, /proc reading, signals,
  waiting for pids to go;
- ``network``: the per-host namespaces and veth pairs (made and removed with ``ip -batch``), the
  scans by name prefix, the processes inside a namespace;
- ``workdir``: default and resolved work directory, the common part of its layout, the saved state
  (its shared fields and atomic file), the up/down lock;
- ``processes``: the harness side: start the detached supervisor, read its live view, find and
  stop it, find marked processes (and their descendants) and TCP clients of lab addresses;
- ``supervise``: the supervisor side: child subreaper, stop signals, reaping, killing adopted
  orphans, the atomic live view, the shutdown sequence and the entry point that reads SPEC.json;
- ``teardown``: what a ``down`` left behind, named in one line.

What differs (names, address plans, which processes count as ours, the services) stays in each
package and is passed in.
"""
