"""The audit over AWX's own execution path: `ansible-runner transmit | worker | process`.

An AWX execution node runs a job through ansible-runner's streaming protocol
(https://docs.ansible.com/projects/runner/en/2.4.0/remote_jobs/, Receptor carries the stream): on
the controller `transmit` packs the job's private data directory (project, inventory, env) and its
arguments into one stream; on the execution node `worker` unpacks it into a directory of its own,
runs ansible-playbook and streams back the job events and the artifact directory; on the
controller again `process` unpacks them into ``<private data dir>/artifacts/<ident>/``.

Here the three stages are three processes joined by OS pipes, and the lab fleet is split over two
such pipelines at once by `--limit` (a sliced job, one slice per execution node). `k3fleet merge`
over the two processed artifact directories must give the verdict of one `k3fleet audit` of the
whole fleet: the same hosts, statuses, findings and exit code.

The job is built the way AWX builds one: the project (the playbooks and the target file the play
reads the serving image from) and the inventory travel inside the stream, with no CLI image in
it; the Ansible paths in env/envvars come from k3fleet (`runner.ansible_env`), and the worker
runs with the play's minimal environment (`runner.play_environment`). The worker unpacks into
its own directory and deletes it afterwards (`--delete`), so nothing it needs can come from the
controller's directory by accident. scripts/bench_awx_stream.py times the same pipelines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from k3fleet.audit.runner import ansible_env, play_environment, playbook_path
from k3fleet.targets import default_target_path

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")
RUNNER = str(BIN / "ansible-runner")
PLAYBOOK = "audit.yml"
# Fields that differ between two audits of the same hosts without meaning anything.
_VOLATILE = {"collected_at", "duration_s", "generated_at", "wall_s"}
# ansible-playbook's exit codes when the play ran: 2 a host failed, 4 a host was unreachable.
PLAY_RAN = (0, 2, 4)


# Set in the controller's environment only: it must reach no execution node and no artifact.
CANARY = "K3FLEET_STREAM_CANARY_TOKEN"
CANARY_VALUE = "stream-canary-7f3c91"


def controller_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200",
            CANARY: CANARY_VALUE}


def node_env() -> dict[str, str]:
    """An execution node's environment: what k3fleet lets a play inherit, nothing of this shell's."""
    env = play_environment(os.environ, {})
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return env


def k3fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([K3FLEET, *args], capture_output=True, text=True, env=controller_env(), timeout=600,
                          check=False)


def stable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: stable(v) for k, v in obj.items() if k not in _VOLATILE}
    if isinstance(obj, list):
        return [stable(v) for v in obj]
    return obj


def lab_hosts(inventory: Path) -> list[str]:
    return list(yaml.safe_load(inventory.read_text())["all"]["children"]["lab"]["hosts"])


def slices(hosts: Sequence[str], n: int) -> list[list[str]]:
    """``hosts`` in ``n`` contiguous parts (halves for two), as `--limit` slices."""
    size, extra = divmod(len(hosts), n)
    parts, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        parts.append(list(hosts[start:end]))
        start = end
    return [p for p in parts if p]


def _project_files() -> list[Path]:
    """What of the project (this repository, as AWX checks it out) the audit play reads."""
    return [playbook_path(PLAYBOOK).parent, default_target_path()]


def private_data_dir(dest: Path, inventory: Path) -> Path:
    """A job's private data directory as AWX writes it before `transmit`: project/, inventory/, env/."""
    project = dest / "project"
    for src in _project_files():
        to = project / src.relative_to(REPO)
        to.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, to)
        else:
            shutil.copy2(src, to)
    data = yaml.safe_load(inventory.read_text())
    # An AWX inventory does not carry the CLI's image: the play reads it from the target file.
    for hostvars in data["all"]["children"]["lab"]["hosts"].values():
        hostvars.pop("k3fleet_image", None)
    (dest / "inventory").mkdir(parents=True)
    (dest / "inventory" / "hosts.yml").write_text(yaml.safe_dump(data))
    (dest / "env").mkdir()
    (dest / "env" / "envvars").write_text(yaml.safe_dump(ansible_env()))
    return dest


@dataclass
class Pipeline:
    """One slice's `transmit | worker | process`, running."""

    ident: str
    controller_dir: Path
    worker_dir: Path
    procs: list[subprocess.Popen[bytes]]
    errs: Sequence[IO[bytes]]

    @property
    def job(self) -> Path:
        return self.controller_dir / "artifacts" / self.ident

    def wait(self, timeout: float = 600) -> list[int]:
        rcs = [p.wait(timeout=timeout) for p in self.procs]
        for f in self.errs:
            f.close()
        return rcs

    def stderr(self) -> str:
        return "\n".join(f"{Path(f.name).name}: {Path(f.name).read_text(errors='replace')[-1500:]}" for f in self.errs)


