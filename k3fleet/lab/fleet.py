"""The simulated lab fleet: load a fleet of profiles, generate host roots and an inventory.

Public API (the CLI's ``k3fleet lab generate`` and ``k3fleet audit --lab`` call these):

    load_fleet(path=None) -> FleetSpec
    generate_fleet(spec, dest, *, count=None, image=None, python=sys.executable) -> Path

A generated lab is a directory::

    inventory.yml          group ``lab``: every host over the local connection
    k3fleet-lab.json       what was generated (hosts, profiles, image); marks the directory
    hosts/<name>/          one root per host: etc/ proc/ sys/ bin/ .replay/<tool>/
    .store/<hash>/         the trees behind those roots, shared by every host that has them

Production code runs unchanged against it: the host module reads files under
``k3fleet_root`` and runs commands found only on ``k3fleet_path`` (``<root>/bin``), whose
tools replay recorded output (see k3fleet.lab.replay).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from k3fleet.lab.mpirun import mpirun_script
from k3fleet.lab.profile import FleetSpec, LabHost, LabProfileError, load_fleet_file
from k3fleet.lab.render import HostImage, ProfileRenderer, Recording
from k3fleet.lab.replay import INDEX, REPLAY_DIR, Store, recording_files, replay_index, replay_script
from k3fleet.paths import data_dir
from k3fleet.targets import load_target

__all__ = ["FleetSpec", "LabFleetError", "LabProfileError", "default_image", "generate_fleet", "load_fleet"]



def default_image() -> str:
    """The serving image the lab's recordings are made for: the default target's ``image.ref``
    (the one place the image is named)."""
    return load_target().image.ref
MARKER = "k3fleet-lab.json"
INVENTORY = "inventory.yml"
# What generate_fleet owns inside dest; only these are removed when a lab is regenerated.
_OWNED = (MARKER, INVENTORY, "hosts", ".store")


class LabFleetError(RuntimeError):
    """The lab could not be generated where asked (one line: what, where, why)."""


def load_fleet(path: Path | None = None) -> FleetSpec:
    """Load and validate a fleet; by default the packaged inventories/lab fleet.

    ``path`` is a fleet YAML file or a directory holding ``fleet.yaml``.
    Raises LabProfileError with a one-line message naming the file and field.
    """
    if path is None:
        path = data_dir("inventories/lab") / "fleet.yaml"
    path = Path(path)
    if path.is_dir():
        path = path / "fleet.yaml"
    if not path.is_file():
        raise LabProfileError(f"{path}: lab fleet file not found")
    return load_fleet_file(path)


def expand_hosts(spec: FleetSpec, count: int | None) -> list[tuple[str, LabHost]]:
    """The hosts to generate: the fleet as written, or ``count`` hosts cycling its profiles.

    Cycling keeps the story's proportions (one unreachable host per fleet length, and so
    on) at any scale; scaled hosts are named gpu-0001, gpu-0002, ...
    """
    if count is None:
        return [(host.name, host) for host in spec.hosts]
    if count < 1:
        raise LabFleetError(f"lab fleet size must be at least 1, got {count}")
    width = max(4, len(str(count)))
    return [(f"gpu-{i + 1:0{width}d}", spec.hosts[i % len(spec.hosts)]) for i in range(count)]


def _prepare(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise LabFleetError(f"cannot generate the lab in {dest}: it exists and is not a directory")
    if dest.is_dir():
        entries = {p.name for p in dest.iterdir()}
        if entries and MARKER not in entries:
            raise LabFleetError(f"refusing to generate the lab in {dest}: the directory is not empty and "
                                f"holds no {MARKER} (not a previous lab); choose an empty or new directory")
        for name in _OWNED:
            target = dest / name
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                shutil.rmtree(target)
    dest.mkdir(parents=True, exist_ok=True)


class _Builder:
    """Writes host roots, sharing every identical tree through the store."""

    def __init__(self, dest: Path, image: str) -> None:
        self.dest = dest
        self.image = image
        self.store = Store(dest / ".store")
        self.script = replay_script().encode()
        self.mpirun = mpirun_script().encode()
        self._renderers: dict[int, ProfileRenderer] = {}
        # Per renderer: the host-independent trees and their store paths, computed once.
        self._shared_units: dict[int, dict[str, dict[str, bytes | None]]] = {}
        self._shared_tools: dict[int, dict[str, dict[tuple[str, ...], Recording]]] = {}
        self._shared_tool_files: dict[int, dict[str, dict[str, bytes | None]]] = {}
        self._paths: dict[tuple[int, str], Path] = {}
        self._bins: dict[frozenset[str], Path] = {}

    def renderer(self, host: LabHost) -> ProfileRenderer:
        key = id(host.profile)
        if key not in self._renderers:
            r = ProfileRenderer(host.profile, self.image)
            self._renderers[key] = r
            shared, _own = r.host_image("lab-shared")
            self._shared_units[key] = self._file_units(shared)
            self._shared_tools[key] = self._tool_units(shared)
            self._shared_tool_files[key] = {tool: _tool_files(recs) for tool, recs in self._shared_tools[key].items()}
        return self._renderers[key]

    @staticmethod
    def _file_units(img: HostImage) -> dict[str, dict[str, bytes | None]]:
        units: dict[str, dict[str, bytes | None]] = defaultdict(dict)
        for path, content in img.files.items():
            top, _, rest = path.lstrip("/").partition("/")
            units[top][rest] = None if content is None else content.encode("utf-8")
        return dict(units)

    @staticmethod
    def _tool_units(img: HostImage) -> dict[str, dict[tuple[str, ...], Recording]]:
        return {tool: dict(recs) for tool, recs in img.commands.items()}

    def _shared_path(self, key: int, kind: str, name: str, files: dict[str, bytes | None]) -> Path:
        cache_key = (key, f"{kind}:{name}")
        if cache_key not in self._paths:
            self._paths[cache_key] = self.store.put(files)
        return self._paths[cache_key]

    def write_host(self, name: str, host: LabHost) -> Path:
        r = self.renderer(host)
        key = id(host.profile)
        _shared, own = r.host_image(name)
        root = self.dest / "hosts" / name
        (root / REPLAY_DIR).mkdir(parents=True)

        shared_units = self._shared_units[key]
        own_units = self._file_units(own)
        for top in sorted(set(shared_units) | set(own_units)):
            if top not in own_units:
                target = self._shared_path(key, "files", top, shared_units[top])
            else:
                target = self.store.put({**shared_units.get(top, {}), **own_units[top]})
            self.store.link(target, root / top, 2)

        shared_tools = self._shared_tools[key]
        own_tools = self._tool_units(own)
        tools = frozenset(shared_tools) | frozenset(own_tools)
        for tool in sorted(tools):
            if tool not in own_tools:
                target = self._shared_path(key, "tool", tool, self._shared_tool_files[key][tool])
            else:
                target = self.store.put(_tool_files({**shared_tools.get(tool, {}), **own_tools[tool]}))
            self.store.link(target, root / REPLAY_DIR / tool, 3)
        if tools not in self._bins:
            # Every tool replays its recordings; mpirun is the stand-in that runs a pair (k3fleet.lab.mpirun).
            self._bins[tools] = self.store.put(
                {tool: self.mpirun if tool == "mpirun" else self.script for tool in tools}, executable=True)
        self.store.link(self._bins[tools], root / "bin", 2)
        return root


def _tool_files(recs: dict[tuple[str, ...], Recording]) -> dict[str, bytes | None]:
    """One tool's replay directory: every recording's files and the index over them."""
    per_argv = {argv: recording_files(argv, rec.stdout, rec.stderr, rec.rc, rec.sleep) for argv, rec in recs.items()}
    files: dict[str, bytes | None] = {}
    for recorded in per_argv.values():
        files.update(recorded)
    files[INDEX] = replay_index(per_argv)
    return files


def generate_fleet(spec: FleetSpec, dest: Path, *, count: int | None = None, image: str | None = None,
                   python: str = sys.executable) -> Path:
    """Generate the lab hosts of ``spec`` under ``dest`` and return the inventory file path.

    ``count`` scales the fleet by cycling its profiles (gpu-0001...). ``image`` is the
    serving image the audit will ask about: the hosts' recordings are made for it.
    ``dest`` must be new, empty, or a previous lab (only the lab's own entries are replaced).
    """
    dest = Path(dest).absolute()
    image = image or default_image()
    hosts = expand_hosts(spec, count)
    try:
        _prepare(dest)
        builder = _Builder(dest, image)
        inventory_hosts: dict[str, dict[str, object]] = {}
        manifest_hosts = []
        for name, host in hosts:
            root = builder.write_host(name, host)
            hostvars: dict[str, object] = {
                "ansible_connection": "local",
                "ansible_python_interpreter": python,
                "k3fleet_root": str(root),
                "k3fleet_path": str(root / "bin"),
                "k3fleet_use_nvml": False,
                "k3fleet_image": image,
                # The lab's container runtime is a recording: the CUDA probe costs nothing here.
                "k3fleet_probe": True,
                "k3fleet_lab_profile": host.profile_name,
            }
            if host.profile.slurm is not None:
                # The drain's Slurm client is the host's own replayed scontrol and squeue (run on the
                # controller, as the host itself is): `upgrade --check` reads the simulated scheduler.
                hostvars.update({"k3fleet_slurm_client": "localhost",
                                 "k3fleet_slurm_path": f"{root / 'bin'}:/usr/bin:/bin"})
            else:
                hostvars["k3fleet_scheduler"] = "none"
            if not host.profile.reachable:
                # A closed loopback port: Ansible reports the host unreachable at once, and no
                # traffic can leave the machine.
                hostvars.update({"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1})
            inventory_hosts[name] = hostvars
            manifest_hosts.append({"name": name, "profile": host.profile_name,
                                   "reachable": host.profile.reachable, "root": str(root)})
        inventory = {"all": {"children": {"lab": {"hosts": inventory_hosts}}}}
        inventory_path = dest / INVENTORY
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        with open(inventory_path, "w", encoding="utf-8") as fh:
            fh.write("# Generated by k3fleet lab: simulated hosts; regenerate rather than edit.\n")
            yaml.dump(inventory, fh, Dumper=dumper, sort_keys=False, default_flow_style=False)
        manifest = {"generator": "k3fleet lab", "image": image,
                    "fleet": str(spec.source) if spec.source else None, "count": len(hosts),
                    "hosts": manifest_hosts}
        (dest / MARKER).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise LabFleetError(f"generating the lab in {dest} failed: {exc.strerror or exc}: "
                            f"{exc.filename or ''}".rstrip(": ")) from exc
    return inventory_path
