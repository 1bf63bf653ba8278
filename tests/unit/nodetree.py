"""Shared unit-test builders: a node's file tree under a root prefix, replaying commands, module exits.

One copy so every collector and module test builds its temporary node the same way.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader

# The node builders live with the collection's own unit tests (one copy; ansible-test units runs those).
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import (  # noqa: F401
    COLLECTION,
    ExitJson,
    FailJson,
    ansible_doc,
    documentation,
    exe,
    fake_command,
    node,
    patch_exits,
    write_tree,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# A library path that cannot exist on any machine (/dev/null is no directory): k3fleet's own NVML
# binding finds no libnvidia-ml.so.1 there, whatever driver the machine running the tests has.
NO_NVML_LIBRARY = "/dev/null/libnvidia-ml.so.1"


def without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node without NVML: "import pynvml" raises ImportError and k3fleet's binding loads no library."""
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_nvml_lib

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(k3fleet_nvml_lib, "LIBRARY", NO_NVML_LIBRARY)


def fixtures(area: str) -> tuple[Path, Callable[[str], str]]:
    """tests/fixtures/<area>, and a reader of one of its files by name."""
    base = FIXTURES / area

    def read(name: str) -> str:
        return (base / name).read_text(encoding="utf-8")

    return base, read


def replay_steps(stdout: Path | str | None, stderr: Path | str | None, rc: int, sleep: float | None) -> list[str]:
    """The shell steps of a command replaying recorded files: wait ``sleep`` s, print them, exit ``rc``."""
    if sleep and not (stdout or stderr):
        # exec: a timed-out command is killed by pid; a child sleep would keep the pipes open.
        return [f"exec /bin/sleep {sleep}"]
    steps = [f"/bin/sleep {sleep}"] if sleep else []
    if stdout:
        steps.append(f"/bin/cat '{stdout}'")
    if stderr:
        steps.append(f"/bin/cat '{stderr}' >&2")
    return [*steps, f"exit {rc}"]


def lab_facts(work: Path, hosts: dict[str, str]) -> dict[str, Any]:
    """Each host's facts as the node module collects them on a lab fleet of ``hosts`` (name -> the lab's
    profile), rendered in ``work``: the real collectors over the lab's files and replayed commands."""
    # lazy: the lab and the facts model load only for the tests that build a lab fleet
    import shutil

    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
    from k3fleet.lab.fleet import default_image, generate_fleet, load_fleet
    from k3fleet.models.facts import HostFacts
    from k3fleet.paths import data_dir

    shutil.copytree(data_dir("inventories/lab") / "profiles", work / "fleet" / "profiles")
    (work / "fleet" / "fleet.yaml").write_text(yaml.safe_dump({"hosts": hosts}), encoding="utf-8")
    generate_fleet(load_fleet(work / "fleet" / "fleet.yaml"), work / "lab")
    out = {}
    for host in hosts:
        base = work / "lab" / "hosts" / host
        raw = collect_host(NodeReader(root=str(base), path=str(base / "bin"), timeout=10), host, default_image(),
                           use_nvml=False, probe=True)
        out[host] = HostFacts.model_validate(raw)
    return out


# -- the lab fleet's first host ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LabHost:
    """One generated lab host: the inventory naming it, its name, and the root its node files are under."""

    inventory: Path
    name: str
    root: Path


def lab_host(dest: Path) -> LabHost:
    """gpu-0001, the lab fleet's first profile (an H200 node on R575, docker, Slurm, a serving image),
    generated under ``dest``."""
    from k3fleet.lab.fleet import generate_fleet, load_fleet

    inventory = generate_fleet(load_fleet(), dest, count=1)
    return LabHost(inventory, "gpu-0001", dest / "hosts" / "gpu-0001")


# -- compiles a child interpreter does ------------------------------------------------------------

def counting_compiles(key: str) -> str:
    """Python source a child interpreter runs first: from then on it counts each compile() in the dict
    ``compiles``, by ``key``, an expression of ``name`` (the compiled file's name); a false key is not
    counted. The tests that hold "each module_util compiles once" read it back."""
    return ("import builtins\n"
            "compiles = {}\n"
            "_real_compile = builtins.compile\n"
            "def _counting(source, filename, *args, **kwargs):\n"
            "    name = str(filename)\n"
            f"    key = {key}\n"
            "    if key:\n"
            "        compiles[key] = compiles.get(key, 0) + 1\n"
            "    return _real_compile(source, filename, *args, **kwargs)\n"
            "builtins.compile = _counting\n")
