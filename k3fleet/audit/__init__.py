"""The audit (docs/architecture.md "Flows"): read-only, one round trip per host, a verdict and a plan.

Rooms:

- ``inventory``: the inventory read before anything runs (hosts, the k3fleet variables typed
  strictly, hosts that turn host-key checking off).
- ``run``: ``run_audit`` -> playbooks/audit.yml -> validated facts -> verdict -> run directory.
- ``merge``: audit slices (run directories, ansible-runner artifacts, AWX job artifacts) merged
  into one run directory with one verdict over the whole fleet (docs/scale.md).

``k3fleet.audit.runner`` (ansible-runner, its events) is shared by the audit and the change night, so
it stays beside both. This package imports nothing at its top: importing the inventory reader
or the merge does not load the audit flow.
"""
