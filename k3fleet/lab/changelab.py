"""The lab's change night: lab hosts whose packages and Slurm client are real enough to plan on.

`k3fleet upgrade --check` on a lab host needs two things the simulated fleet does not have: a
package manager to ask for the transaction and a Slurm client to ask about jobs. Here both come
without root and without touching the machine:

- an **apt sandbox**: a private, real dpkg/apt state (``DPKG_ADMINDIR``, ``APT_CONFIG``) over the
  stand-in driver repository (k3fleet.lab.standin), with the R575 packages installed and held, so
  the real `dpkg-query` and the real apt resolver answer;
- a **Slurm stand-in**: `scontrol` and `squeue` scripts on the host's PATH replaying a recorded
  real Slurm node01 with one running job (changelab_data/SOURCES.md).

The integration tests and `k3fleet lab demo` build their change nights with this module, so the
product and the tests share one implementation (docs/architecture.md "The lab").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from k3fleet.errors import UsageError
from k3fleet.lab.fleet import INVENTORY, MARKER, expand_hosts, generate_fleet, load_fleet
from k3fleet.lab.profile import LabHost
from k3fleet.lab.standin import build_repo, install_pins

DATA = Path(__file__).resolve().parent / "changelab_data"
SCONTROL_NODE01 = DATA / "scontrol_node01_allocated.txt"
# What the stand-in repository and the private apt state are built with (scripts/testbed-deps.sh names
# their Debian packages: gcc, libc6-dev, dpkg-dev, apt-utils, apt, python3-apt).
CHANGE_TOOLS = ("gcc", "dpkg-deb", "dpkg-scanpackages", "apt-ftparchive", "apt-get", "dpkg-query")
DEBIAN_PACKAGES = ("gcc", "libc6-dev", "dpkg-dev", "apt-utils", "python3-apt")
INSTALLED = "575.57.08"  # the R575 release the lab's h200-r575 hosts run
# The play gets a minimal environment (docs/safety.md): the private apt and dpkg state are passed on by name.
PASS_ENV = "APT_CONFIG,DPKG_ADMINDIR"
CANARY = "gpu-a01"  # an R575 host of the lab fleet: the one the night plans for
DONE = "gpu-a03"  # already on R580: the plan leaves it out
_BASE = ("python3", "libc6")
_DROPPED = re.compile(r"^(Filename|Size|MD5sum|SHA1|SHA256|SHA512|Description-md5):")


class ChangeLabError(UsageError):
    """The machine lacks what the lab's change night is built with (exit 2, one line)."""


def missing_tools() -> list[str]:
    """What is missing for the lab's change night: tools on PATH, a system python3 with python3-apt."""
    missing = [t for t in CHANGE_TOOLS if shutil.which(t) is None]
    if not os.path.exists("/usr/bin/python3"):
        missing.append("/usr/bin/python3")
    else:
        # The package module runs on the node's python3, and it imports apt_pkg.
        done = subprocess.run(["/usr/bin/python3", "-c", "import apt_pkg"], capture_output=True, check=False,
                              timeout=60)
        if done.returncode != 0:
            missing.append("python3-apt")
    return missing


