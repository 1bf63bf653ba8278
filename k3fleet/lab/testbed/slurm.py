"""Real Slurm (Debian slurm-wlm 22.05) on the machine: munged, slurmctld and one slurmd per guest.

All daemons run in the foreground as children of the supervisor (this machine's PID 1 does not reap
orphans). Each testbed host has a Slurm node `nodeNN` served by its own `slurmd -N nodeNN` with its
own Port=, eight fake GPUs as gres (character devices, since gres rejects plain files), and
config + state under the work directory. Clients find it through SLURM_CONF (inventory variable
`k3fleet_slurm_conf`).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.lab.common.proc import run
from k3fleet.lab.testbed.errors import TestbedError
from k3fleet.lab.testbed.state import SlurmState, TestbedState

CLUSTER = "k3tb"
PARTITION = "gpu"
GPUS_PER_NODE = 8
GPU_TYPE = "h200"
MUNGE_USER = "munge"
# The ctld and the nodes need count + 2 free TCP ports; searched from here so a second Slurm on the
# machine (the system one on 6817/6818) is never hit.
PORT_SEARCH_START = 16800
PORT_SEARCH_END = 24000


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_port_block(count: int, start: int = PORT_SEARCH_START, end: int = PORT_SEARCH_END) -> int:
    """First port p such that p .. p+count-1 are all free."""
    base = start
    while base + count <= end:
        busy = next((p for p in range(base, base + count) if not _port_free(p)), None)
        if busy is None:
            return base
        base = busy + 1
    raise TestbedError(f"testbed slurm: no {count} consecutive free TCP ports between {start} and {end}")


def plan_slurm(conf_dir: Path, nodes: list[str]) -> SlurmState:
    base = free_port_block(len(nodes) + 2)
    return SlurmState(
        conf_dir=conf_dir,
        conf=conf_dir / "slurm.conf",
        munge_socket=conf_dir / "munge" / "munge.socket",
        ctld_port=base,
        slurmd_port=base + 1,
        node_ports={node: base + 2 + i for i, node in enumerate(nodes)},
        nodes=list(nodes),
        partition=PARTITION,
    )


def render_slurm_conf(slurm: SlurmState, *, hostname: str, cpus: int) -> str:
    d = slurm.conf_dir
    lines = [
        "# k3fleet testbed: written by k3fleet.lab.testbed.slurm, removed by `testbed down`.",
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={slurm.ctld_port}",
        f"SlurmdPort={slurm.slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={slurm.munge_socket}",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}/%n",
        f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
        # No cgroup.conf: 22.05 has no CgroupPlugin=disabled and this machine has no systemd.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "MpiDefault=none",
        "SwitchType=switch/none",
        # A node that drops out and comes back (ours only stop at teardown) returns to service.
        "ReturnToService=2",
        "GresTypes=gpu",
        "SlurmdTimeout=30",
        "MinJobAge=600",
        # No mail on this machine; the default (/bin/mail) is missing and slurmctld logs an error.
        "MailProg=/bin/true",
        # Jobs take 100 MB per CPU instead of the whole node, so several can share a node.
        "DefMemPerCPU=100",
    ]
    for node in slurm.nodes:
        lines.append(
            f"NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={slurm.node_ports[node]} "
            f"CPUs={cpus} RealMemory=1000 Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE}"
        )
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(slurm.nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_gres_conf(slurm: SlurmState) -> str:
    # Count-only entries make the node INVAL; File= must name character devices.
    lines = ["AutoDetect=off"]
    for node in slurm.nodes:
        devices = slurm.conf_dir / "gres" / node / f"nvidia[0-{GPUS_PER_NODE - 1}]"
        lines.append(f"NodeName={node} Name=gpu Type={GPU_TYPE} File={devices}")
    return "\n".join(lines) + "\n"


def write_slurm_files(slurm: SlurmState) -> None:
    d = slurm.conf_dir
    for sub in ("state", "spool", "log", "run"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for node in slurm.nodes:
        gres = d / "gres" / node
        gres.mkdir(parents=True, exist_ok=True)
        for i in range(GPUS_PER_NODE):
            dev = gres / f"nvidia{i}"
            if not dev.exists():
                # Same numbers as /dev/null: harmless if anything ever opens it.
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
    hostname = socket.gethostname().split(".")[0]
    cpus = max(1, min(2, os.cpu_count() or 1))
    (d / "slurm.conf").write_text(render_slurm_conf(slurm, hostname=hostname, cpus=cpus))
    (d / "gres.conf").write_text(render_gres_conf(slurm))

    munge_dir = slurm.munge_socket.parent
    munge_dir.mkdir(parents=True, exist_ok=True)
    key = munge_dir / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(128))
    try:
        account = pwd.getpwnam(MUNGE_USER)
    except KeyError as exc:
        raise TestbedError(
            f"testbed slurm: user {MUNGE_USER!r} missing; install munge (scripts/testbed-deps.sh)"
        ) from exc
    # munged refuses a key others can read and a socket directory others cannot traverse.
    os.chmod(key, 0o600)
    os.chmod(munge_dir, 0o755)
    for path in (munge_dir, key):
        os.chown(path, account.pw_uid, account.pw_gid)


def service_specs(slurm: SlurmState, tools: dict[str, str]) -> list[dict[str, Any]]:
    """Supervisor entries, in start order: munged, slurmctld, then each slurmd."""
    munge_dir = slurm.munge_socket.parent
    env = {"SLURM_CONF": str(slurm.conf)}
    specs: list[dict[str, Any]] = [
        {
            "name": "munged",
            "kind": "daemon",
            "argv": [
                tools["munged"],
                "-F",
                f"--socket={slurm.munge_socket}",
                f"--key-file={munge_dir / 'munge.key'}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                f"--log-file={munge_dir / 'munged.log'}",
            ],
            "user": MUNGE_USER,
            "env": {},
            "ready_path": str(slurm.munge_socket),
        },
        {
            "name": "slurmctld",
            "kind": "daemon",
            "argv": [tools["slurmctld"], "-D", "-i", "-f", str(slurm.conf)],
            "env": env,
            "ready_path": str(slurm.conf_dir / "run" / "slurmctld.pid"),
        },
    ]
    for node in slurm.nodes:
        specs.append(
            {
                "name": f"slurmd-{node}",
                "kind": "daemon",
                "argv": [tools["slurmd"], "-D", "-N", node, "-f", str(slurm.conf)],
                "env": env,
                "ready_path": None,
            }
        )
    return specs


def slurm_env(state: TestbedState) -> dict[str, str]:
    """Environment for Slurm clients (sbatch, scontrol, sinfo) talking to the testbed's cluster."""
    if state.slurm is None:
        raise TestbedError(f"testbed slurm: no Slurm in the testbed at {state.workdir}")
    env = dict(os.environ)
    env["SLURM_CONF"] = str(state.slurm.conf)
    env["LC_ALL"] = "C"
    return env


