"""Faults injected into a testbed guest at a chosen stage of the change night (README "Rehearse the
night"), so a rehearsal shows the rollback path as well as the success path:

- ``drain``: a Slurm job on the guest's node that outlasts the night's drain timeout (the drain waits
  for it, never cancels it, fails, and gives the node back: nothing changed);
- ``packages``: an apt hook in the guest that fails any dpkg run installing an R580 package (the
  upgrade fails, the rollback's R575 packages still install);
- ``verify``: the guest's serving-smoke server exits at start (the knob the stand-in image reads,
  docs/change-night.md "Serving smoke"): the verification fails and the host is rolled back;
- ``none``: every fault above removed (the fault jobs cancelled).

The resume path needs no fault: stop the night with a signal at any stage (docs/change-night.md
"Interrupted").
"""

from __future__ import annotations

import subprocess

from k3fleet.lab.testbed.errors import TestbedError
from k3fleet.lab.testbed.harness import ssh_run
from k3fleet.lab.testbed.slurm import slurm_env, submit_job
from k3fleet.lab.testbed.state import TestbedState

FAULTS = ("drain", "packages", "verify", "none")
SERVE_KNOB = "/etc/nvidia-sim/serve-fault"
APT_HOOK = "/etc/apt/apt.conf.d/99k3fleet-fault"
# Pre-Install-Pkgs gets the .deb files apt is about to install on stdin, one per line.
_HOOK = ('DPkg::Pre-Install-Pkgs {"/bin/sh -c \'if grep -q _580; then echo k3fleet fault: no R580 >&2; exit 1; '
         'fi\'";};\n')
JOB_NAME = "k3fleet-fault"
JOB_SECONDS = 86400


def inject(state: TestbedState, host: str, fault: str) -> str:
    """Inject ``fault`` on ``host`` (a guest of the testbed); returns one line saying what was done."""
    if fault not in FAULTS:
        raise TestbedError(f"fault {fault!r}: choose one of {', '.join(FAULTS)}")
    guest = state.host(host)
    if fault == "none":
        ssh_run(state, host, f"rm -f {SERVE_KNOB} {APT_HOOK}")
        subprocess.run(["scancel", "--name", JOB_NAME, "--nodelist", guest.slurm_node], env=slurm_env(state),
                       capture_output=True, check=False, timeout=60)
        return f"{host}: no fault (serve knob, apt hook and fault jobs removed)"
    if fault == "drain":
        job = submit_job(state, guest.slurm_node, seconds=JOB_SECONDS, name=JOB_NAME)
        return (f"{host}: Slurm job {job} ({JOB_NAME}) runs on {guest.slurm_node}: a night with a drain timeout "
                "shorter than it fails at the drain (--drain-timeout 30)")
    if fault == "packages":
        ssh_run(state, host, f"cat > {APT_HOOK} <<'EOF'\n{_HOOK}EOF")
        return f"{host}: apt refuses to install R580 packages ({APT_HOOK}): the night fails at its package stage"
    ssh_run(state, host, f"mkdir -p {SERVE_KNOB.rsplit('/', 1)[0]} && echo exit > {SERVE_KNOB}")
    return f"{host}: the serving smoke's server exits at start ({SERVE_KNOB}): the night fails at verify"