def status_file(repo: Path, pins: list[str]) -> str:
    """A dpkg status file: the base system, the simulated hardware and these name=version, held."""
    wanted = dict(p.split("=", 1) for p in pins)
    blocks = [f"Package: {n}\nStatus: install ok installed\nPriority: optional\nArchitecture: amd64\nVersion: 1\n"
              f"Maintainer: base\nDescription: base system" for n in _BASE]
    for raw in (repo / "Packages").read_text().strip().split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", raw, re.M))
        if fields["Package"] == "nvidia-sim-hardware" or wanted.get(fields["Package"]) == fields["Version"]:
            state = "install" if fields["Package"] == "nvidia-sim-hardware" else "hold"
            lines = [x for x in raw.splitlines() if not _DROPPED.match(x)]
            lines.insert(1, f"Status: {state} ok installed")
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def make_apt_sandbox(sb: Path, repo: Path) -> dict[str, str]:
    """A private apt/dpkg state under ``sb`` over ``repo``, R575 installed and held.

    Returns the environment that points apt and dpkg at it (APT_CONFIG, DPKG_ADMINDIR); the play
    gets a minimal environment, so a caller passes these on by name in K3FLEET_PASS_ENV (PASS_ENV).
    """
    for d in ("etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/apt/apt.conf.d", "var/lib/apt/lists/partial",
              "var/cache/apt/archives/partial", "dpkg/info", "dpkg/updates"):
        (sb / d).mkdir(parents=True)
    (sb / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    (sb / "dpkg/status").write_text(status_file(repo, install_pins(INSTALLED)))
    (sb / "dpkg/available").write_text("")
    conf = sb / "apt.conf"
    conf.write_text("\n".join([
        f'Dir::State "{sb}/var/lib/apt";', f'Dir::State::status "{sb}/dpkg/status";',
        f'Dir::Cache "{sb}/var/cache/apt";', f'Dir::Etc "{sb}/etc/apt";',
        f'Dir::Etc::sourcelist "{sb}/etc/apt/sources.list";', f'Dir::Etc::sourceparts "{sb}/etc/apt/sources.list.d";',
        f'Dir::Etc::preferencesparts "{sb}/etc/apt/preferences.d";', f'Dir::Etc::parts "{sb}/etc/apt/apt.conf.d";',
        'APT::Architecture "amd64";', 'Debug::NoLocking "true";', 'APT::Sandbox::User "root";',
        f'DPkg::Options {{ "--admindir={sb}/dpkg"; }};', ""]))
    env = {"APT_CONFIG": str(conf), "DPKG_ADMINDIR": str(sb / "dpkg")}
    update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, check=False,
                            env={**os.environ, **env}, timeout=300)
    if update.returncode != 0:
        last = (update.stderr.strip().splitlines() or ["no message"])[-1]
        raise ChangeLabError(f"apt-get update in the private apt state exited {update.returncode}: {last}")
    return env


def make_slurm_standin(host: dict[str, Any], bindir: Path, calls: Path | None = None) -> None:
    """Lab host vars ``host`` become Slurm node01 (one running job) with a stand-in client in ``bindir``.

    The stand-ins and a real dpkg-query go into ``bindir``, ahead on the host's PATH; the CUDA probe
    is off. Every call is logged to ``calls`` when one is given.
    """
    bindir.mkdir(parents=True)

    def log(name: str) -> str:
        return f'echo "{name} $*" >> {calls}\n' if calls is not None else ""

    (bindir / "scontrol").write_text(f'#!/bin/sh\n{log("scontrol")}cat {SCONTROL_NODE01}\n')
    (bindir / "squeue").write_text(f'#!/bin/sh\n{log("squeue")}echo 1\n')
    for name in ("scontrol", "squeue"):
        (bindir / name).chmod(0o755)
    # Real dpkg-query ahead of the lab host's replayed one: it reads the private dpkg state.
    (bindir / "dpkg-query").symlink_to(shutil.which("dpkg-query") or "/usr/bin/dpkg-query")
    host.update(k3fleet_path=f"{bindir}:{host['k3fleet_path']}", k3fleet_slurm_node="node01",
                k3fleet_slurm_client="localhost", k3fleet_slurm_path=f"{bindir}:/usr/bin:/bin", k3fleet_probe=False)


@dataclass(frozen=True)
class ChangeLab:
    """A lab change night ready for `k3fleet upgrade`: its inventory and the environment to run it in."""

    inventory: Path
    env: dict[str, str]  # APT_CONFIG, DPKG_ADMINDIR and K3FLEET_PASS_ENV
    canary: str = CANARY


def prepare(work: Path, *, calls: Path | None = None) -> ChangeLab:
    """Build the stand-in repository, the apt sandbox, the lab fleet and the Slurm stand-in under ``work``.

    The inventory holds the canary (R575, Slurm node01 with a job, packages in the sandbox) and an
    R580 host the plan leaves out. Raises ChangeLabError naming what the machine lacks.
    """
    missing = missing_tools()
    if missing:
        raise ChangeLabError(f"the lab's change night needs {', '.join(missing)} (Debian packages: "
                             f"{' '.join(DEBIAN_PACKAGES)})")

    env = {**make_apt_sandbox(work / "apt", build_repo(work / "repo")), "K3FLEET_PASS_ENV": PASS_ENV}
    lab_inv = generate_fleet(load_fleet(None), work / "lab")
    lab = yaml.safe_load(lab_inv.read_text())["all"]["children"]["lab"]["hosts"]
    host = dict(lab[CANARY])
    make_slurm_standin(host, work / "bin", calls)
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {CANARY: host, DONE: dict(lab[DONE])}}}))
    return ChangeLab(inventory=inventory, env=env)


# -- the rehearsal: `k3fleet upgrade --check` on the lab by hand (README "Rehearse the night") ------------