def start_pipeline(base: Path, inventory: Path, ident: str, limit: Sequence[str], forks: int = 20) -> Pipeline:
    """Start ``transmit | worker | process`` for one slice: three processes, two OS pipes."""
    pdd = private_data_dir(base / f"{ident}-controller", inventory)
    wdir = base / f"{ident}-node"
    errs = [(base / f"{ident}-{stage}.err").open("wb") for stage in ("transmit", "worker", "process")]
    playbook = str(playbook_path(PLAYBOOK).relative_to(REPO))
    transmit = subprocess.Popen(
        [RUNNER, "transmit", str(pdd), "-p", playbook, "--limit", ",".join(limit), "--forks", str(forks),
         "--ident", ident], stdout=subprocess.PIPE, stderr=errs[0], env=controller_env())
    assert transmit.stdout is not None
    worker = subprocess.Popen([RUNNER, "worker", "--private-data-dir", str(wdir), "--delete"],
                              stdin=transmit.stdout, stdout=subprocess.PIPE, stderr=errs[1], env=node_env())
    transmit.stdout.close()  # the worker holds the read end now: transmit sees a closed pipe if it dies
    assert worker.stdout is not None
    process = subprocess.Popen([RUNNER, "process", str(pdd), "--ident", ident],
                               stdin=worker.stdout, stdout=subprocess.DEVNULL, stderr=errs[2], env=controller_env())
    worker.stdout.close()
    return Pipeline(ident, pdd, wdir, [transmit, worker, process], errs)


def stream_slices(base: Path, inventory: Path, parts: Sequence[Sequence[str]],
                  forks: int = 20) -> list[tuple[Pipeline, list[int]]]:
    """Every slice's pipeline at once, as a sliced job runs on several execution nodes; waits for
    all and returns each with its stages' exit codes (transmit, worker, process)."""
    pipes = [start_pipeline(base, inventory, f"slice{i}", part, forks) for i, part in enumerate(parts)]
    return [(pipe, pipe.wait()) for pipe in pipes]


def ran(rcs: Sequence[int]) -> bool:
    """Whether a pipeline ran the play to its end (failed or unreachable hosts are part of an audit)."""
    return rcs[0] == 0 and rcs[1] in PLAY_RAN and rcs[2] in PLAY_RAN


def stats_event(job: Path) -> dict[str, Any]:
    for p in (job / "job_events").glob("*.json"):
        event = json.loads(p.read_text())
        if event.get("event") == "playbook_on_stats":
            return event
    raise AssertionError(f"no playbook_on_stats event in {job}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("awx-stream")
    gen = k3fleet("lab", "generate", str(base / "lab"))
    assert gen.returncode == 0, gen.stderr
    inventory = Path(gen.stdout.strip())
    whole = k3fleet("audit", "-i", str(inventory), "--json", "--out", str(base / "whole"), "-q")
    assert whole.stdout, whole.stderr[-2000:]
    return {"base": base, "inventory": inventory, "hosts": lab_hosts(inventory), "whole": json.loads(whole.stdout),
            "whole_rc": whole.returncode}


@pytest.fixture(scope="module")
def streamed(lab: dict[str, Any]) -> list[tuple[Pipeline, list[int]]]:
    done = stream_slices(lab["base"], lab["inventory"], slices(lab["hosts"], 2))
    for pipe, rcs in done:
        assert ran(rcs), (rcs, pipe.stderr())
    return done


def test_each_worker_ran_its_slice_from_the_stream(lab: dict[str, Any],
                                                   streamed: list[tuple[Pipeline, list[int]]]) -> None:
    unreachable = {h for h, v in lab["whole"]["hosts"].items() if v["status"] == "unreachable"}
    assert unreachable, "the lab fleet has an unreachable host: its slice must report it"
    for (pipe, rcs), part in zip(streamed, slices(lab["hosts"], 2), strict=True):
        artifact = stats_event(pipe.job)["event_data"]["artifact_data"]["k3fleet_audit"]
        assert set(artifact["hosts"]) == set(part)
        assert set(artifact["facts"]) == set(part) - unreachable
        # The job's end came back through the stream: ansible-playbook's code is the worker's.
        assert int((pipe.job / "rc").read_text()) == rcs[1]
        assert (pipe.job / "status").read_text() == ("failed" if set(part) & unreachable else "successful")
        # ansible-playbook ran in the worker's own directory, on the inventory and project that came
        # through the stream, and the worker removed that directory when it finished.
        command = json.loads((pipe.job / "command").read_text())
        inventory = command["command"][command["command"].index("-i") + 1]
        assert Path(inventory).is_relative_to(pipe.worker_dir), command["command"]
        assert Path(command["cwd"]).is_relative_to(pipe.worker_dir), command["cwd"]
        assert not pipe.worker_dir.exists()
        # The controller's environment stays on the controller: the stream carries the private data
        # directory and the job's arguments, never the environment transmit ran in.
        assert CANARY not in command["env"]
        for f in pipe.job.rglob("*"):
            assert not f.is_file() or CANARY_VALUE.encode() not in f.read_bytes(), f


def test_two_streamed_slices_merge_to_a_single_runs_verdict(lab: dict[str, Any],
                                                            streamed: list[tuple[Pipeline, list[int]]]) -> None:
    out = lab["base"] / "merged"
    proc = k3fleet("merge", *(str(pipe.job) for pipe, _ in streamed), "--json", "--out", str(out))
    assert proc.returncode == lab["whole_rc"], proc.stderr
    merged = json.loads(proc.stdout)
    assert set(merged["hosts"]) == set(lab["hosts"])
    assert {h: v["status"] for h, v in merged["hosts"].items()} == {
        h: v["status"] for h, v in lab["whole"]["hosts"].items()}
    assert stable(merged) == stable(lab["whole"])
    sources = json.loads((out / "inputs" / "sources.json").read_text())
    assert [s["kind"] for s in sources] == ["runner", "runner"]