def _client(state: TestbedState, argv: list[str], what: str) -> str:
    return run(argv, what=what, env=slurm_env(state), timeout=30).stdout


def sinfo_json(state: TestbedState) -> dict[str, Any]:
    out = _client(state, ["sinfo", "--json"], "testbed slurm: sinfo --json")
    try:
        data = json.loads(out)
    except ValueError as exc:
        raise TestbedError(f"testbed slurm: sinfo --json printed no JSON: {out[:200]!r}") from exc
    if not isinstance(data, dict):
        raise TestbedError(f"testbed slurm: sinfo --json printed {type(data).__name__}, not an object")
    return data


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str
    flags: tuple[str, ...] = field(default_factory=tuple)
    reason: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state.startswith("drain")


def node_status_from_sinfo(data: dict[str, Any], node: str) -> NodeStatus:
    """Pick one node out of `sinfo --json` (22.05: `state` is a word, `state_flags` a list)."""
    for entry in data.get("nodes", []):
        if entry.get("name") != node:
            continue
        state = entry.get("state", "")
        if isinstance(state, list):
            words = [str(s).upper() for s in state]
            base = words[0].lower() if words else "unknown"
            flags = tuple(words[1:]) + tuple(str(f).upper() for f in entry.get("state_flags", []) or [])
        else:
            base = str(state).lower()
            flags = tuple(str(f).upper() for f in entry.get("state_flags", []) or [])
        return NodeStatus(name=node, state=base, flags=flags, reason=str(entry.get("reason", "") or ""))
    known = ", ".join(str(e.get("name")) for e in data.get("nodes", []))
    raise TestbedError(f"testbed slurm: node {node!r} not in sinfo output (nodes: {known or 'none'})")


def node_state(state: TestbedState, node: str) -> NodeStatus:
    """The node's state as Slurm reports it now."""
    return node_status_from_sinfo(sinfo_json(state), node)


def submit_job(state: TestbedState, node: str, seconds: int = 30, *, name: str = "k3tb") -> int:
    """`sbatch --wrap "sleep N" -w node`: a real job holding the node; returns the job id."""
    out = _client(
        state,
        ["sbatch", "--parsable", "-J", name, "-w", node, "-o", "/dev/null", "--wrap", f"sleep {int(seconds)}"],
        f"testbed slurm: sbatch on {node}",
    )
    match = re.match(r"^(\d+)", out.strip())
    if match is None:
        raise TestbedError(f"testbed slurm: sbatch on {node} printed no job id: {out.strip()[:200]!r}")
    return int(match.group(1))


def job_state(state: TestbedState, job_id: int) -> str:
    """JobState of a job (PENDING, RUNNING, COMPLETED, CANCELLED, ...), from `scontrol show job -o`."""
    out = _client(state, ["scontrol", "-o", "show", "job", str(job_id)], f"testbed slurm: job {job_id}")
    match = re.search(r"\bJobState=(\S+)", out)
    if match is None:
        raise TestbedError(f"testbed slurm: job {job_id} has no JobState in {out.strip()[:200]!r}")
    return match.group(1)


def update_node(state: TestbedState, node: str, new_state: str, reason: str | None = None) -> None:
    """`scontrol update nodename=... state=...` (drain needs a reason)."""
    argv = ["scontrol", "update", f"nodename={node}", f"state={new_state}"]
    if reason is not None:
        argv.append(f"reason={reason}")
    _client(state, argv, f"testbed slurm: setting {node} to {new_state}")


def ping(state: TestbedState) -> bool:
    """True once slurmctld answers."""
    proc = run(["scontrol", "ping"], what="testbed slurm: scontrol ping", env=slurm_env(state), check=False, timeout=15)
    return proc.returncode == 0 and "UP" in proc.stdout