def lab_source(path: Path) -> str | None:
    """``"fleet"`` for a lab fleet (a directory holding fleet.yaml, such as inventories/lab, or a fleet
    YAML file), ``"generated"`` for what `k3fleet lab generate` wrote (its directory or its inventory),
    None for anything else (an Ansible inventory of real hosts)."""
    path = Path(path)
    if path.is_dir():
        if (path / MARKER).is_file():
            return "generated"
        return "fleet" if (path / "fleet.yaml").is_file() else None
    if path.name == INVENTORY and (path.parent / MARKER).is_file():
        return "generated"
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None
        if isinstance(data, dict) and "all" not in data and isinstance(data.get("hosts"), dict) and all(
                isinstance(h, dict) and "profile" in h for h in data["hosts"].values()):
            return "fleet"
    return None


def _generated_hosts(directory: Path) -> dict[str, LabHost]:
    """The lab hosts of a generated directory, by name, from its manifest (the fleet and count it was made of)."""
    try:
        manifest = json.loads((directory / MARKER).read_text(encoding="utf-8"))
        fleet = manifest.get("fleet")
        count = manifest.get("count")
        spec = load_fleet(Path(fleet) if fleet else None)
        names = {h["name"] for h in manifest["hosts"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ChangeLabError(f"{directory / MARKER}: not a lab made by `k3fleet lab generate` ({exc})") from exc
    scaled = count if count != len(spec.hosts) else None
    return {name: host for name, host in expand_hosts(spec, scaled) if name in names}


def rehearsal(source: Path, work: Path) -> ChangeLab:
    """A lab fleet (or a generated lab) made plannable by `upgrade --check`, under ``work``.

    Every reachable host whose profile runs the R575 release the stand-in repository installs
    (proprietary modules) answers package questions from one private, real apt/dpkg state (R575
    installed and held): the real `dpkg-query` ahead of its replayed one, apt's resolver over the
    stand-in repository. Its scheduler is its own replayed `scontrol`/`squeue` (lab generate writes
    that). The first such host is the rehearsal's canary. Other hosts keep their recordings: the audit
    reads them, and a wave would say it cannot plan them.
    """
    missing = missing_tools()
    if missing:
        raise ChangeLabError(f"rehearsing the change night on the lab needs {', '.join(missing)} (Debian "
                             f"packages: {' '.join(DEBIAN_PACKAGES)})")
    kind = lab_source(source)
    if kind == "fleet":
        generated = generate_fleet(load_fleet(source), work / "lab").parent
    elif kind == "generated":
        generated = source if source.is_dir() else source.parent
    else:
        raise ChangeLabError(f"{source} is not a lab fleet or a lab made by `k3fleet lab generate`")
    lab_hosts = _generated_hosts(generated)
    inv = yaml.safe_load((generated / INVENTORY).read_text(encoding="utf-8"))
    hosts: dict[str, dict[str, Any]] = inv["all"]["children"]["lab"]["hosts"]
    env = {**make_apt_sandbox(work / "apt", build_repo(work / "repo")), "K3FLEET_PASS_ENV": PASS_ENV}
    bindir = work / "bin"
    bindir.mkdir(parents=True)
    # Real dpkg-query ahead of the lab host's replayed one: it reads the private dpkg state.
    (bindir / "dpkg-query").symlink_to(shutil.which("dpkg-query") or "/usr/bin/dpkg-query")
    sandboxed = []
    for name, hv in hosts.items():
        lab = lab_hosts.get(name)
        drv = lab.profile.driver if lab is not None else None
        if (lab is None or not lab.profile.reachable or drv is None or drv.version != INSTALLED
                or drv.running_flavour != "proprietary"):
            continue
        hv["k3fleet_path"] = f"{bindir}:{hv['k3fleet_path']}"
        hv["k3fleet_probe"] = False
        sandboxed.append(name)
    if not sandboxed:
        raise ChangeLabError(f"{source}: no reachable lab host runs R{INSTALLED} with proprietary modules: "
                             "nothing the rehearsal can plan")
    inventory = work / INVENTORY
    inventory.write_text(yaml.safe_dump({"all": {"children": {"lab": {"hosts": hosts}}}}, sort_keys=False))
    return ChangeLab(inventory=inventory, env=env, canary=sandboxed[0])


@contextlib.contextmanager
def rehearsing(source: Path) -> Iterator[ChangeLab]:
    """``rehearsal`` in a temporary directory, its environment (the private apt state, passed on to the
    play by name) set for as long as the rehearsal runs; both gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="k3fleet-rehearsal-") as tmp:
        lab = rehearsal(Path(source), Path(tmp))
        saved = {k: os.environ.get(k) for k in lab.env}
        os.environ.update(lab.env)
        try:
            yield lab
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
